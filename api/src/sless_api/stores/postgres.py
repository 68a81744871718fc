"""The platform's one way to open a PostgreSQL connection: the invocation log, the async call store and the event
dispatcher's idempotency store all connect here, with the same libpq options and the schema migrated once per
process and store."""

from __future__ import annotations

from typing import Any

import psycopg2
import psycopg2.extensions

from sless_api.stores.migrate import migrate_postgres

#: What a lost or refused connection raises: the caller drops the connection and tries again with a new one.
DISCONNECTS = (psycopg2.OperationalError, psycopg2.InterfaceError)


def connect_options(application_name: str) -> dict[str, Any]:
    """libpq options: fail fast when the server is unreachable, notice a dead peer on idle sockets, and name the
    client (``pg_stat_activity`` shows which part of the platform holds a connection)."""
    return {"connect_timeout": 5, "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
            "keepalives_count": 3, "application_name": application_name}  # fmt: skip


def connect(dsn: str, application_name: str, migrate: bool) -> psycopg2.extensions.connection:
    """A new connection to DSN; with MIGRATE, the platform's migrations applied first (an advisory lock makes
    concurrent processes take turns). A connection whose migration failed is closed, not handed out."""
    conn: psycopg2.extensions.connection = psycopg2.connect(dsn, **connect_options(application_name))
    try:
        if migrate:
            migrate_postgres(conn)
    except BaseException:
        conn.close()
        raise
    return conn
