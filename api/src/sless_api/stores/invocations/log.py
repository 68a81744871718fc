"""The invocation log: callers hand records to a bounded queue; one thread writes batches.

``record()`` is on the invoke proxy's hot path, so it is a non-blocking queue put and
nothing else: it never waits for the database and never raises. When the queue is full
the record is dropped and counted. The writer thread groups records into batches, retries
a failing batch a bounded number of times, then drops it (counted) and carries on, so a
slow, stopped or restarting database costs records, never invocations. The counters
always add up: ``recorded == written + dropped + queued``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from sless_api.metrics import RECORDS_DROPPED
from sless_api.stores.invocations.model import Invocation
from sless_api.stores.invocations.sink import Sink

log = logging.getLogger(__name__)

MAX_PAGE = 1000
_Batch = list[Invocation]  # module-level: the class's list() method shadows the builtin
_WARN_EVERY = 30.0  # seconds between repeated warnings about a failing sink


class InvocationLog:
    """Buffered, batched invocation records in front of a :class:`Sink`."""

    def __init__(
        self,
        sink: Sink,
        max_queue: int = 10000,
        batch: int = 500,
        flush_interval: float = 0.2,
        *,
        retries: int = 3,
        retry_delay: float = 0.1,
    ) -> None:
        if max_queue < 1 or batch < 1 or flush_interval <= 0 or retries < 1:
            raise ValueError("max_queue, batch and retries must be >= 1 and flush_interval > 0")
        self.sink = sink
        self.max_queue = max_queue
        self.batch = batch
        self.flush_interval = flush_interval
        self.retries = retries
        self.retry_delay = retry_delay
        # One lock guards the buffer and the counters, so record() takes exactly one lock.
        # Two conditions on it: the writer waits for work, flush() waits for progress.
        self._lock = threading.Lock()
        self._has_work = threading.Condition(self._lock)
        self._progress = threading.Condition(self._lock)
        self._buffer: deque[Invocation] = deque()
        self._writer_waiting = False
        self._closing = False
        self._recorded = 0
        self._written = 0
        self._dropped = 0
        self._failed_batches = 0
        self._last_error: str | None = None
        self._last_warning = 0.0
        self._thread = threading.Thread(target=self._run, name="invocation-log-writer", daemon=True)
        self._thread.start()

    # -- the hot path

    def record(self, inv: Invocation) -> None:
        """Queue INV for writing; drop it (counted) if the queue is full or the log closed."""
        try:  # never let bookkeeping break an invocation (a try, not contextlib.suppress: this runs per call)
            with self._lock:
                self._recorded += 1
                # Not an Invocation: dropped here, or it would fail a whole batch later.
                if self._closing or len(self._buffer) >= self.max_queue or not isinstance(inv, Invocation):
                    self._dropped += 1
                    RECORDS_DROPPED.inc()
                    return
                self._buffer.append(inv)
                # Wake the writer only when it waits for exactly this: a first record or a full batch.
                if self._writer_waiting and (len(self._buffer) == 1 or len(self._buffer) >= self.batch):
                    self._has_work.notify()
        except Exception:  # noqa: S110
            pass

    def record_once(self, key: str, inv: Invocation) -> bool:
        """Store INV now, unless a record was stored under KEY before by any process sharing the store (blocking
        I/O, raises when the store fails): for a record several processes see, e.g. a Kubernetes run's. Not on
        a call's path, so not queued and not in the queue's counters."""
        return self.sink.record_once(key, inv)

    # -- reading

    def list(
        self,
        namespace: str,
        function: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
        since: float | None = None,
    ) -> tuple[_Batch, int | None]:
        """A page of records, newest first, and the cursor (``before_id``) of the next page.

        Keyset paging on the id: pages stay stable while new records arrive. Blocking I/O;
        async callers use ``asyncio.to_thread``. Records still queued are not visible yet.
        """
        limit = max(1, min(MAX_PAGE, int(limit)))
        rows = self.sink.list(namespace, function, limit + 1, before_id, since)
        items = rows[:limit]
        next_cursor = items[-1].id if len(rows) > limit and items else None
        return items, next_cursor

    def get(self, namespace: str, function: str, ident: int) -> Invocation | None:
        """One record by id, only when it is that function's in that namespace (blocking I/O)."""
        return self.sink.get(namespace, function, ident)

    def get_output(self, namespace: str, function: str, ident: int) -> dict[str, Any] | None:
        """What call ``ident`` of that function wrote before its answer, as kept with its record (blocking I/O)."""
        return self.sink.get_output(namespace, function, ident)

    def find_request(self, namespace: str, function: str, request_id: str) -> Invocation | None:
        """The newest record of that function with that request id (blocking I/O)."""
        return self.sink.find_request(namespace, function, request_id)

    def stats(self) -> dict[str, int]:
        """Counters: recorded, queued (accepted, not yet written or dropped), written,
        dropped (queue full, failed batches, after close), failed_batches."""
        with self._lock:
            return {
                "recorded": self._recorded,
                "queued": self._recorded - self._written - self._dropped,
                "written": self._written,
                "dropped": self._dropped,
                "failed_batches": self._failed_batches,
            }

    @property
    def last_error(self) -> str | None:
        """The most recent sink error, for health output."""
        return self._last_error

    # -- lifecycle

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every record recorded so far is written or dropped; False on timeout.

        Does not cut the batching wait short: expect up to ``flush_interval`` of latency.
        """
        deadline = time.monotonic() + timeout
        with self._progress:
            target = self._recorded
            while self._written + self._dropped < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._progress.wait(min(remaining, 0.5))
        return True

    def close(self, timeout: float = 10.0) -> bool:
        """Write what is queued (waiting at most TIMEOUT), stop the writer, close the sink.

        Returns False when the writer did not finish in time (a hung database); the sink
        is then left open under it and the thread, a daemon, ends with the process.
        """
        with self._lock:
            self._closing = True
            self._has_work.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        try:
            self.sink.close()
        except Exception as exc:
            log.warning("closing the invocation sink failed: %s", exc)
        return True

    # -- the writer thread

    def _next_batch(self) -> _Batch | None:
        """Up to ``batch`` records, waiting at most ``flush_interval`` after the first one
        for the batch to fill. None once closing and the buffer is empty."""
        with self._lock:
            while not self._buffer:
                if self._closing:
                    return None
                self._writer_waiting = True
                self._has_work.wait()
            deadline = time.monotonic() + self.flush_interval
            while len(self._buffer) < self.batch and not self._closing:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._writer_waiting = True
                self._has_work.wait(remaining)
            self._writer_waiting = False
            take = min(self.batch, len(self._buffer))
            return [self._buffer.popleft() for _ in range(take)]

    def _write(self, batch: Sequence[Invocation]) -> None:
        for attempt in range(self.retries):
            try:
                self.sink.write_batch(batch)
            except Exception as exc:
                self._last_error = f"{type(exc).__name__}: {exc}".strip()
                if attempt + 1 < self.retries:
                    time.sleep(self.retry_delay * 2**attempt)
                continue
            with self._progress:
                self._written += len(batch)
                self._progress.notify_all()
            return
        with self._progress:
            self._dropped += len(batch)
            RECORDS_DROPPED.inc(len(batch))
            self._failed_batches += 1
            self._progress.notify_all()
        now = time.monotonic()
        if now - self._last_warning >= _WARN_EVERY:
            self._last_warning = now
            log.warning(
                "invocation log: dropped a batch of %d after %d attempts (%s); stats %s",
                len(batch),
                self.retries,
                self._last_error,
                self.stats(),
            )

    def _run(self) -> None:
        while True:
            batch: _Batch = []
            try:
                next_batch = self._next_batch()
                if next_batch is None:
                    return
                batch = next_batch
                self._write(batch)
            except Exception:  # the writer must outlive any bug in a sink
                log.exception("invocation log writer error")
                with self._progress:
                    self._dropped += len(batch)
                    RECORDS_DROPPED.inc(len(batch))
                    self._progress.notify_all()
                time.sleep(self.flush_interval)
