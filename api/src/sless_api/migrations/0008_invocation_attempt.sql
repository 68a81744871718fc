-- Which attempt at the same work a record is: an event's delivery (counted across redeliveries and restarts by the
-- deduplication store) or an asynchronous call's try. Nullable: plain calls, and records written before it, have none.
ALTER TABLE invocations ADD COLUMN attempt INTEGER;
