-- When the platform first took each message (seconds since the epoch, the database's clock): a dead letter says
-- when it was first and last seen. Nullable: rows written before it have none.
ALTER TABLE event_deliveries ADD COLUMN first_seen DOUBLE PRECISION;
