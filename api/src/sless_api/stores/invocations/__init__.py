"""Invocation records: a non-blocking, batched log in front of SQLite or PostgreSQL."""

from sless_api.stores.invocations.factory import log_from_url, sink_from_url, sqlite_path
from sless_api.stores.invocations.log import InvocationLog
from sless_api.stores.invocations.model import Invocation
from sless_api.stores.invocations.postgres_sink import PostgresSink
from sless_api.stores.invocations.sink import Sink
from sless_api.stores.invocations.sqlite_sink import SqliteSink
from sless_api.stores.migrate import load_migrations, migrate_postgres, migrate_sqlite

__all__ = [
    "Invocation",
    "InvocationLog",
    "PostgresSink",
    "Sink",
    "SqliteSink",
    "load_migrations",
    "log_from_url",
    "migrate_postgres",
    "migrate_sqlite",
    "sink_from_url",
    "sqlite_path",
]
