"""Which function Services have a ready pod, mirrored from their EndpointSlices by a list-and-watch.

The activator asks this on every call to a scaled function, so it is a dict read. A function at zero
replicas has no ready endpoint; a call to it waits in :meth:`ReadyEndpoints.wait_ready` until the
EndpointSlice controller reports one (the watch thread wakes the waiting calls on their event loops), so
a call is forwarded the moment Kubernetes itself says a pod is ready, not after a polling interval.

Only the slices of the operator's function Services are watched (their label selector): the Service's
labels are copied onto its slices, and ``kubernetes.io/service-name`` names the Service.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from typing import Any

from sless_core import crd

PLURAL = "endpointslices"
GROUP, VERSION = "discovery.k8s.io", "v1"
SERVICE_LABEL = "kubernetes.io/service-name"
#: the operator's function Services (and a split's), whose slices carry the same labels
SELECTOR = f"{crd.LABEL_MANAGED}={crd.MANAGED_BY},{crd.LABEL_COMPONENT}=function"

Key = tuple[str, str]  # (namespace, Service name)
PORT_NAME, DEFAULT_PORT = "http", 8080  # the function Service's port, by the name the container gives it


def ready_addresses(obj: dict[str, Any]) -> tuple[str, ...]:
    """The ``host:port`` of a slice's endpoints that are ready and not terminating (IPv6 in brackets)."""
    port = next((p.get("port") for p in obj.get("ports") or () if p.get("name") == PORT_NAME), None)
    port = port if isinstance(port, int) and 0 < port < 65536 else DEFAULT_PORT
    found: list[str] = []
    for endpoint in obj.get("endpoints") or ():
        conditions = endpoint.get("conditions") or {}
        if conditions.get("ready") is True and conditions.get("terminating") is not True:
            found.extend(f"[{a}]:{port}" if ":" in str(a) else f"{a}:{port}" for a in endpoint.get("addresses") or ())
    return tuple(found)


def _slice_key(obj: dict[str, Any]) -> tuple[Key, str] | None:
    """((namespace, Service), slice name) of a slice; None for one that names no Service."""
    meta = obj.get("metadata") or {}
    ns, name, service = meta.get("namespace"), meta.get("name"), (meta.get("labels") or {}).get(SERVICE_LABEL)
    if not (isinstance(ns, str) and isinstance(name, str) and isinstance(service, str)):
        return None
    return (ns, service), name


class ReadyEndpoints:
    """Ready endpoint addresses per function Service, and the calls waiting for the first one.

    Fed from watch threads (``replace``, ``apply``); read and awaited from the event loop(s).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slices: dict[Key, dict[str, tuple[str, ...]]] = {}
        self._waiters: dict[Key, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}
        self.changes = 0
        #: called (on the watch's thread) with each Service whose slices changed: the activator's slot waiters
        self.listeners: list[Callable[[Key], None]] = []

    # fed by the watch
    def replace(self, kind: str, objects: Iterable[dict[str, Any]], namespace: str | None = None) -> None:
        fresh: dict[Key, dict[str, tuple[str, ...]]] = {}
        for obj in objects:
            found = _slice_key(obj)
            if found is not None:
                fresh.setdefault(found[0], {})[found[1]] = ready_addresses(obj)
        with self._lock:
            self.changes += 1
            for key in [k for k in self._slices if namespace is None or k[0] == namespace]:
                if key not in fresh:
                    del self._slices[key]
            self._slices.update(fresh)
            woken = [key for key in fresh if self._ready(key)]
        for key in woken:
            self._wake(key)
        for key in fresh:
            self._changed(key)

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        found = _slice_key(obj)
        if found is None:
            return
        key, name = found
        with self._lock:
            self.changes += 1
            slices = self._slices.setdefault(key, {})
            if event == "DELETED":
                slices.pop(name, None)
                if not slices:
                    del self._slices[key]
            else:
                slices[name] = ready_addresses(obj)
            ready = self._ready(key)
        if ready:
            self._wake(key)
        self._changed(key)

    # read by the activator
    def addresses(self, namespace: str, service: str) -> tuple[str, ...]:
        slices = self._slices.get((namespace, service))
        if not slices:
            return ()
        return tuple(a for addresses in list(slices.values()) for a in addresses)

    def has_ready(self, namespace: str, service: str) -> bool:
        with self._lock:
            return self._ready((namespace, service))

    async def wait_ready(self, namespace: str, service: str, timeout: float) -> bool:
        """Wait until the Service has a ready endpoint; False when TIMEOUT passed first."""
        key = (namespace, service)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._ready(key):
                return True
            self._waiters.setdefault(key, []).append((loop, future))
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
            return True
        except TimeoutError:
            return self.has_ready(namespace, service)
        finally:
            with self._lock:
                waiting = self._waiters.get(key, [])
                if (loop, future) in waiting:
                    waiting.remove((loop, future))
                if not waiting:
                    self._waiters.pop(key, None)

    def waiting(self) -> int:
        with self._lock:
            return sum(len(w) for w in self._waiters.values())

    # inside
    def _ready(self, key: Key) -> bool:
        return any(self._slices.get(key, {}).values())

    def _changed(self, key: Key) -> None:
        for listener in self.listeners:
            listener(key)

    def _wake(self, key: Key) -> None:
        with self._lock:
            waiting = self._waiters.pop(key, [])
        for loop, future in waiting:
            loop.call_soon_threadsafe(_resolve, future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
