"""The invoke path: a call to ``/fn/...`` from its HTTP request to a function's process and back (headers,
upstream client, replies to slow clients, WebSockets, admission, access log)."""
