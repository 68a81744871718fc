"""The event dispatcher on Kubernetes: triggers from the API's watches, calls through the invoker.

This is the Kubernetes backend's side of the dispatcher; the dispatcher itself sees two callables and
a store, exactly as in `sless up` (:mod:`sless_api.services.events.inprocess`).

- Trigger source: the same list-and-watch of Functions and Triggers that feeds the invoke proxy's
  route table (a :class:`~sless_api.backends.kube.router.KubeRouter` of its own, no whole backend).
  :class:`EventTable` is that route table plus the event
  triggers: each watch event updates both, and when the set of consumable triggers changes the
  dispatcher is told at once (no polling; its periodic resync is only a safety net).
- A trigger is consumed while it is an enabled ``event`` trigger with a queue and its Function is
  deployed, by the same rule as an http route (``FunctionView.deployed``: Ready, or rebuilding /
  failed to rebuild while the Deployment still serves an earlier image). Otherwise its messages wait
  in the queue. Two event triggers of one namespace on one queue (possible with kubectl, which skips
  the API's check) would split the messages: only the first by name is consumed.
- Invoke: ``POST /`` to the function's Service through :class:`~sless_api.gateway.invoker.Invoker` (as the
  proxy and cron do), recorded in the invocation log with trigger ``event``.
- Report: the Trigger's status gets ``lastFiredAt`` and ``dispatcher`` (what the consumer does), by
  a merge patch of the status subresource; the operator owns ``message`` and ``conditions``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sless_api.backends.kube.client import KubeClient
from sless_api.backends.kube.router import KubeRouter
from sless_api.backends.kube.routes import (
    FUNCTIONS,
    TRIGGERS,
    FunctionView,
    RouteTable,
    concurrency,
    function_view,
    in_scope,
    view_of,
)
from sless_api.backends.settings import KubeSettings
from sless_api.domain.changes import ChangeListeners
from sless_api.domain.ports import CallInvoker
from sless_api.domain.records import iso
from sless_api.services.events.call import call_function
from sless_api.services.events.config import EventsConfig
from sless_api.services.events.dedup import DedupStore
from sless_api.services.events.dispatcher import Dispatcher
from sless_api.services.events.model import CallResult, EventTarget
from sless_core import crd
from sless_core.crcodec import InvalidResource, TriggerResource, key_of
from sless_core.models import Delivery, TriggerType

log = logging.getLogger("sless.events.kube")
Key = tuple[str, str]
#: A busy trigger's status is patched at most this often (every patch is a watch event for every
#: watcher of Triggers: the API replicas, the operator, the dispatcher replicas).
ACTIVE_REPORT_SEC = 15.0


@dataclass(frozen=True)
class EventTriggerView:
    function: str
    queue: str
    enabled: bool
    at_least_once: bool = False


def event_trigger_view(obj: dict[str, Any]) -> EventTriggerView | None:
    """The parts of a Trigger object the dispatcher needs; None when it is not a (valid) event trigger."""
    try:
        spec = TriggerResource.from_cr(obj).spec
    except InvalidResource:
        return None
    if spec.type != TriggerType.EVENT:
        return None
    return EventTriggerView(function=spec.function, queue=spec.queue or "", enabled=spec.enabled,
                            at_least_once=spec.delivery == Delivery.AT_LEAST_ONCE)


class EventTable(RouteTable):
    """The route table, plus the event triggers and the functions they call.

    The watcher threads call :meth:`apply` and :meth:`replace`; after each, the consumable targets
    are recomputed (event triggers are few) and the subscribed listeners (a
    :class:`~sless_api.domain.ports.ChangeFeed`) run when they differ, on the watcher thread.
    """

    def __init__(self) -> None:
        super().__init__()
        self._listeners = ChangeListeners()  # a watcher thread survives a failing listener: it logs it
        self._event_lock = threading.Lock()
        self._fns: dict[Key, FunctionView] = {}
        self._events: dict[Key, EventTriggerView] = {}
        self._targets: dict[Key, EventTarget] = {}
        #: (namespace, trigger) -> why it is not consumed although enabled (a queue taken by another)
        self.blocked: dict[Key, str] = {}

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        super().apply(kind, event, obj)
        key = key_of(obj)
        if key is None:
            return
        with self._event_lock:
            self._event_apply(kind, event, key, obj)
            changed = self._recompute_targets()
        if changed:
            self._notify()

    def replace(self, kind: str, objects: Iterable[dict[str, Any]], namespace: str | None = None) -> None:
        """A (re)list, read once (a page at a time, as ``RouteTable.replace``) into both tables' views."""
        routed: dict[Key, Any] = {}
        own: dict[Key, Any] = {}
        for key, obj in in_scope(objects, namespace):
            routed[key] = view_of(kind, obj)
            mine = routed[key] if kind == FUNCTIONS else event_trigger_view(obj)
            if mine is not None:
                own[key] = mine
        self.replace_views(kind, routed, namespace)
        with self._event_lock:
            store: dict[Key, Any] = self._fns if kind == FUNCTIONS else self._events
            for key in [k for k in store if namespace is None or k[0] == namespace]:
                del store[key]
            store.update(own)
            changed = self._recompute_targets()
        if changed:
            self._notify()

    def targets(self) -> list[EventTarget]:
        with self._event_lock:
            return [self._targets[k] for k in sorted(self._targets)]

    def _event_apply(self, kind: str, event: str, key: Key, obj: dict[str, Any]) -> None:
        if kind == FUNCTIONS:
            if event == "DELETED":
                self._fns.pop(key, None)
            else:
                self._fns[key] = function_view(obj)
        elif kind == TRIGGERS:
            view = None if event == "DELETED" else event_trigger_view(obj)
            if view is None:
                self._events.pop(key, None)
            else:
                self._events[key] = view

    def _recompute_targets(self) -> bool:
        targets: dict[Key, EventTarget] = {}
        blocked: dict[Key, str] = {}
        taken: dict[tuple[str, str], str] = {}  # (namespace, queue) -> trigger
        for (ns, name), view in sorted(self._events.items()):
            if not view.enabled or not view.queue:
                continue
            owner = taken.get((ns, view.queue))
            if owner is not None:
                blocked[(ns, name)] = (f"queue {view.queue!r} is already consumed by trigger {owner!r}; "
                                       "bind another queue to your exchange for a second consumer")
                continue
            fn = self._fns.get((ns, view.function))
            if fn is None or not fn.deployed:
                continue
            taken[(ns, view.queue)] = name
            targets[(ns, name)] = EventTarget(ns, name, view.function, view.queue, fn.timeout_sec,
                                              view.at_least_once, concurrency(fn)[0])
        changed = targets != self._targets or blocked != self.blocked
        self._targets, self.blocked = targets, blocked
        return changed

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        return self._listeners.subscribe(listener)

    def _notify(self) -> None:
        self._listeners.notify()


