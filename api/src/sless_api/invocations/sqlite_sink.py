"""Invocation records in SQLite (standalone): WAL, one writer connection, one reader."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from sless_api.invocations.migrate import migrate_sqlite
from sless_api.invocations.model import Invocation, from_row, sanitized_row
from sless_api.invocations.sink import COLUMNS

_QUOTED = ", ".join(f'"{c}"' for c in COLUMNS)
_PLACEHOLDERS = ", ".join("?" for _ in COLUMNS)
_INSERT = f"INSERT INTO invocations ({_QUOTED}) VALUES ({_PLACEHOLDERS})"  # noqa: S608 - constant columns
_SELECT = f"SELECT id, {_QUOTED} FROM invocations"  # noqa: S608 - constant columns


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 30000")
    conn.execute("PRAGMA journal_mode = WAL")  # readers never wait for the writer
    conn.execute("PRAGMA synchronous = NORMAL")  # durable at checkpoints; a log can lose the last ms
    return conn


class SqliteSink:
    """A :class:`~sless_api.invocations.sink.Sink` in the SQLite file PATH (migrated on open)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write_conn = _connect(self.path)
        migrate_sqlite(self._write_conn)
        self._read_conn = _connect(self.path)
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SqliteSink({str(self.path)!r})"

    def write_batch(self, batch: Sequence[Invocation]) -> None:
        rows = [sanitized_row(inv) for inv in batch]
        with self._write_lock:
            self._write_conn.execute("BEGIN IMMEDIATE")
            try:
                self._write_conn.executemany(_INSERT, rows)
                self._write_conn.execute("COMMIT")
            except BaseException:
                self._write_conn.execute("ROLLBACK")
                raise

    def list(self, namespace: str, function: str | None, limit: int, before_id: int | None) -> list[Invocation]:
        where: list[str] = ["namespace = ?"]
        args: list[object] = [namespace]
        if function is not None:
            where.append("function = ?")
            args.append(function)
        if before_id is not None:
            where.append("id < ?")
            args.append(int(before_id))
        sql = f"{_SELECT} WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?"
        with self._read_lock:
            rows = self._read_conn.execute(sql, (*args, int(limit))).fetchall()
        return [from_row(row) for row in rows]

    def count(self) -> int:
        """All stored records (tests and diagnostics)."""
        with self._read_lock:
            return int(self._read_conn.execute("SELECT count(*) FROM invocations").fetchone()[0])

    def close(self) -> None:
        with self._write_lock:
            self._write_conn.close()
        with self._read_lock:
            self._read_conn.close()
