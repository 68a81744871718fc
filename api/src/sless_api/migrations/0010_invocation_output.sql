-- What a call wrote before its answer (the runtime's X-Sless-Output, checked): JSON text, at most 16 KiB of lines.
-- Kept with the record, so a call's output outlives the process or pod that served it. Nullable: most calls print
-- nothing, and records written before it have none.
ALTER TABLE invocations ADD COLUMN output TEXT;
