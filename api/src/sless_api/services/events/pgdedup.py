"""The idempotency store in PostgreSQL, shared by every ``sless-events`` replica on Kubernetes.

Same rows and rules as the SQLite store (read :mod:`.dedup` first); the difference is that several
replicas share one table, and every replica consumes every trigger's queue, so two copies of one
message id (a publisher that sent it twice, a redelivery after a lost connection) can reach two
replicas at the same moment. One claim is one short transaction, and the database settles the race:

1. ``INSERT ... ON CONFLICT DO NOTHING RETURNING``: a message id seen for the first time. The
   primary key lets exactly one of several concurrent inserters get its row back; the others
   conflict (they wait for the winner's commit, then see the row).
2. Otherwise ``SELECT ... FOR UPDATE`` locks the existing row. A second claimer blocks until the
   first commits and then reads the row as the first left it (``running`` under the first), so the
   one ``failed -> running`` transition (a retry after a restart) is also taken by one claimer only.
3. ``UPDATE`` to ``running`` only from ``failed``; every other state is answered, not changed.

Nothing is held across a function call: the lock lives for the claim's few statements, and
``running`` with a lease (``owner``, ``lease_until``) says who is calling. A replica that finds a
live claim of another replica waits for it to end (``done`` -> acked unseen); a claim whose lease has
passed is a replica that died mid-call, and the dispatcher dead-letters the message as
``interrupted`` instead of calling again.

A claim is idempotent for the same ``(owner, lease_until)``: when the connection drops after the
commit but before the answer, the retry finds its own claim and gets it back, instead of reading it
as a claim by a process that disappeared. Writes are upserts, so they are retried too; a lost
connection is replaced and the statement retried a few times with backoff (a database restart or
failover takes seconds), then the error goes to the dispatcher, which gives the message back.

The claims and records that the messages of one prefetch window ask for in the same turn of the event loop
run in one transaction (:mod:`.batching`): one round trip and one WAL flush for the lot instead of one each.
Within a batch the rows are taken in (queue, key) order, so two replicas' batches that share keys lock them in
the same order and never deadlock.

The purge deletes in batches with ``FOR UPDATE SKIP LOCKED``: it never waits for a row a claim holds,
and replicas purging at the same time delete disjoint rows.

Clocks: ``updated_at`` is the database's (the retention window is measured on one clock);
``lease_until`` is the claimer's, as the dispatcher computes and compares it, so replicas' clocks
should agree (NTP): a skew of N seconds moves a lease by N seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import psycopg2
import psycopg2.extensions

from sless_api.services.events.batching import ClaimWrite, RecordWrite, Write, WriteBatcher
from sless_api.services.events.dedup import PURGE_BATCH, Claim, State, seen_at
from sless_api.stores.postgres import DISCONNECTS, connect

log = logging.getLogger("sless.events.store")
T = TypeVar("T")

#: Pauses between attempts of one statement after a lost connection (about 3.5 s in all).
RETRY_DELAYS = (0.0, 0.5, 1.0, 2.0)
#: Keys longer than this (or holding NUL, which TEXT cannot) are stored as their SHA-256.
KEY_MAX = 400
REASON_MAX = 2000

_INSERT_NEW = (
    "INSERT INTO event_deliveries (queue, message_key, state, attempts, owner, lease_until, reason, updated_at, "
    "first_seen) VALUES (%s, %s, 'running', 0, %s, %s, '', clock_timestamp(), EXTRACT(EPOCH FROM clock_timestamp())) "
    "ON CONFLICT (queue, message_key) DO NOTHING RETURNING first_seen")
_LOCK_ROW = ("SELECT state, attempts, owner, lease_until, reason, first_seen FROM event_deliveries "
             "WHERE queue = %s AND message_key = %s FOR UPDATE")
_TAKE_FAILED = ("UPDATE event_deliveries SET state = 'running', owner = %s, lease_until = %s, "
                "updated_at = clock_timestamp() WHERE queue = %s AND message_key = %s")
_RECORD = (
    "INSERT INTO event_deliveries (queue, message_key, state, attempts, owner, lease_until, reason, updated_at, "
    "first_seen) VALUES (%s, %s, %s, %s, '', 0, %s, clock_timestamp(), EXTRACT(EPOCH FROM clock_timestamp())) "
    "ON CONFLICT (queue, message_key) DO UPDATE SET state = EXCLUDED.state, attempts = EXCLUDED.attempts, "
    "reason = EXCLUDED.reason, lease_until = 0, updated_at = EXCLUDED.updated_at")
_PURGE = (
    "DELETE FROM event_deliveries WHERE (queue, message_key) IN ("
    "SELECT queue, message_key FROM event_deliveries WHERE updated_at < to_timestamp(%s) "
    "LIMIT %s FOR UPDATE SKIP LOCKED)")


def stored_key(key: str) -> str:
    """The key as a TEXT primary key column can hold it: as is when short and NUL-free, else hashed.

    CloudEvents keys are ``ce:<source>NUL<id>`` (NUL cannot occur in either part, so the pair is
    unambiguous) and may be long; ``h:<sha256>`` cannot collide with ``mid:``/``ce:`` keys.
    """
    if len(key) <= KEY_MAX and "\x00" not in key:
        return key
    return "h:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def _text(value: str, limit: int) -> str:
    return value[:limit].replace("\x00", "\\0")


def _claim_in(cur: psycopg2.extensions.cursor, w: ClaimWrite) -> Claim:
    """One claim inside the caller's transaction (its row stays locked until that commits)."""
    for _ in range(5):  # the row may be purged between the conflict and the lock: insert again
        cur.execute(_INSERT_NEW, (w.queue, w.key, w.owner, w.lease_until))
        new = cur.fetchone()
        if new is not None:
            return Claim(True, None, 0, w.owner, w.lease_until, "", seen_at(new[0]))
        cur.execute(_LOCK_ROW, (w.queue, w.key))
        row = cur.fetchone()
        if row is None:
            continue
        state, attempts, row_owner, row_lease, reason = State(row[0]), int(row[1]), str(row[2]), float(row[3]), \
            str(row[4])
        seen = seen_at(row[5])
        if state == State.FAILED:
            cur.execute(_TAKE_FAILED, (w.owner, w.lease_until, w.queue, w.key))
            return Claim(True, State.FAILED, attempts, w.owner, w.lease_until, reason, seen)
        if state == State.RUNNING and row_owner == w.owner and row_lease == w.lease_until:
            # our own claim, committed by an attempt whose answer the connection lost
            return Claim(True, State.FAILED if attempts else None, attempts, w.owner, w.lease_until, reason, seen)
        return Claim(False, state, attempts, row_owner, row_lease, reason, seen)
    raise RuntimeError(f"could not claim {w.key!r} in {w.queue}: the row kept disappearing")


