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
had closed).

Per pod: a scaled function's ``max_concurrency`` is the calls one pod takes at once (``Route.pod_concurrency``,
as Knative's containerConcurrency), counted by this process: with endpoint routing a call goes only to a pod below
it, else (Service routing) the function may have ``max_concurrency`` x its ready pods in flight. A call that finds
every pod full waits, counted as waiting demand (so KEDA scales out for it), until a call ends or a pod becomes
ready, within the activation timeout and queue (then 429 with ``Retry-After``). With N API processes a pod may
take up to N x ``max_concurrency`` calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any, Protocol

from sless_api.backends.kube.endpoints import ReadyEndpoints
from sless_api.domain.errors import NotActivated
from sless_api.domain.routing import Route
from sless_api.gateway import calltiming
from sless_api.gateway.admission import Throttled

Key = tuple[str, str]
#: The ``Retry-After`` of a call refused at zero: about a pod's start on a warm node.
RETRY_AFTER_SEC = 5
#: The ``Retry-After`` of a call refused because every pod had its max_concurrency in flight.
FULL_RETRY_AFTER_SEC = 1


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
        #: calls this process has in flight per pod address (endpoint routing) or Service URL (Service routing)
        self.in_flight: dict[str, int] = {}
        self._turn: dict[Key, int] = {}
        self._slot_waiters: dict[Key, list[asyncio.Future[None]]] = {}  # per (namespace, Service)
        self._loop: asyncio.AbstractEventLoop | None = None
        endpoints.listeners.append(self._slices_changed)

    def pick(self, namespace: str, service: str, limit: int = 0, avoid: Collection[str] = ()) -> str | None:
        """The ready pod address with the fewest calls in flight from here (ties: in turn), below LIMIT calls when
        LIMIT > 0 and not in AVOID; None: no such pod known."""
        found = self.endpoints.addresses(namespace, service)
        if avoid:
            found = tuple(address for address in found if address not in avoid)
        if len(found) == 1 and limit <= 0:
            return found[0]
        key = (namespace, service)
        start = self._turn.get(key, 0) % max(1, len(found))
        best, fewest = None, 0
        for i in range(len(found)):
            candidate = found[(start + i) % len(found)]
            busy = self.in_flight.get(candidate, 0)
            if (limit <= 0 or busy < limit) and (best is None or busy < fewest):
                best, fewest = candidate, busy
        if best is not None:
            self._turn[key] = start + 1
        return best

    def service_has_room(self, namespace: str, service: str, url: str, limit: int) -> bool:
        """Service routing: whether the function has fewer than LIMIT x its ready pods (at least 1) in flight."""
        return self.in_flight.get(url, 0) < limit * max(1, len(self.endpoints.addresses(namespace, service)))

    async def wait_for_slot(self, route: Route, service: str, has_room: Callable[[], bool], deadline: float) -> None:
        """Wait until HAS_ROOM (a call ended, a pod became ready), counted as waiting demand; 429 at DEADLINE or
        when the function's queue is full."""
        ns, name = route.namespace, route.function
        slot_key = (ns, service)
        limit = route.pod_concurrency
        full = (f"{name} has its max_concurrency of {limit} calls in flight on each of its "
                f"{len(self.endpoints.addresses(ns, service))} ready pods")
        with self._held(route, lambda held: Throttled(f"{full}, and {held} calls already wait", FULL_RETRY_AFTER_SEC)):
            while not has_room():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Throttled(f"{full} (waited {self.timeout_sec:g}s for one)", FULL_RETRY_AFTER_SEC)
                future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._slot_waiters.setdefault(slot_key, []).append(future)
                try:
                    await asyncio.wait_for(future, remaining)
                except TimeoutError:
                    pass
                finally:
                    waiters = self._slot_waiters.get(slot_key, [])
                    if future in waiters:
                        waiters.remove(future)
                    if not waiters:
                        self._slot_waiters.pop(slot_key, None)

    @contextlib.contextmanager
    def _held(self, route: Route, refusal: Callable[[int], Exception]) -> Iterator[None]:
        """A call held for its function (waiting for a first pod or a slot): bounded by the queue (else REFUSAL of
        the number already held), counted as waiting demand for as long as it is held."""
        ns, name = route.namespace, route.function
        key = (ns, name)
        held = self.waiting.get(key, 0)
        if held >= self.queue:
            raise refusal(held)
        self.waiting[key] = held + 1
        if self.demand is not None:
            self.demand.waiting_started(ns, name)
        try:
            yield
        finally:
            left = self.waiting.get(key, 1) - 1
            if left > 0:
                self.waiting[key] = left
            else:
                self.waiting.pop(key, None)
            if self.demand is not None:
                self.demand.waiting_ended(ns, name)

    def released(self, slot_key: Key) -> None:
        """A call of SLOT_KEY's Service ended: the first call waiting for a slot looks again."""
        for future in self._slot_waiters.get(slot_key, []):
            if not future.done():
                future.set_result(None)
                return

    def _slices_changed(self, slot_key: Key) -> None:
        """(Watch thread.) SLOT_KEY's pods changed: every call waiting for a slot there looks again."""
        loop = self._loop
        if loop is not None and slot_key in self._slot_waiters:
            loop.call_soon_threadsafe(self._wake_all, slot_key)

    def _wake_all(self, slot_key: Key) -> None:
        for future in self._slot_waiters.get(slot_key, []):
            if not future.done():
                future.set_result(None)

    def upstream(self, route: Route, service: str, url: str) -> ActivatedUpstream:
        return ActivatedUpstream(self, route, service, url)

    async def activate(self, route: Route, service: str) -> None:
        """Wait for SERVICE's first ready pod (the caller found none); raises NotActivated when it cannot."""
        name = route.function

        def refusal(held: int) -> Exception:
            return NotActivated(f"function {name!r} is starting from zero and {held} calls already wait for it; "
                                "try again", retry_after=RETRY_AFTER_SEC)

        began = time.monotonic()
        with self._held(route, refusal):
            ready = await self.endpoints.wait_ready(route.namespace, service, self.timeout_sec)
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
        if activator._loop is None:
            activator._loop = asyncio.get_running_loop()
        demand = activator.demand
        if demand is not None:
            demand.call_started(route.namespace, route.function)
            self._counted = True
        if not (route.scaled or activator.direct or route.pod_concurrency > 0):
            return self._url  # a fixed function through its Service: nothing to wait for or to pick
        try:
            began = time.monotonic()
            synced = activator.synced(route.namespace)
            if route.scaled and synced and not activator.endpoints.has_ready(route.namespace, self._service):
                await activator.activate(route, self._service)
            if activator.direct and synced:
                address = await self._pick(began)
                if address is not None:
                    return self._hold(address, f"http://{address}")
            if route.pod_concurrency > 0 and synced:
                limit, ns, service, url = route.pod_concurrency, route.namespace, self._service, self._url
                if not activator.service_has_room(ns, service, url, limit):
                    await activator.wait_for_slot(route, service,
                                                  lambda: activator.service_has_room(ns, service, url, limit),
                                                  began + activator.timeout_sec)  # fmt: skip
                return self._hold(self._url, self._url)
        except BaseException:
            self._end()
            raise
        return self._url

    async def _pick(self, began: float) -> str | None:
        """Endpoint routing: a ready pod with room (waiting for one when the function has a per-pod limit)."""
        activator, route = self._activator, self._route
        ns, service, limit = route.namespace, self._service, route.pod_concurrency
        address = activator.pick(ns, service, limit)
        if address is None and limit > 0 and activator.endpoints.has_ready(ns, service):
            found: list[str] = []

            def room() -> bool:
                chosen = activator.pick(ns, service, limit)
                if chosen is not None:
                    found.append(chosen)
                return chosen is not None

            await activator.wait_for_slot(route, service, room, began + activator.timeout_sec)
            address = found[-1]
        return address

    def _hold(self, address: str, url: str) -> str:
        self._address = address
        in_flight = self._activator.in_flight
        in_flight[address] = in_flight.get(address, 0) + 1
        return url

    def elsewhere(self, refused: Collection[str]) -> str | None:
        """Another pod for this call, whose pod's URL (the last of REFUSED, base URLs) refused the connection:
        nothing listens there any more (its process crashed, or it was killed before its endpoint left the
        slices), so trying it again only waits. The call's hold moves to a ready pod not in REFUSED (with room,
        when the function has a per-pod limit); None when the call was not routed to a pod (Service routing)
        or no other pod is ready, and the caller tries the same address again as before."""
        address, activator, route = self._address, self._activator, self._route
        if address is None or address == self._url or not activator.direct:
            return None
        avoid = {url.removeprefix("http://") for url in refused}
        other = activator.pick(route.namespace, self._service, route.pod_concurrency, avoid=avoid)
        if other is None:
            return None
        self._release()
        return self._hold(other, f"http://{other}")

    async def __aexit__(self, *exc: Any) -> None:
        self._end()

    def _release(self) -> None:
        """Give back the call's place on its pod (or Service), waking a call that waits for one."""
        address = self._address
        if address is not None:
            self._address = None
            in_flight = self._activator.in_flight
            left = in_flight.get(address, 1) - 1
            if left > 0:
                in_flight[address] = left
            else:
                in_flight.pop(address, None)
            self._activator.released((self._route.namespace, self._service))

    def _end(self) -> None:
        self._release()
        if self._counted:
            self._counted = False
            demand = self._activator.demand
            assert demand is not None
            demand.call_ended(self._route.namespace, self._route.function)
