"""Asynchronous invocation: a call accepted now (202), run later with retries, its result kept for the caller.

``model`` is one call and its states, ``store`` keeps them durably (SQLite for `sless up`, PostgreSQL shared by
API replicas), ``runner`` claims due calls and runs them through the same invoker as the proxy.
"""