def _record_in(cur: psycopg2.extensions.cursor, w: RecordWrite) -> None:
    """One record (an upsert) inside the caller's transaction; KEY and REASON already bounded."""
    cur.execute(_RECORD, (w.queue, w.key, str(w.state), w.attempts, w.reason))


class _Pool:
    """A few connections reused by worker threads; a broken one is closed, never handed out again."""

    def __init__(self, dsn: str, size: int) -> None:
        self._dsn = dsn
        self._idle: list[psycopg2.extensions.connection] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(size)
        self._migrated = False
        self._closed = False

    def _open(self) -> psycopg2.extensions.connection:
        conn = connect(self._dsn, "sless-events", migrate=not self._migrated)
        self._migrated = True
        return conn

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg2.extensions.connection]:
        with self._slots:
            with self._lock:
                if self._closed:
                    raise psycopg2.InterfaceError("the event store is closed")
                conn = self._idle.pop() if self._idle else None
            if conn is None or conn.closed:
                conn = self._open()
            try:
                yield conn
            except BaseException:
                with contextlib.suppress(psycopg2.Error):
                    conn.close()  # its state is unknown (a lost connection, a statement cut short)
                raise
            with self._lock:
                if self._closed:
                    conn.close()
                else:
                    self._idle.append(conn)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(psycopg2.Error):
                conn.close()


