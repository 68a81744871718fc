"""The activator: a call to a scaled function with no ready pod waits for one instead of failing.

A Function with ``scale`` may sit at zero replicas (KEDA scaled it down after ``idle_sec`` without calls).
A call to it then:

1. counts as demand at once: the :class:`Demand` sink (the scaler's reporter) hears that a call waits, and
   pushes it to KEDA, which scales the Deployment from zero without waiting for its next poll;
2. waits in a bounded per-function queue (``SLESS_ACTIVATION_QUEUE`` calls per API process; more are refused
   with 503 and ``Retry-After`` at once) until the function's EndpointSlices report a ready pod
   (``kube.endpoints``), at most ``SLESS_ACTIVATION_TIMEOUT_SEC`` (then 503 with ``Retry-After``);
3. is forwarded, and recorded as cold with the activation time as its start phase.

Every call (waiting or not) counts as in flight for its function while it lasts: that is the metric KEDA
scales on (``target`` calls in flight per pod). Async calls, event triggers and cron firings go through the
same upstream (``Invoker.request``), so any of them wakes a function at zero.

When the EndpointSlice watch has not listed a namespace (not yet, or the API may not read slices), calls are
forwarded as before: the activator never holds a call on knowledge it lacks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from sless_api.backends.kube.endpoints import ReadyEndpoints
from sless_api.domain.errors import NotActivated
from sless_api.domain.routing import Route
from sless_api.gateway import calltiming

Key = tuple[str, str]
#: The ``Retry-After`` of a call refused at zero: about a pod's start on a warm node.
RETRY_AFTER_SEC = 5


class Demand(Protocol):
    """Where the activator reports demand (in flight and waiting calls per function)."""

    def call_started(self, namespace: str, function: str) -> None: ...

    def call_ended(self, namespace: str, function: str) -> None: ...

    def waiting_started(self, namespace: str, function: str) -> None: ...

    def waiting_ended(self, namespace: str, function: str) -> None: ...


class Activator:
    """Holds calls to scaled functions at zero until a pod is ready, and counts every call as demand."""

    def __init__(self, endpoints: ReadyEndpoints, synced: Callable[[str], bool], timeout_sec: float,
                 queue: int, demand: Demand | None = None) -> None:
        self.endpoints = endpoints
        self.synced = synced
        self.timeout_sec = timeout_sec
        self.queue = queue
        self.demand = demand
        self.waiting: dict[Key, int] = {}

    def upstream(self, route: Route, service: str, url: str) -> ActivatedUpstream:
        return ActivatedUpstream(self, route, service, url)

    async def activate(self, route: Route, service: str) -> None:
        """Wait for SERVICE's first ready pod (the caller found none); raises NotActivated when it cannot."""
        ns, name = route.namespace, route.function
        key = (ns, name)
        held = self.waiting.get(key, 0)
        if held >= self.queue:
            raise NotActivated(f"function {name!r} is starting from zero and {held} calls already wait for it; "
                               "try again", retry_after=RETRY_AFTER_SEC)
        self.waiting[key] = held + 1
        if self.demand is not None:
            self.demand.waiting_started(ns, name)
        began = time.monotonic()
        try:
            ready = await self.endpoints.wait_ready(ns, service, self.timeout_sec)
        finally:
            left = self.waiting.get(key, 1) - 1
            if left > 0:
                self.waiting[key] = left
            else:
                self.waiting.pop(key, None)
            if self.demand is not None:
                self.demand.waiting_ended(ns, name)
        if not ready:
            raise NotActivated(f"function {name!r} has no ready pod {self.timeout_sec:g}s after this call woke it "
                               "(it is still starting, or cannot start: see its status)", retry_after=RETRY_AFTER_SEC)
        calltiming.note_start(time.monotonic() - began)


class ActivatedUpstream:
    """One call's upstream: counted in flight while it lasts, activated first when its function is at zero.

    A class, not a generator-based context manager: every proxied call enters one (see ``gateway.invoker``).
    """

    __slots__ = ("_activator", "_counted", "_route", "_service", "_url")

    def __init__(self, activator: Activator, route: Route, service: str, url: str) -> None:
        self._activator, self._route, self._service, self._url = activator, route, service, url
        self._counted = False

    async def __aenter__(self) -> str:
        activator, route = self._activator, self._route
        demand = activator.demand
        if demand is not None:
            demand.call_started(route.namespace, route.function)
            self._counted = True
        try:
            if (route.scaled and not activator.endpoints.has_ready(route.namespace, self._service)
                    and activator.synced(route.namespace)):
                await activator.activate(route, self._service)
        except BaseException:
            self._end()
            raise
        return self._url

    async def __aexit__(self, *exc: Any) -> None:
        self._end()

    def _end(self) -> None:
        if self._counted:
            self._counted = False
            demand = self._activator.demand
            assert demand is not None
            demand.call_ended(self._route.namespace, self._route.function)
