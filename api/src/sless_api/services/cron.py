"""In-process cron, by the rules of ``sless_core.contract`` (as CronJobs on Kubernetes).

It needs no backend, only a :class:`CronSource`: the enabled cron triggers, a way to fire one, a note of
a skipped tick, and the change feed that wakes it (the standalone backend hands one over).

One asyncio task sleeps until the earliest next tick of the enabled cron triggers, then fires each
due trigger on its own task, so a slow function never delays another trigger's tick:

- a firing runs the function's runner once with ``{"type": "cron", "trigger", "schedule",
  "scheduled_at"}`` (what a CronJob's runner pod gets on Kubernetes);
- a tick missed while ``sless up`` was down fires late only within ``CRON_START_DEADLINE_SEC`` (the
  latest one; older ones are never replayed), and never a tick from before the trigger existed;
- a tick that comes while the same trigger's previous firing still runs is skipped (no overlap).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

from sless_api.domain.ports import ChangeFeed
from sless_api.domain.records import TriggerRecord
from sless_core import contract

log = logging.getLogger("sless.cron")
Key = tuple[str, str, str]  # namespace, trigger, schedule
IDLE_WAKE_SEC = 30.0


class CronSource(ChangeFeed, Protocol):
    """The cron firing hooks of a backend."""

    def cron_triggers(self) -> list[TriggerRecord]:
        """The enabled cron triggers, with when each last fired."""
        ...

    def cron_skipped(self, trigger: TriggerRecord, tick: float) -> None:
        """A tick of TRIGGER came while its previous firing still ran: not fired (firings never overlap)."""
        ...

    async def fire_cron(self, trigger: TriggerRecord, tick: float) -> str:
        """Fire TICK of TRIGGER; what happened, in one line (the trigger's message)."""
        ...


class CronScheduler:
    def __init__(self, platform: CronSource) -> None:
        self.platform = platform
        self._fired: dict[Key, float] = {}  # the last tick fired (or skipped) per trigger and schedule
        self._running: dict[Key, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None

    async def start(self) -> None:
        self._unsubscribe = self.platform.subscribe(self.refresh)
        self._task = asyncio.create_task(self._loop())

    async def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, *self._running.values(), return_exceptions=True)

    def refresh(self) -> None:
        """Called on any trigger change: recompute on the loop's next turn."""
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            now = time.time()
            wake = now + IDLE_WAKE_SEC
            fired: dict[Key, float] = {}
            for trig in self.platform.cron_triggers():
                schedule = trig.spec.schedule or ""
                key = (trig.namespace, trig.spec.name, schedule)
                last = max(self._fired.get(key, 0.0), trig.last_fired_at or 0.0, trig.created_at)
                tick = contract.due_tick(schedule, now, last)
                if tick is not None:
                    self._fire(key, trig, tick)
                    last = tick
                fired[key] = last
                wake = min(wake, contract.next_tick(schedule, now))
            self._fired = fired
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=max(wake - time.time(), 0.05))

    def _fire(self, key: Key, trig: TriggerRecord, tick: float) -> None:
        running = self._running.get(key)
        if running is not None and not running.done() and not contract.CRON_OVERLAP:
            log.info("cron %s/%s: tick %s skipped, the previous firing still runs", trig.namespace, trig.spec.name,
                     contract.scheduled_at(tick))
            self.platform.cron_skipped(trig, tick)
            return
        task = asyncio.create_task(self._run(trig, tick))
        self._running[key] = task
        task.add_done_callback(lambda t: self._running.pop(key, None) if self._running.get(key) is t else None)

    async def _run(self, trig: TriggerRecord, tick: float) -> None:
        try:
            message = await self.platform.fire_cron(trig, tick)
        except Exception:  # one failed firing must not stop the schedule
            log.exception("cron %s/%s: the firing failed", trig.namespace, trig.spec.name)
            return
        log.info("cron %s/%s fired (%s): %s", trig.namespace, trig.spec.name, contract.scheduled_at(tick), message)
