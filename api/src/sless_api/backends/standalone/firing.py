"""How the standalone backend's triggers fire: the hooks its cron scheduler and event dispatcher call.

The scheduler (:mod:`sless_api.services.cron`) and the dispatcher (:mod:`sless_api.services.events.inprocess`) import no
backend; this is the backend's side of them: which triggers to serve, how a cron tick runs, where each
trigger's status (message, last fired) is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sless_api.backends.standalone.oneshot import OneShot
from sless_api.backends.standalone.routing import StandaloneRouter, current_version
from sless_api.backends.standalone.state import StateStore
from sless_api.domain.records import TriggerRecord
from sless_api.services.events.model import EventTarget
from sless_core import contract
from sless_core.models import Delivery, Phase, TriggerType


class TriggerFiring:
    """A :class:`~sless_api.services.cron.CronSource` and an
    :class:`~sless_api.services.events.inprocess.EventSource`."""

    def __init__(self, state: StateStore, router: StandaloneRouter, oneshot: OneShot) -> None:
        self.state = state
        self.router = router
        self.oneshot = oneshot

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        return self.router.subscribe(listener)

    def _note_trigger(self, trigger: TriggerRecord, message: str, fired_at: float | None = None) -> None:
        current = self.state.get_trigger(trigger.namespace, trigger.spec.name)
        if current is not None and current.spec.function == trigger.spec.function:
            current.message = message
            if fired_at is not None:
                current.last_fired_at = fired_at
            self.state.save_trigger(current)

    # cron
    def cron_triggers(self) -> list[TriggerRecord]:
        return [t for t in self.state.list_triggers() if t.spec.type == TriggerType.CRON and t.spec.enabled]

    def cron_skipped(self, trigger: TriggerRecord, tick: float) -> None:
        """A tick of TRIGGER came while its previous firing still ran: not fired (firings never overlap)."""
        self._note_trigger(trigger, f"skipped the tick of {contract.scheduled_at(tick)}: the previous firing "
                                    "still runs")

    async def fire_cron(self, trigger: TriggerRecord, tick: float) -> str:
        """Fire TICK of TRIGGER: the function's runner with the cron event, as on Kubernetes (a CronJob's
        runner pod), recorded as an invocation with trigger ``cron``; the trigger's message says how it went."""
        namespace, name = trigger.namespace, trigger.spec.name
        self._note_trigger(trigger, f"firing the tick of {contract.scheduled_at(tick)}", fired_at=time.time())
        event = contract.cron_event(name, trigger.spec.schedule or "", tick)
        fn = self.state.get_function(namespace, trigger.spec.function)
        artifact = self.state.get_artifact(namespace, trigger.spec.function) if fn is not None else None
        if fn is None or fn.phase != Phase.READY or artifact is None:
            phase = fn.phase if fn is not None else "deleted"
            message = f"last run failed: function {trigger.spec.function!r} is not ready (phase {phase})"
        else:
            started = time.monotonic()
            result = await self.oneshot.run(namespace, fn, artifact, event, trigger="cron")
            self.oneshot.record(namespace, fn.spec.name, f"/triggers/{name}", "cron", event, result, started,
                                current_version(self.state, fn))
            message = "last run: succeeded" if result.ok else f"last run failed: {result.output[-300:]}"
        self._note_trigger(trigger, message)
        return message

    # events
    def event_targets(self) -> list[EventTarget]:
        """Enabled event triggers whose function is Ready: others keep their messages queued."""
        state = self.state
        out = []
        for trig in state.list_triggers():
            if trig.spec.type != TriggerType.EVENT or not trig.spec.enabled or not trig.spec.queue:
                continue
            fn = state.get_function(trig.namespace, trig.spec.function)
            if fn is None or fn.phase != Phase.READY or state.get_artifact(trig.namespace, fn.spec.name) is None:
                continue
            out.append(EventTarget(trig.namespace, trig.spec.name, fn.spec.name, trig.spec.queue,
                                   float(fn.spec.timeout_sec), trig.spec.delivery == Delivery.AT_LEAST_ONCE,
                                   StandaloneRouter.function_limit(fn.spec)))
        return out

    def event_report(self, target: EventTarget, message: str, active: bool) -> None:
        rec = self.state.get_trigger(target.namespace, target.trigger)
        if rec is None or rec.spec.type != TriggerType.EVENT:
            return
        rec.message = message
        if active:
            rec.last_fired_at = time.time()
        self.state.save_trigger(rec)