class PostgresDedupStore:
    """:class:`~sless_api.services.events.dedup.DedupStore` in PostgreSQL (see the module docstring).

    The blocking driver runs in worker threads (``asyncio.to_thread``); ``pool_size`` bounds the
    connections one replica opens.
    """

    def __init__(self, dsn: str, pool_size: int = 4, purge_batch: int = PURGE_BATCH) -> None:
        self._pool = _Pool(dsn, pool_size)
        self.purge_batch = purge_batch
        self.batcher = WriteBatcher(self._execute)

    def __repr__(self) -> str:
        return "PostgresDedupStore(...)"  # the DSN may hold a password

    def close(self) -> None:
        self._pool.close()

    def _retrying(self, what: str, fn: Callable[[], T]) -> T:
        for attempt, delay in enumerate(RETRY_DELAYS, start=1):
            time.sleep(delay)
            try:
                return fn()
            except DISCONNECTS as exc:
                if attempt == len(RETRY_DELAYS):
                    raise
                log.warning("event store: %s failed (%s: %s); retrying on a new connection", what,
                            type(exc).__name__, str(exc).strip()[:200])
        raise AssertionError("unreachable")

    # the DedupStore protocol

    async def claim(self, queue: str, key: str, owner: str, lease_until: float) -> Claim:
        claim: Claim = await self.batcher.submit(ClaimWrite(queue, stored_key(key), owner, lease_until))
        return claim

    async def record(self, queue: str, key: str, state: State, attempts: int, reason: str = "") -> None:
        await self.batcher.submit(RecordWrite(queue, stored_key(key), state, attempts, _text(reason, REASON_MAX)))

    async def _execute(self, writes: Sequence[Write]) -> list[Any]:
        return await asyncio.to_thread(self.execute_sync, writes)

    async def purge(self, older_than: float) -> int:
        return await asyncio.to_thread(self.purge_sync, older_than)

    # the same, blocking

    def claim_sync(self, queue: str, key: str, owner: str, lease_until: float) -> Claim:
        stored = stored_key(key)
        return self._retrying("a claim", lambda: self._claim_once(queue, stored, owner, lease_until))

    def _claim_once(self, queue: str, key: str, owner: str, lease_until: float) -> Claim:
        with self._pool.connection() as conn, conn, conn.cursor() as cur:
            return _claim_in(cur, ClaimWrite(queue, key, owner, lease_until))

    def record_sync(self, queue: str, key: str, state: State, attempts: int, reason: str = "") -> None:
        write = RecordWrite(queue, stored_key(key), state, attempts, _text(reason, REASON_MAX))

        def once() -> None:
            with self._pool.connection() as conn, conn, conn.cursor() as cur:
                _record_in(cur, write)

        self._retrying("a record", once)

    def execute_sync(self, writes: Sequence[Write]) -> list[Any]:
        """WRITES (keys already stored_key'd) in one transaction, taken in (queue, key) order; their results in
        the order given. Retried whole on a lost connection: claims are idempotent for their own (owner,
        lease_until), records are upserts."""
        order = sorted(range(len(writes)), key=lambda i: (writes[i].queue, writes[i].key))

        def once() -> list[Any]:
            results: list[Any] = [None] * len(writes)
            with self._pool.connection() as conn, conn, conn.cursor() as cur:
                for i in order:
                    write = writes[i]
                    if isinstance(write, ClaimWrite):
                        results[i] = _claim_in(cur, write)
                    else:
                        _record_in(cur, write)
            return results

        return self._retrying(f"a batch of {len(writes)} writes", once)

    def purge_sync(self, older_than: float) -> int:
        """Forget rows unchanged since ``older_than`` (seconds since the epoch), in batches."""
        total = 0
        while True:
            def batch() -> int:
                with self._pool.connection() as conn, conn, conn.cursor() as cur:
                    cur.execute(_PURGE, (older_than, self.purge_batch))
                    return int(cur.rowcount)

            count = self._retrying("a purge", batch)
            total += count
            if count < self.purge_batch:
                return total

    # for tests and diagnostics

    def get(self, queue: str, key: str) -> tuple[str, int, str] | None:
        with self._pool.connection() as conn, conn, conn.cursor() as cur:
            cur.execute("SELECT state, attempts, reason FROM event_deliveries WHERE queue = %s AND message_key = %s",
                        (queue, stored_key(key)))
            row = cur.fetchone()
        return None if row is None else (str(row[0]), int(row[1]), str(row[2]))
