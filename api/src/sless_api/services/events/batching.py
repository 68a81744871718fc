"""One transaction for the store's writes asked for together: the claims and records that every message in a prefetch
window needs arrive in the same turn of the event loop, and each of them alone would be a transaction (a commit, and
in PostgreSQL a round trip and a WAL flush) of its own.

``WriteBatcher.submit`` queues one write and returns its result; one batch runs at a time, and the writes queued
before the loop's next turn, or while the previous batch ran (a group commit), run as one batch through the store's
``execute``, in the order they came (two writes of one message keep their order). A claim goes out in the next turn
(a call waits for it); a record may wait up to ``RECORD_LINGER_SEC`` for others to share its transaction (only the
message's ack waits for it, and calls end one by one: without the wait most records would be a transaction each),
and goes with the next claim's batch if one comes first. The store keeps the locking rules of one write per
transaction: a batch only groups what was asked for at once, it never holds a row across a function call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: At most this many writes in one transaction: a bound on how long one holds the store.
MAX_BATCH = 256
#: How long a record may wait for company (a group commit); what it delays is the message's ack, not a call.
RECORD_LINGER_SEC = 0.002


@dataclass(frozen=True, slots=True)
class ClaimWrite:
    """Take a message for a call (see :meth:`DedupStore.claim`)."""

    queue: str
    key: str
    owner: str
    lease_until: float


@dataclass(frozen=True, slots=True)
class RecordWrite:
    """Write where a message's handling stands (see :meth:`DedupStore.record`)."""

    queue: str
    key: str
    state: str  # a dedup.State (a string enum; the stores import this module, not the other way round)
    attempts: int
    reason: str


Write = ClaimWrite | RecordWrite
#: Runs writes in one transaction and gives one result each (a Claim for a claim, None for a record).
Execute = Callable[[Sequence[Write]], Awaitable[list[Any]]]


class WriteBatcher:
    """Coalesces the writes submitted in one turn of the event loop into one call of ``execute``."""

    def __init__(self, execute: Execute, max_batch: int = MAX_BATCH, linger_sec: float = RECORD_LINGER_SEC) -> None:
        self._execute = execute
        self._max_batch = max_batch
        self._linger = linger_sec
        self._pending: list[tuple[Write, asyncio.Future[Any]]] = []
        self._flush_at: float | None = None  # the loop time the pending writes go out
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._running: asyncio.Task[None] | None = None  # one batch at a time: what comes meanwhile forms the next
        self._due_after_run = False  # writes fell due while a batch ran: they go as soon as it ends
        self.batches = 0  # for tests and diagnostics: how many transactions ran
        self.writes = 0

    async def submit(self, write: Write) -> Any:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        self._pending.append((write, done))
        wait = self._linger if isinstance(write, RecordWrite) and len(self._pending) < self._max_batch else 0.0
        due = loop.time() + wait
        if self._flush_at is None or due < self._flush_at:  # the soonest any pending write must go decides
            if self._timer is not None:
                self._timer.cancel()
            self._flush_at = due
            self._timer = loop.call_later(wait, self._flush) if wait else loop.call_soon(self._flush)
        return await done

    def _flush(self) -> None:
        self._flush_at, self._timer = None, None
        if self._running is not None:
            self._due_after_run = True
            return
        batch, self._pending = self._pending[:self._max_batch], self._pending[self._max_batch:]
        if batch:
            self._running = asyncio.ensure_future(self._run(batch))
            self._running.add_done_callback(self._ran)

    def _ran(self, _task: asyncio.Task[None]) -> None:
        """A batch ended: the writes that fell due meanwhile (or are over the cap) go now, the rest at their time."""
        self._running = None
        if self._pending and (self._due_after_run or self._timer is None):
            self._due_after_run = False
            if self._timer is not None:
                self._timer.cancel()
            loop = asyncio.get_running_loop()
            self._flush_at = loop.time()
            self._timer = loop.call_soon(self._flush)

    async def _run(self, batch: list[tuple[Write, asyncio.Future[Any]]]) -> None:
        self.batches += 1
        self.writes += len(batch)
        try:
            results = await self._execute([write for write, _ in batch])
        except BaseException as exc:  # every write of the batch failed with it; each caller sees the error
            for _, done in batch:
                if not done.done():
                    done.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        for (_, done), result in zip(batch, results, strict=True):
            if not done.done():
                done.set_result(result)