def event_router(kube: KubeClient, settings: KubeSettings) -> tuple[KubeRouter, EventTable]:
    """A router whose watches feed an :class:`EventTable`: one watch serves the calls and the triggers."""
    table = EventTable()
    return KubeRouter(kube, settings, table, reporter_kind="events"), table


class KubeEvents:
    """The dispatcher wired to a router and the :class:`EventTable` its watches feed (:func:`event_router`)."""

    def __init__(self, router: KubeRouter, table: EventTable, invoker: CallInvoker, events_config: EventsConfig,
                 store: DedupStore, max_body_bytes: int) -> None:
        self.router = router
        self.invoker = invoker
        self.table = table
        self._unsubscribe = table.subscribe(self._changed)
        self.dispatcher = Dispatcher(events_config, self.targets, self.invoke, store, self.report,
                                     max_body_bytes=max_body_bytes)
        self.replica = socket.gethostname()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_active: dict[Key, float] = {}
        self._pending: dict[Key, str] = {}  # the latest activity report not yet written, per trigger
        self._flushing: set[Key] = set()
        self._reported_blocked: dict[Key, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.router.start()
        self.dispatcher.start()

    async def close(self) -> None:
        """Stop consuming and let calls in flight finish (the dispatcher's drain), then stop watching."""
        self._unsubscribe()
        await self.dispatcher.close()
        flushes = [self._flush_active(key) for key in list(self._pending)]  # the last counters, now
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*flushes), timeout=10)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.router.close()

    def synced(self) -> bool:
        """Whether the watches have listed Functions and Triggers (the trigger list is complete)."""
        return self.router.loaded()

    def _changed(self) -> None:
        """On a watcher thread: wake the dispatcher on the event loop."""
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closing
            loop.call_soon_threadsafe(self.dispatcher.refresh)

    # the dispatcher's callables

    async def targets(self) -> list[EventTarget]:
        targets = self.table.targets()
        blocked = dict(self.table.blocked)
        for key, why in blocked.items():
            if self._reported_blocked.get(key) != why:
                log.warning("event trigger %s/%s not consumed: %s", *key, why)
                self._spawn(self._patch_status(key, {"dispatcher": self._note(f"not consuming: {why}")}))
        self._reported_blocked = blocked
        current = {t.key for t in targets}
        for gone in [k for k in self._last_active if k not in current and k not in self._pending]:
            del self._last_active[gone]  # a trigger that stopped: forget its throttle
        return targets

    async def invoke(self, target: EventTarget, body: bytes, attempt: int) -> CallResult:
        """One call through the same path as HTTP and cron, recorded with trigger type ``event``."""
        return await call_function(self.router, self.invoker, target, body, attempt)

    async def report(self, target: EventTarget, message: str, active: bool) -> None:
        """Consumer state changes are written at once; activity (counters, ``lastFiredAt``) at most every
        ``ACTIVE_REPORT_SEC`` per trigger, the latest one written when the interval ends."""
        key = target.key
        if not active:
            await self._patch_status(key, {"dispatcher": self._note(message)})
            return
        self._pending[key] = message
        last = self._last_active.get(key)
        wait = 0.0 if last is None else last + ACTIVE_REPORT_SEC - time.monotonic()
        if wait <= 0:
            await self._flush_active(key)
        elif key not in self._flushing:
            self._flushing.add(key)
            self._spawn(self._flush_later(key, wait))

    async def _flush_later(self, key: Key, wait: float) -> None:
        try:
            await asyncio.sleep(wait)
            await self._flush_active(key)
        finally:
            self._flushing.discard(key)

    async def _flush_active(self, key: Key) -> None:
        message = self._pending.pop(key, None)
        if message is None:
            return
        self._last_active[key] = time.monotonic()
        await self._patch_status(key, {"dispatcher": self._note(message), "lastFiredAt": iso(time.time())})

    # trigger status

    def _note(self, message: str) -> dict[str, str]:
        return {"message": message[:1000], "replica": self.replica, "updatedAt": iso(time.time()) or ""}

    async def _patch_status(self, key: Key, status: dict[str, Any]) -> None:
        kube = self.router.kube
        ns, name = key
        try:
            await kube.call(f"trigger {name!r}", kube.custom.patch_namespaced_custom_object_status,
                            crd.GROUP, crd.VERSION, ns, crd.TRIGGER_PLURAL, name, {"status": status})
        except Exception as exc:  # a deleted trigger, a refused write: the status is a courtesy
            log.info("could not update the status of trigger %s/%s: %s", ns, name, exc)

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
