"""In-process cron for the standalone backend.

Each enabled cron trigger gets its next fire time from croniter; one asyncio task sleeps until the
earliest and fires due triggers concurrently, so a slow function never delays another trigger's tick.
A tick missed while `sless up` was down is not replayed (like a CronJob with no startingDeadlineSeconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from datetime import UTC, datetime

from croniter import croniter

from sless_api.platform import PlatformError, TriggerRecord
from sless_api.proxy import Invoker
from sless_api.standalone.platform import StandalonePlatform

log = logging.getLogger("sless.cron")


class CronScheduler:
    def __init__(self, platform: StandalonePlatform, invoker: Invoker) -> None:
        self.platform = platform
        self.invoker = invoker
        self._next: dict[tuple[str, str, str], float] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self.platform.cron = self
        self._task = asyncio.create_task(self._loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, *self._inflight, return_exceptions=True)

    def refresh(self) -> None:
        """Called on any trigger change: recompute on the loop's next turn."""
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            now = time.time()
            planned: dict[tuple[str, str, str], float] = {}
            for trig in self.platform.cron_triggers():
                schedule = trig.spec.schedule or ""
                key = (trig.namespace, trig.spec.name, schedule)
                due = self._next.get(key) or _next_after(schedule, now)
                if due <= now:
                    task = asyncio.create_task(self._fire(trig, due))
                    self._inflight.add(task)
                    task.add_done_callback(self._inflight.discard)
                    due = _next_after(schedule, now)
                planned[key] = due
            self._next = planned
            delay = min([t - now for t in planned.values()] + [30.0])
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=max(delay, 0.05))

    async def _fire(self, trig: TriggerRecord, due_at: float) -> None:
        event = {"trigger": trig.spec.name, "type": "cron", "schedule": trig.spec.schedule,
                 "scheduled_at": datetime.fromtimestamp(due_at, UTC).isoformat()}
        try:
            route = await self.platform.cron_route(trig.namespace, trig.spec.function)
            result = await self.invoker.call(route, "POST", "/", [("Content-Type", "application/json")],
                                             json.dumps(event).encode(), trigger="cron")
            message = f"last run: HTTP {result.status}"
            if result.error:
                message += f": {result.error[:300]}"
        except PlatformError as exc:
            message = f"last run failed: {exc.message}"
        log.info("cron %s/%s fired: %s", trig.namespace, trig.spec.name, message)
        self.platform.mark_fired(trig, message)


def _next_after(schedule: str, now: float) -> float:
    value: float = croniter(schedule, datetime.fromtimestamp(now, UTC)).get_next(float)
    return value
