-- The runs recorded from Kubernetes (a FunctionJob's run, a cron firing), by their Job's uid: each API process sees
-- a finished run in its watch and stores its invocation record, and the first to claim the key in the record's own
-- transaction is the one that does (sless_core.runrecord), so any number of replicas record each run once.
CREATE TABLE run_records (run_key TEXT PRIMARY KEY);
