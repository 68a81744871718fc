"""Invocation records in PostgreSQL: batches go in with COPY, pages come out by keyset.

The writer's connection is dropped on any connection-level error and opened again on the
next batch, so the log survives a database restart without anyone noticing but the
drop counter. Migrations run on the first successful connection (not at construction),
so the API starts even while the database is down.
"""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

import psycopg2
import psycopg2.extensions

from sless_api.domain import calloutput
from sless_api.stores.invocations.model import Invocation, from_row, output_text, sanitized_row
from sless_api.stores.invocations.sink import COLUMNS, WRITE_COLUMNS
from sless_api.stores.postgres import DISCONNECTS, connect

_COPY = f"COPY invocations ({', '.join(WRITE_COLUMNS)}) FROM STDIN"
_CLAIM = "INSERT INTO run_records (run_key) VALUES (%s) ON CONFLICT DO NOTHING"
# started_at is a timestamptz in the table and epoch seconds in Python
_READ = ", ".join("EXTRACT(EPOCH FROM started_at)::double precision" if c == "started_at" else c for c in COLUMNS)
_SELECT = f"SELECT id, {_READ} FROM invocations"  # noqa: S608 - constant columns
_STARTED_AT = COLUMNS.index("started_at")
_Rows = list[tuple[Any, ...]]  # module-level: the class's list() method shadows the builtin


def _copy_text(value: object) -> str:
    """One field in COPY's text format (tab separated, backslash escapes, \\N for NULL)."""
    if value is None:
        return "\\N"
    text = value if type(value) is str else repr(value) if type(value) is float else str(value)
    if "\\" in text or "\t" in text or "\n" in text or "\r" in text:
        text = text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return text


def _copy_row(inv: Invocation) -> str:
    values: list[object] = [*sanitized_row(inv), output_text(inv)]
    values[_STARTED_AT] = datetime.fromtimestamp(cast(float, values[_STARTED_AT]), UTC).isoformat()
    return "\t".join(map(_copy_text, values)) + "\n"


class _Connection:
    """One lazily (re)opened connection, used under a lock."""

    def __init__(self, dsn: str, migrate: bool) -> None:
        self._dsn = dsn
        self._migrate = migrate
        self.lock = threading.Lock()
        self._conn: psycopg2.extensions.connection | None = None

    def get(self) -> psycopg2.extensions.connection:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self._dsn, "sless-invocations", migrate=self._migrate)
            self._migrate = False
        return self._conn

    def reset(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg2.Error):
                self._conn.close()
            self._conn = None


class PostgresSink:
    """A :class:`~sless_api.stores.invocations.sink.Sink` in the PostgreSQL database DSN."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._writer = _Connection(dsn, migrate=True)
        self._reader = _Connection(dsn, migrate=True)  # whichever connects first creates the table

    def __repr__(self) -> str:
        return "PostgresSink(...)"  # the DSN may hold a password

    def write_batch(self, batch: Sequence[Invocation]) -> None:
        payload = io.StringIO("".join(map(_copy_row, batch)))
        with self._writer.lock:
            try:
                conn = self._writer.get()
                with conn, conn.cursor() as cur:
                    cur.copy_expert(_COPY, payload)
            except DISCONNECTS:
                self._writer.reset()
                raise

    def record_once(self, key: str, inv: Invocation) -> bool:
        with self._writer.lock:
            try:
                conn = self._writer.get()
                with conn, conn.cursor() as cur:
                    cur.execute(_CLAIM, (key,))
                    if cur.rowcount != 1:
                        return False  # claimed before: recorded by this or another process
                    cur.copy_expert(_COPY, io.StringIO(_copy_row(inv)))
                    return True
            except DISCONNECTS:
                self._writer.reset()
                raise

    def list(self, namespace: str, function: str | None, limit: int, before_id: int | None,
             since: float | None = None) -> list[Invocation]:
        where: list[str] = ["namespace = %s"]
        args: list[object] = [namespace]
        if function is not None:
            where.append("function = %s")
            args.append(function)
        if before_id is not None:
            where.append("id < %s")
            args.append(int(before_id))
        if since is not None:
            where.append("started_at >= to_timestamp(%s)")
            args.append(float(since))
        sql = f"{_SELECT} WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT %s"
        rows = self._read(sql, (*args, int(limit)))
        return [from_row(row) for row in rows]

    def get(self, namespace: str, function: str, ident: int) -> Invocation | None:
        rows = self._read(f"{_SELECT} WHERE id = %s AND namespace = %s AND function = %s",
                          (int(ident), namespace, function))
        return from_row(rows[0]) if rows else None

    def get_output(self, namespace: str, function: str, ident: int) -> dict[str, Any] | None:
        rows = self._read("SELECT output FROM invocations WHERE id = %s AND namespace = %s AND function = %s",
                          (int(ident), namespace, function))
        return calloutput.loaded(rows[0][0]) if rows else None

    def find_request(self, namespace: str, function: str, request_id: str) -> Invocation | None:
        rows = self._read(f"{_SELECT} WHERE namespace = %s AND function = %s AND request_id = %s "
                          "ORDER BY id DESC LIMIT 1", (namespace, function, request_id))
        return from_row(rows[0]) if rows else None

    def count(self) -> int:
        """All stored records (tests and diagnostics)."""
        rows = self._read("SELECT count(*) FROM invocations", ())
        return int(rows[0][0]) if rows else 0

    def _read(self, sql: str, args: tuple[object, ...]) -> _Rows:
        """Run a read; after a server restart the kept connection is dead, so a read that
        fails on the connection is retried once on a fresh one (reads are idempotent)."""
        with self._reader.lock:
            for attempt in (1, 2):
                try:
                    conn = self._reader.get()
                    with conn, conn.cursor() as cur:
                        cur.execute(sql, args)
                        return list(cur.fetchall())
                except DISCONNECTS:
                    self._reader.reset()
                    if attempt == 2:
                        raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        for conn in (self._writer, self._reader):
            with conn.lock:
                conn.reset()
