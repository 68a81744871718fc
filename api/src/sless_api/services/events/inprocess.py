"""The event dispatcher inside the API process (`sless up`): triggers from a backend's event source, calls
through the invoker.

It imports no backend: the backend hands over an :class:`EventSource` (which triggers to consume, where
to report) and a router (where a call goes); the dispatcher itself sees two callables and a store.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from sless_api.domain.ports import CallInvoker, ChangeFeed, Router
from sless_api.services.events.call import call_function
from sless_api.services.events.config import EventsConfig
from sless_api.services.events.dedup import SqliteDedupStore
from sless_api.services.events.dispatcher import Dispatcher
from sless_api.services.events.model import CallResult, EventTarget

#: Function phase changes (a build finishing) have no hook: the trigger list is re-read this often.
RESYNC_SEC = 2.0


class EventSource(ChangeFeed, Protocol):
    """A backend's event triggers, as the dispatcher consumes and reports them."""

    def event_targets(self) -> list[EventTarget]:
        """Enabled event triggers whose function is Ready: others keep their messages queued."""
        ...

    def event_report(self, target: EventTarget, message: str, active: bool) -> None:
        """What the consumer of TARGET does now (ACTIVE: it just handled a message)."""
        ...


class InProcessEvents:
    def __init__(self, source: EventSource, router: Router, invoker: CallInvoker, events_config: EventsConfig,
                 state_db: Path, max_body_bytes: int) -> None:
        self.source = source
        self.router = router
        self.invoker = invoker
        self.store = SqliteDedupStore(state_db)
        self.dispatcher = Dispatcher(dataclasses.replace(events_config, resync_sec=RESYNC_SEC),
                                     self.targets, self.invoke, self.store, self.report,
                                     max_body_bytes=max_body_bytes)
        self._unsubscribe: Callable[[], None] | None = None

    async def start(self) -> None:
        self._unsubscribe = self.source.subscribe(self.refresh)
        self.dispatcher.start()

    def refresh(self) -> None:
        self.dispatcher.refresh()

    async def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        await self.dispatcher.close()
        self.store.close()

    async def targets(self) -> list[EventTarget]:
        return self.source.event_targets()

    async def invoke(self, target: EventTarget, body: bytes, attempt: int) -> CallResult:
        """One call through the same path as HTTP and cron, recorded with trigger type ``event``."""
        return await call_function(self.router, self.invoker, target, body, attempt)

    async def report(self, target: EventTarget, message: str, active: bool) -> None:
        self.source.event_report(target, message, active)
