"""Which messages were already handled: the idempotency store of the event dispatcher.

One row per (broker queue, message key) records where the message's handling stands:

- ``running``: a call is in flight, claimed by ``owner`` until ``lease_until``;
- ``failed``: the last call failed and no call is in flight (``attempts`` so far): safe to call again;
- ``dlq``: the message must go to the dead-letter queue (``reason``), not yet confirmed there;
- ``done``: the function succeeded; ``dead``: the message is in the dead-letter queue.

A redelivery (after a crash, a lost connection or a broker restart) reads the row first: ``done`` and
``dead`` are acknowledged without a call, ``failed`` continues the retries where they stopped, and
``running`` by a process that no longer exists is a call whose outcome nobody saw: it is not run a
second time but dead-lettered as ``interrupted``. Rows are kept for the retention window
(``SLESS_EVENT_DEDUP_WINDOW_SEC``, 24 h by default) after their last change, then purged.

In standalone the rows live in the state database (SQLite, its own table); the PostgreSQL
implementation (:mod:`.pgdedup`) serves `sless-events`, the Kubernetes backend's dispatcher.
"""

from __future__ import annotations

import asyncio
import decimal
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from sless_api.services.events.batching import ClaimWrite, RecordWrite, Write, WriteBatcher

SCHEMA = """
CREATE TABLE IF NOT EXISTS event_deliveries (
  queue TEXT NOT NULL, message_key TEXT NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT NULL,
  owner TEXT NOT NULL, lease_until REAL NOT NULL, reason TEXT NOT NULL DEFAULT '', updated_at REAL NOT NULL,
  first_seen REAL, PRIMARY KEY (queue, message_key));
CREATE INDEX IF NOT EXISTS event_deliveries_updated ON event_deliveries (updated_at);
"""
PURGE_BATCH = 5000


class State(StrEnum):
    RUNNING = "running"
    FAILED = "failed"
    DLQ = "dlq"
    DONE = "done"
    DEAD = "dead"


@dataclass(frozen=True)
class Claim:
    """The answer to "may I call the function for this message?"."""

    granted: bool  # True: the row is now ``running`` for the caller
    state: State | None  # the row's state before the claim (None: first time seen)
    attempts: int
    owner: str = ""
    lease_until: float = 0.0
    reason: str = ""
    #: when the platform first took the message (seconds since the epoch; None: a row from before it was kept)
    first_seen: float | None = None


class DedupStore(Protocol):
    async def claim(self, queue: str, key: str, owner: str, lease_until: float) -> Claim: ...
    async def record(self, queue: str, key: str, state: State, attempts: int, reason: str = "") -> None: ...
    async def purge(self, older_than: float) -> int: ...
    def close(self) -> None: ...


def seen_at(value: float | decimal.Decimal | None) -> float | None:
    """A row's ``first_seen`` as seconds (PostgreSQL's EXTRACT gives a Decimal; older rows have none)."""
    return None if value is None else float(value)


def process_owner() -> str:
    """This process as a claim owner: host, pid and the pid's start time (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_ticks(os.getpid())}"


def _start_ticks(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    return stat.rsplit(")", 1)[1].split()[19]


def owner_gone(owner: str) -> bool:
    """True when ``owner`` is certainly not running any more (same host, and its pid is gone or reused).

    Owners on other hosts are never declared gone here; their claims end with their lease.
    """
    host, _, rest = owner.partition(":")
    pid, _, ticks = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    current = _start_ticks(int(pid))
    return current == "?" or current != ticks


class SqliteDedupStore:
    """The store on SQLite: the writes asked for in one turn of the event loop in one short transaction
    (:mod:`.batching`), run in a worker thread."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=10)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(event_deliveries)")}
        if "first_seen" not in columns:  # a state database from before the column
            self._db.execute("ALTER TABLE event_deliveries ADD COLUMN first_seen REAL")
        self._lock = threading.Lock()
        self.batcher = WriteBatcher(self._execute)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    async def claim(self, queue: str, key: str, owner: str, lease_until: float) -> Claim:
        claim: Claim = await self.batcher.submit(ClaimWrite(queue, key, owner, lease_until))
        return claim

    async def record(self, queue: str, key: str, state: State, attempts: int, reason: str = "") -> None:
        await self.batcher.submit(RecordWrite(queue, key, state, attempts, reason))

    async def _execute(self, writes: Sequence[Write]) -> list[Any]:
        """The batch in one transaction, in a worker thread: a commit that has to checkpoint the WAL (an fsync of
        the database, slow on a busy disk) must not stop the event loop."""
        return await asyncio.to_thread(self._execute_sync, writes)

    def _execute_sync(self, writes: Sequence[Write]) -> list[Any]:
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                results: list[Any] = []
                for w in writes:
                    if isinstance(w, ClaimWrite):
                        results.append(self._claim(w, now))
                    else:
                        self._record(w, now)
                        results.append(None)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return results

    def _claim(self, w: ClaimWrite, now: float) -> Claim:
        row = self._db.execute(
            "SELECT state, attempts, owner, lease_until, reason, first_seen FROM event_deliveries "
            "WHERE queue = ? AND message_key = ?", (w.queue, w.key)).fetchone()
        if row is None or row[0] == State.FAILED:
            attempts = 0 if row is None else int(row[1])
            self._db.execute(
                "INSERT INTO event_deliveries (queue, message_key, state, attempts, owner, lease_until, reason, "
                "updated_at, first_seen) VALUES (?, ?, ?, ?, ?, ?, '', ?, ?) "
                "ON CONFLICT (queue, message_key) DO UPDATE SET state = excluded.state, "
                "owner = excluded.owner, lease_until = excluded.lease_until, updated_at = excluded.updated_at",
                (w.queue, w.key, State.RUNNING.value, attempts, w.owner, w.lease_until, now, now))
            if row is None:
                return Claim(True, None, 0, w.owner, w.lease_until, "", now)
            return Claim(True, State.FAILED, attempts, w.owner, w.lease_until, str(row[4]), seen_at(row[5]))
        return Claim(False, State(row[0]), int(row[1]), str(row[2]), float(row[3]), str(row[4]), seen_at(row[5]))

    def _record(self, w: RecordWrite, now: float) -> None:
        self._db.execute(
            "INSERT INTO event_deliveries (queue, message_key, state, attempts, owner, lease_until, reason, "
            "updated_at, first_seen) VALUES (?, ?, ?, ?, '', 0, ?, ?, ?) "
            "ON CONFLICT (queue, message_key) DO UPDATE SET state = excluded.state, "
            "attempts = excluded.attempts, reason = excluded.reason, lease_until = 0, "
            "updated_at = excluded.updated_at",
            (w.queue, w.key, str(w.state), w.attempts, w.reason[:2000], now, now))

    async def purge(self, older_than: float) -> int:
        """Forget rows unchanged since ``older_than``, in batches so writers never wait long."""
        total = 0
        while True:
            with self._lock:
                cur = self._db.execute(
                    "DELETE FROM event_deliveries WHERE rowid IN (SELECT rowid FROM event_deliveries "
                    "WHERE updated_at < ? LIMIT ?)", (older_than, PURGE_BATCH))
                count = cur.rowcount
            total += count
            if count < PURGE_BATCH:
                return total

    # for tests and diagnostics
    def get(self, queue: str, key: str) -> tuple[str, int, str] | None:
        with self._lock:
            row = self._db.execute("SELECT state, attempts, reason FROM event_deliveries "
                                   "WHERE queue = ? AND message_key = ?", (queue, key)).fetchone()
        return None if row is None else (str(row[0]), int(row[1]), str(row[2]))
