-- The function's version that answered the call (a traffic split shares calls between two).
-- Nullable: records written before it existed, and calls that never reached a version, have none.
ALTER TABLE invocations ADD COLUMN version INTEGER;
