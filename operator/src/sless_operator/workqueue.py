"""A coalescing work queue with a fixed number of workers (like client-go's workqueue).

Children's watch events (a build Job finished, a Deployment became available) only mark their
Function or FunctionJob as dirty here and return at once. Many events for one key while it
waits or runs collapse into one more run, and at most ``workers`` reconciles run at a time. So
a burst of thousands of events neither piles up in Kopf's per-object queues (memory) nor turns
into thousands of concurrent reconciles fighting over the API client.

Work that fails with an API error is retried with backoff; Kopf never retries event handlers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable

from sless_operator.kube import ApiError

log = logging.getLogger(__name__)

Work = Callable[[], Awaitable[None]]
#: How a worker runs one key's work: by default just that; the operator times and counts it (``metrics``).
Runner = Callable[[Hashable, Work], Awaitable[None]]


def _run(key: Hashable, work: Work) -> Awaitable[None]:
    return work()
RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class WorkQueue:
    def __init__(self, workers: int = 32, runner: Runner = _run) -> None:
        self._workers = workers
        self._runner = runner
        # failures the work reports in a status itself: logged briefly, not retried here
        self.expected: tuple[type[Exception], ...] = ()
        self._pending: dict[Hashable, Work] = {}
        self._running: set[Hashable] = set()
        self._failures: dict[Hashable, int] = {}
        self._ready: asyncio.Queue[Hashable] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._timers: set[asyncio.TimerHandle] = set()

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._worker(), name=f"sless-work-{i}") for i in range(self._workers)]

    async def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def add(self, key: Hashable, work: Work) -> None:
        """Run WORK for KEY soon; if KEY is already waiting, WORK replaces the waiting one."""
        queued = key in self._pending
        self._pending[key] = work
        if not queued and key not in self._running:
            self._ready.put_nowait(key)

    def __len__(self) -> int:
        return len(self._pending)

    def _retry(self, key: Hashable, work: Work) -> None:
        attempt = self._failures.get(key, 0)
        if attempt >= len(RETRY_DELAYS):
            log.error("giving up on %s after %d attempts", key, attempt)
            self._failures.pop(key, None)
            return
        self._failures[key] = attempt + 1

        def again() -> None:
            self._timers.discard(timer)
            if key not in self._pending:  # newer work supersedes the retry
                self.add(key, work)

        timer = asyncio.get_running_loop().call_later(RETRY_DELAYS[attempt], again)
        self._timers.add(timer)

    async def _worker(self) -> None:
        while True:
            key = await self._ready.get()
            work = self._pending.pop(key, None)
            if work is None:
                continue
            self._running.add(key)
            try:
                await self._runner(key, work)
                self._failures.pop(key, None)
            except ApiError as exc:
                log.warning("%s failed (%s); retrying", key, exc)
                self._retry(key, work)
            except self.expected as exc:  # the status says why; Kopf's change handlers retry these
                log.info("%s: %s", key, exc)
                self._failures.pop(key, None)
            except Exception:
                log.exception("%s failed", key)
                self._failures.pop(key, None)
            finally:
                self._running.discard(key)
                if key in self._pending:
                    self._ready.put_nowait(key)
