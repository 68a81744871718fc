"""Schema migrations: numbered SQL files applied once each, recorded in schema_migrations.

Files in ``sless_api/migrations`` are named ``NNNN_name.sql`` (any database) or
``NNNN_name.postgresql.sql`` / ``NNNN_name.sqlite.sql`` (one dialect; wins over a
generic file of the same version). Several API replicas may start at once, so the whole
run holds a lock: a transaction-scoped advisory lock on PostgreSQL, ``BEGIN IMMEDIATE``
on SQLite. DDL is transactional in both, so a failed migration leaves nothing behind.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

MIGRATIONS_DIR = Path(__file__).resolve().parents[1] / "migrations"  # sless_api/migrations
Dialect = Literal["postgresql", "sqlite"]
_NAME = re.compile(r"^(?P<version>\d{4}_[a-z0-9_]+?)(?:\.(?P<dialect>postgresql|sqlite))?\.sql$")
#: pg_advisory_xact_lock key: "sless" + "mig" in ASCII; any constant shared by all replicas.
ADVISORY_LOCK_KEY = 0x736C6573_6D6967
_TABLE_SQL = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ( version TEXT PRIMARY KEY, applied_at {ts} NOT NULL DEFAULT {now})"
)


@dataclass(frozen=True)
class Migration:
    version: str
    sql: str


def load_migrations(dialect: Dialect, directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migrations for DIALECT in version order."""
    chosen: dict[str, tuple[bool, Path]] = {}
    for path in directory.glob("*.sql"):
        match = _NAME.match(path.name)
        if not match:
            raise ValueError(f"migration file {path.name!r} is not named NNNN_name[.dialect].sql")
        file_dialect = match.group("dialect")
        if file_dialect not in (None, dialect):
            continue
        version, specific = match.group("version"), file_dialect is not None
        if version in chosen and chosen[version][0] == specific:
            raise ValueError(f"two migration files for version {version!r}")
        if version not in chosen or specific:
            chosen[version] = (specific, path)
    return [Migration(v, chosen[v][1].read_text()) for v in sorted(chosen)]


def migrate_postgres(conn: Any, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply pending migrations on a psycopg2 connection; return the versions applied."""
    applied_now: list[str] = []
    with conn, conn.cursor() as cur:  # one transaction: commit on success, rollback on error
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK_KEY,))
        cur.execute(_TABLE_SQL.format(ts="TIMESTAMPTZ", now="now()"))
        cur.execute("SELECT version FROM schema_migrations")
        done = {row[0] for row in cur.fetchall()}
        for migration in load_migrations("postgresql", directory):
            if migration.version in done:
                continue
            cur.execute(migration.sql)
            cur.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (migration.version,))
            applied_now.append(migration.version)
    return applied_now


def _statements(sql: str) -> list[str]:
    """Split a script into complete statements (sqlite3.executescript would commit early)."""
    statements: list[str] = []
    current = ""
    for line in sql.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    if current.strip() and not all(part.strip().startswith("--") or not part.strip() for part in current.splitlines()):
        raise ValueError(f"incomplete SQL statement at the end of a migration: {current.strip()[:80]!r}")
    return statements


def migrate_sqlite(conn: sqlite3.Connection, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply pending migrations on an autocommit (isolation_level=None) SQLite connection."""
    if conn.isolation_level is not None:
        raise ValueError("migrate_sqlite needs a connection opened with isolation_level=None")
    applied_now: list[str] = []
    conn.execute("BEGIN IMMEDIATE")  # the database's write lock: other migrators wait (busy_timeout)
    try:
        conn.execute(_TABLE_SQL.format(ts="REAL", now="((julianday('now') - 2440587.5) * 86400.0)"))
        done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
        for migration in load_migrations("sqlite", directory):
            if migration.version in done:
                continue
            for statement in _statements(migration.sql):
                conn.execute(statement)
            conn.execute("INSERT INTO schema_migrations (version) VALUES (?)", (migration.version,))
            applied_now.append(migration.version)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return applied_now
