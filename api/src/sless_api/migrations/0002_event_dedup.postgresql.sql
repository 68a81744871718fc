-- The event dispatcher's idempotency store (sless_api/services/events/pgdedup.py): where the handling of
-- each message id stands, so a redelivery never runs a function twice within the retention window.
-- Shared by every sless-events replica; a claim is settled by the primary key (INSERT ... ON
-- CONFLICT) and a row lock (SELECT ... FOR UPDATE).
CREATE TABLE event_deliveries (
    queue       TEXT             NOT NULL,
    message_key TEXT             NOT NULL,
    state       TEXT             NOT NULL CHECK (state IN ('running', 'failed', 'dlq', 'done', 'dead')),
    attempts    INTEGER          NOT NULL DEFAULT 0,
    -- the claiming process (host:pid:start) and its lease, seconds since the epoch on its clock
    owner       TEXT             NOT NULL DEFAULT '',
    lease_until DOUBLE PRECISION NOT NULL DEFAULT 0,
    reason      TEXT             NOT NULL DEFAULT '',
    -- the database's clock; the retention window counts from here
    updated_at  TIMESTAMPTZ      NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, message_key)
);

-- The purge deletes by age.
CREATE INDEX event_deliveries_updated ON event_deliveries (updated_at);
