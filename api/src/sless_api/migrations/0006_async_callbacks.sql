-- Where an asynchronous call's outcome is POSTed when it ends, and how that delivery went
-- (NULL: no callback; 'pending' until it was tried; then 'delivered: ...' or 'failed: ...').
ALTER TABLE async_calls ADD COLUMN callback_url TEXT;
ALTER TABLE async_calls ADD COLUMN callback_state TEXT;
