-- Invocation records written by the invoke proxy, newest read first per function.
-- started_at is seconds since the epoch (REAL); AUTOINCREMENT keeps ids from being reused.
CREATE TABLE invocations (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace      TEXT    NOT NULL,
    function       TEXT    NOT NULL,
    method         TEXT    NOT NULL,
    path           TEXT    NOT NULL DEFAULT '',
    status         INTEGER NOT NULL,
    duration_ms    REAL    NOT NULL,
    request_bytes  INTEGER NOT NULL DEFAULT 0,
    response_bytes INTEGER NOT NULL DEFAULT 0,
    "trigger"      TEXT    NOT NULL DEFAULT 'http',
    error          TEXT,
    started_at     REAL    NOT NULL
);

CREATE INDEX invocations_by_function ON invocations (namespace, function, id DESC);
CREATE INDEX invocations_by_started_at ON invocations (started_at);
