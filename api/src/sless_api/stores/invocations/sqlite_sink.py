"""Invocation records in SQLite (standalone): WAL, one writer connection, one reader."""

from __future__ import annotations

import functools
import logging
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sless_api.domain import calloutput
from sless_api.stores.invocations.model import Invocation, from_row, output_text, sanitized_row
from sless_api.stores.invocations.sink import COLUMNS, WRITE_COLUMNS
from sless_api.stores.migrate import migrate_sqlite

_QUOTED = ", ".join(f'"{c}"' for c in COLUMNS)
_WRITTEN = ", ".join(f'"{c}"' for c in WRITE_COLUMNS)
_PLACEHOLDERS = ", ".join("?" for _ in WRITE_COLUMNS)
log = logging.getLogger(__name__)
#: Rows per INSERT statement: their values stay within SQLite's oldest limit of 999 variables (raised in 3.32).
_ROWS_PER_INSERT = max(1, 999 // len(WRITE_COLUMNS))
_SELECT = f"SELECT id, {_QUOTED} FROM invocations"  # noqa: S608 - constant columns


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 30000")
    conn.execute("PRAGMA journal_mode = WAL")  # readers never wait for the writer
    conn.execute("PRAGMA synchronous = NORMAL")  # durable at checkpoints; a log can lose the last ms
    return conn


def _open_checked(path: Path) -> sqlite3.Connection:
    conn = _connect(path)
    try:
        check = conn.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise sqlite3.DatabaseError(check)
        migrate_sqlite(conn)
    except sqlite3.DatabaseError:
        conn.close()
        raise
    return conn


def _replace_corrupt(path: Path, cause: Exception) -> sqlite3.Connection:
    """A corrupt log must not stop the platform: it is history, not state. Keep it for inspection, start anew."""
    aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    for suffix in ("", "-wal", "-shm"):
        source = path.with_name(path.name + suffix)
        if source.exists():
            source.rename(aside.with_name(aside.name + suffix))
    log.warning("invocation log %s is unreadable (%s): moved aside to %s, starting a new one", path, cause, aside)
    path.touch(mode=0o600)  # request paths and errors of every tenant are in here
    conn = _connect(path)
    migrate_sqlite(conn)
    return conn


class SqliteSink:
    """A :class:`~sless_api.stores.invocations.sink.Sink` in the SQLite file PATH (migrated on open)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._write_conn = _open_checked(self.path)
        except sqlite3.DatabaseError as exc:
            self._write_conn = _replace_corrupt(self.path, exc)
        self._read_conn = _connect(self.path)
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SqliteSink({str(self.path)!r})"

    def write_batch(self, batch: Sequence[Invocation]) -> None:
        """The batch in one transaction, as multi-row INSERTs: ``executemany`` steps SQLite once per row and lets
        go of the GIL around each step, and on a busy proxy every one of those hand-offs makes the event loop's
        thread wait to take the GIL back; one statement per ``_ROWS_PER_INSERT`` rows hands it over once."""
        rows = [(*sanitized_row(inv), output_text(inv)) for inv in batch]
        with self._write_lock:
            self._write_conn.execute("BEGIN IMMEDIATE")
            try:
                for start in range(0, len(rows), _ROWS_PER_INSERT):
                    chunk = rows[start:start + _ROWS_PER_INSERT]
                    self._write_conn.execute(_multi_insert(len(chunk)), [value for row in chunk for value in row])
                self._write_conn.execute("COMMIT")
            except BaseException:
                self._write_conn.execute("ROLLBACK")
                raise

    def record_once(self, key: str, inv: Invocation) -> bool:
        row = (*sanitized_row(inv), output_text(inv))
        with self._write_lock:
            self._write_conn.execute("BEGIN IMMEDIATE")
            try:
                claimed = self._write_conn.execute(
                    "INSERT INTO run_records (run_key) VALUES (?) ON CONFLICT DO NOTHING", (key,)).rowcount == 1
                if claimed:
                    self._write_conn.execute(_multi_insert(1), row)
                self._write_conn.execute("COMMIT")
            except BaseException:
                self._write_conn.execute("ROLLBACK")
                raise
        return claimed

    def list(self, namespace: str, function: str | None, limit: int, before_id: int | None,
             since: float | None = None) -> list[Invocation]:
        where: list[str] = ["namespace = ?"]
        args: list[object] = [namespace]
        if function is not None:
            where.append("function = ?")
            args.append(function)
        if before_id is not None:
            where.append("id < ?")
            args.append(int(before_id))
        if since is not None:
            where.append("started_at >= ?")
            args.append(float(since))
        sql = f"{_SELECT} WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?"
        with self._read_lock:
            rows = self._read_conn.execute(sql, (*args, int(limit))).fetchall()
        return [from_row(row) for row in rows]

    def get(self, namespace: str, function: str, ident: int) -> Invocation | None:
        sql = f"{_SELECT} WHERE id = ? AND namespace = ? AND function = ?"
        with self._read_lock:
            row = self._read_conn.execute(sql, (int(ident), namespace, function)).fetchone()
        return None if row is None else from_row(row)

    def get_output(self, namespace: str, function: str, ident: int) -> dict[str, Any] | None:
        sql = "SELECT output FROM invocations WHERE id = ? AND namespace = ? AND function = ?"
        with self._read_lock:
            row = self._read_conn.execute(sql, (int(ident), namespace, function)).fetchone()
        return None if row is None else calloutput.loaded(row[0])

    def find_request(self, namespace: str, function: str, request_id: str) -> Invocation | None:
        sql = f"{_SELECT} WHERE namespace = ? AND function = ? AND request_id = ? ORDER BY id DESC LIMIT 1"
        with self._read_lock:
            row = self._read_conn.execute(sql, (namespace, function, request_id)).fetchone()
        return None if row is None else from_row(row)

    def count(self) -> int:
        """All stored records (tests and diagnostics)."""
        with self._read_lock:
            return int(self._read_conn.execute("SELECT count(*) FROM invocations").fetchone()[0])

    def close(self) -> None:
        with self._write_lock:
            self._write_conn.close()
        with self._read_lock:
            self._read_conn.close()


@functools.lru_cache(maxsize=_ROWS_PER_INSERT + 1)
def _multi_insert(rows: int) -> str:
    """``INSERT ... VALUES (?, ...), (?, ...)`` for ``rows`` rows."""
    return f"INSERT INTO invocations ({_WRITTEN}) VALUES " + ", ".join([f"({_PLACEHOLDERS})"] * rows)  # noqa: S608
