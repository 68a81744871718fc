-- Asynchronous calls (sless_api/asynccalls): accepted with 202, run later with retries; times are epoch seconds.
CREATE TABLE async_calls (
    id               TEXT    PRIMARY KEY,
    namespace        TEXT    NOT NULL,
    function         TEXT    NOT NULL,
    method           TEXT    NOT NULL,
    path             TEXT    NOT NULL,
    headers          TEXT    NOT NULL,
    body             BLOB    NOT NULL,
    request_id       TEXT    NOT NULL,
    created_at       REAL    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('queued', 'running', 'succeeded', 'dead')),
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  REAL    NOT NULL,
    lease_owner      TEXT    NOT NULL DEFAULT '',
    lease_until      REAL    NOT NULL DEFAULT 0,
    result_status    INTEGER,
    result_headers   TEXT    NOT NULL DEFAULT '[]',
    result_body      BLOB    NOT NULL DEFAULT x'',
    result_truncated INTEGER NOT NULL DEFAULT 0,
    error            TEXT,
    finished_at      REAL
);

CREATE INDEX async_calls_due ON async_calls (state, next_attempt_at);
CREATE INDEX async_calls_listed ON async_calls (namespace, created_at DESC, id DESC);
