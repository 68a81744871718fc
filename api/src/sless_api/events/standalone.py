"""The event dispatcher inside `sless up`: triggers from the state database, calls through the invoker.

This is the only module of the package that knows the standalone platform; the dispatcher itself
sees two callables and a store.
"""

from __future__ import annotations

import dataclasses
import time

from sless_api.config import ApiConfig
from sless_api.events.config import EventsConfig
from sless_api.events.dedup import SqliteDedupStore
from sless_api.events.dispatcher import Dispatcher
from sless_api.events.model import CallResult, EventTarget
from sless_api.platform import PlatformError
from sless_api.proxy import Invoker
from sless_api.standalone.platform import StandalonePlatform
from sless_core.models import Phase, TriggerType

#: Function phase changes (a build finishing) have no hook: the trigger list is re-read this often.
RESYNC_SEC = 2.0


class StandaloneEvents:
    def __init__(self, platform: StandalonePlatform, invoker: Invoker, config: ApiConfig) -> None:
        assert config.rabbitmq_url
        self.platform = platform
        self.invoker = invoker
        events_config = EventsConfig.from_env(
            config.rabbitmq_url, max_call_sec=config.max_timeout_sec + config.proxy_timeout_margin_sec)
        self.store = SqliteDedupStore(config.data_dir / "state.db")
        self.dispatcher = Dispatcher(dataclasses.replace(events_config, resync_sec=RESYNC_SEC),
                                     self.targets, self.invoke, self.store, self.report,
                                     max_body_bytes=config.max_body_bytes)

    def start(self) -> None:
        self.platform.events = self
        self.dispatcher.start()

    def refresh(self) -> None:
        self.dispatcher.refresh()

    async def close(self) -> None:
        self.platform.events = None
        await self.dispatcher.close()
        self.store.close()

    async def targets(self) -> list[EventTarget]:
        """Enabled event triggers whose function is Ready: others keep their messages queued."""
        state = self.platform.state
        out = []
        for trig in state.list_triggers():
            if trig.spec.type != TriggerType.EVENT or not trig.spec.enabled or not trig.spec.queue:
                continue
            fn = state.get_function(trig.namespace, trig.spec.function)
            if fn is None or fn.phase != Phase.READY or state.get_artifact(trig.namespace, fn.spec.name) is None:
                continue
            out.append(EventTarget(trig.namespace, trig.spec.name, fn.spec.name, trig.spec.queue,
                                   float(fn.spec.timeout_sec)))
        return out

    async def invoke(self, target: EventTarget, body: bytes) -> CallResult:
        """One call through the same path as HTTP and cron, recorded with trigger type ``event``."""
        try:
            route = await self.platform.event_route(target.namespace, target.function)
        except PlatformError as exc:
            return CallResult(exc.status, exc.message, platform_error=True)
        result = await self.invoker.call(
            route, "POST", "/", [("Content-Type", "application/json"), ("X-Sless-Trigger", target.trigger)],
            body, trigger="event")
        # The invoker sets ``error`` on a 4xx only when the platform answered (not deployed, ...).
        platform_error = 400 <= result.status < 500 and result.error is not None
        return CallResult(result.status, result.error, platform_error=platform_error)

    async def report(self, target: EventTarget, message: str, active: bool) -> None:
        state = self.platform.state
        rec = state.get_trigger(target.namespace, target.trigger)
        if rec is None or rec.spec.type != TriggerType.EVENT:
            return
        rec.message = message
        if active:
            rec.last_fired_at = time.time()
        state.save_trigger(rec)
