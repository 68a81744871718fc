-- Invocation records written by the invoke proxy, newest read first per function.
CREATE TABLE invocations (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace      TEXT             NOT NULL,
    function       TEXT             NOT NULL,
    method         TEXT             NOT NULL,
    path           TEXT             NOT NULL DEFAULT '',
    status         INTEGER          NOT NULL,
    duration_ms    DOUBLE PRECISION NOT NULL,
    request_bytes  BIGINT           NOT NULL DEFAULT 0,
    response_bytes BIGINT           NOT NULL DEFAULT 0,
    trigger        TEXT             NOT NULL DEFAULT 'http',
    error          TEXT,
    started_at     TIMESTAMPTZ      NOT NULL
);

-- Keyset paging: WHERE namespace = $1 AND function = $2 AND id < $3 ORDER BY id DESC.
CREATE INDEX invocations_by_function ON invocations (namespace, function, id DESC);
-- Retention sweeps delete by age.
CREATE INDEX invocations_by_started_at ON invocations (started_at);
