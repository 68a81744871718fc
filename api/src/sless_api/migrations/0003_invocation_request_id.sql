-- The call's request id (X-Request-Id), so a record joins the access log and the function's output.
ALTER TABLE invocations ADD COLUMN request_id TEXT;
