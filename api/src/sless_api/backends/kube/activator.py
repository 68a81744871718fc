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

Balancing (``SLESS_KUBE_ROUTING=endpoints``): each call goes straight to one ready pod, the one with the fewest
calls in flight from this process (ties in turn), instead of the Service's virtual IP. A new pod takes calls
the moment its endpoint is ready, and a leaving pod none from the moment its endpoint is terminating, without
waiting for kube-proxy's next sync on the node (which, late on a busy node, sent calls to a pod whose listener
had closed). ``max_concurrency`` stays per function and process; ``scale.target`` is per pod.
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
                 queue: int, demand: Demand | None = None, direct: bool = False) -> None:
        self.endpoints = endpoints
        self.synced = synced
        self.timeout_sec = timeout_sec
        self.queue = queue
        self.demand = demand
        self.direct = direct
        self.waiting: dict[Key, int] = {}
        self.in_flight: dict[str, int] = {}  # calls this process has in flight per pod address
        self._turn: dict[Key, int] = {}

    def pick(self, namespace: str, service: str) -> str | None:
        """The ready pod address with the fewest calls in flight from here (ties: in turn); None: none known."""
        found = self.endpoints.addresses(namespace, service)
        if len(found) <= 1:
            return found[0] if found else None
        key = (namespace, service)
        start = self._turn.get(key, 0) % len(found)
        best, fewest = found[start], self.in_flight.get(found[start], 0)
        for i in range(1, len(found)):
            candidate = found[(start + i) % len(found)]
            busy = self.in_flight.get(candidate, 0)
            if busy < fewest:
                best, fewest = candidate, busy
        self._turn[key] = start + 1
        return best

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

    __slots__ = ("_activator", "_address", "_counted", "_route", "_service", "_url")

    def __init__(self, activator: Activator, route: Route, service: str, url: str) -> None:
        self._activator, self._route, self._service, self._url = activator, route, service, url
        self._counted = False
        self._address: str | None = None

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
        if activator.direct and activator.synced(route.namespace):
            address = activator.pick(route.namespace, self._service)
            if address is not None:
                self._address = address
                activator.in_flight[address] = activator.in_flight.get(address, 0) + 1
                return f"http://{address}"
        return self._url

    async def __aexit__(self, *exc: Any) -> None:
        self._end()

    def _end(self) -> None:
        address = self._address
        if address is not None:
            self._address = None
            in_flight = self._activator.in_flight
            left = in_flight.get(address, 1) - 1
            if left > 0:
                in_flight[address] = left
            else:
                in_flight.pop(address, None)
        if self._counted:
            self._counted = False
            demand = self._activator.demand
            assert demand is not None
            demand.call_ended(self._route.namespace, self._route.function)
