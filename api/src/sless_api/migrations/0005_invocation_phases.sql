-- Cold or warm, and where the time went (ms): waiting in the platform, for a process to start, in the handler.
-- All nullable: records written before these existed, and calls that never reached a function, have none.
ALTER TABLE invocations ADD COLUMN cold BOOLEAN;
ALTER TABLE invocations ADD COLUMN queue_ms DOUBLE PRECISION;
ALTER TABLE invocations ADD COLUMN start_ms DOUBLE PRECISION;
ALTER TABLE invocations ADD COLUMN handler_ms DOUBLE PRECISION;
