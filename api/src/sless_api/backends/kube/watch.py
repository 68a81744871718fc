"""List-and-watch of Functions and Triggers into the route table, in background threads.

One thread per (resource, scope). The resources are the platform's custom resources (Functions
and Triggers, into the route table) or, for the activator, the EndpointSlices of function
Services (into ``kube.endpoints``): any object list served at ``/apis/<group>/<version>/<plural>``.
Each lists (paged) to replace its part of the table, then watches from the list's resourceVersion
with bookmarks; a watch that ends normally is renewed from the last version seen, a 410 Gone
(history compacted) relists at once, and any other failure (API server down, connection cut)
backs off exponentially and relists. The client's read timeout exceeds the server-side watch
timeout, so a silently dead connection is noticed too.

Scope: one cluster-wide watch per resource. When the API's credentials may not list them
cluster-wide (403), the watch falls back to one watch per tenant namespace: those found by the
tenant label (if namespaces may be listed) and those the API itself touches.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from sless_api.backends.kube.client import CONNECT_TIMEOUT_SEC, KubeClient
from sless_api.backends.kube.routes import FUNCTIONS, TRIGGERS
from sless_core import crd

log = logging.getLogger("sless.kube.watch")
LIST_PAGE = 500
BACKOFF_MIN_SEC, BACKOFF_MAX_SEC = 0.5, 30.0
DISCOVERY_INTERVAL_SEC = 30.0
DENIED_RETRY_SEC = 300.0


@dataclass(frozen=True)
class Resource:
    """One list-and-watch target: ``/apis/GROUP/VERSION/PLURAL``, narrowed by a label selector ("": all)."""

    plural: str
    group: str = crd.GROUP
    version: str = crd.VERSION
    label_selector: str = ""


class MirrorTable(Protocol):
    """What a watcher feeds: a (re)list's result, then each watch event."""

    def replace(self, kind: str, objects: Iterable[dict[str, Any]], namespace: str | None = None) -> None: ...

    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None: ...


PLATFORM_RESOURCES = (Resource(FUNCTIONS), Resource(TRIGGERS))


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): relist."""


class Forbidden(Exception):
    """The credentials may not list/watch in this scope."""


class Backoff:
    """Exponential delays between failed attempts, reset by a success."""

    def __init__(self, low: float = BACKOFF_MIN_SEC, high: float = BACKOFF_MAX_SEC) -> None:
        self.low, self.high = low, high
        self.current = low

    def next(self) -> float:
        delay = self.current
        self.current = min(self.high, self.current * 2)
        return delay

    def reset(self) -> None:
        self.current = self.low


def iter_lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Newline-separated records of a chunked stream, whatever the chunk boundaries."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from (line for line in lines if line.strip())
    if pending.strip():
        yield pending


class _ListExpired(Exception):
    """A paged list's continue token expired (410) between two pages: the list starts over."""


@dataclass
class _Listing:
    """What a paged list learns at its end: the resourceVersion its watch continues from."""

    version: str = ""


class Watcher(threading.Thread):
    """Keeps one resource of one scope (a namespace, or the whole cluster) mirrored in the table."""

    def __init__(self, kube: KubeClient, table: MirrorTable, resource: Resource | str, namespace: str | None,
                 stop: threading.Event, on_forbidden: Callable[[Watcher, str], None] | None = None) -> None:
        resource = Resource(resource) if isinstance(resource, str) else resource
        scope = namespace or "cluster"
        super().__init__(name=f"sless-watch-{resource.plural}-{scope}", daemon=True)
        self.kube = kube
        self.table = table
        self.resource = resource
        self.plural = resource.plural
        self.namespace = namespace
        self.stop_event = stop
        self.on_forbidden = on_forbidden
        self.api = k8s.CustomObjectsApi(kube.new_api_client())
        self.listed = threading.Event()
        self.requests = 0  # list and watch requests sent, for tests and metrics
        self.relists = 0
        self._response: Any = None
        self._lock = threading.Lock()

    # the loop
    def run(self) -> None:
        try:
            self._loop()
        finally:
            self.api.api_client.close()

    def _loop(self) -> None:
        backoff = Backoff()
        while not self.stop_event.is_set():
            try:
                version = self._list()
                backoff.reset()
                while not self.stop_event.is_set():
                    version = self._watch(version)
            except Gone:
                log.info("watch of %s (%s) expired: relisting", self.plural, self.namespace or "cluster")
            except Forbidden as exc:
                if self.on_forbidden is not None:
                    self.on_forbidden(self, str(exc))
                    return
                self.stop_event.wait(backoff.next())
            except Exception as exc:
                if self.stop_event.is_set():
                    break
                delay = backoff.next()
                log.warning("watch of %s (%s) failed: %s: %s; retrying in %.1fs", self.plural,
                            self.namespace or "cluster", type(exc).__name__, exc, delay)
                self.stop_event.wait(delay)

    def stop(self) -> None:
        """Unblock a watch waiting for the next event (the caller has set the stop event)."""
        with self._lock:
            response = self._response
        if response is not None:
            try:
                response.shutdown()
            except Exception:  # closing a socket another thread reads may race; the thread exits anyway
                log.debug("shutting down the watch response failed", exc_info=True)

    # list and watch
    def _call_args(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        group, version = self.resource.group, self.resource.version
        if self.namespace is None:
            return self.api.list_cluster_custom_object, (group, version, self.plural)
        return self.api.list_namespaced_custom_object, (group, version, self.namespace, self.plural)

    def _selector(self) -> dict[str, str]:
        return {"label_selector": self.resource.label_selector} if self.resource.label_selector else {}

    def _list(self) -> str:
        """List into the table, handing it the pages as they arrive (never the whole list at once: a table reduces
        each object to what it keeps before the next page is read), and return the list's resourceVersion."""
        while True:
            listing = _Listing()
            try:
                self.table.replace(self.plural, self._pages(listing), self.namespace)
            except _ListExpired:
                continue  # the continue token expired midway: list again from the start (the table is unchanged)
            break
        self.relists += 1
        self.listed.set()
        return listing.version

    def _pages(self, listing: _Listing) -> Iterator[dict[str, Any]]:
        """The listed objects, LIST_PAGE per request; ``listing.version`` is set once the last page is in."""
        fn, args = self._call_args()
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": LIST_PAGE, **self._selector(),
                                      "_request_timeout": (CONNECT_TIMEOUT_SEC, self.kube.settings.request_timeout_sec)}
            if token:
                kwargs["_continue"] = token
            self.requests += 1
            try:
                page = fn(*args, **kwargs)
            except ApiException as exc:
                if exc.status == 403:
                    raise Forbidden(exc.reason) from exc
                if exc.status == 410 and token:
                    raise _ListExpired() from exc
                raise
            meta = page.get("metadata") or {}
            items = page.get("items") or []
            del page  # only this page's objects stay referenced while the table reads them
            yield from items
            token = meta.get("continue") or None
            if not token:
                listing.version = str(meta.get("resourceVersion") or "")
                return

    def _watch(self, version: str) -> str:
        fn, args = self._call_args()
        timeout = self.kube.settings.watch_timeout_sec
        self.requests += 1
        try:
            response = fn(*args, watch=True, resource_version=version, allow_watch_bookmarks=True, **self._selector(),
                          timeout_seconds=int(timeout), _preload_content=False,
                          _request_timeout=(CONNECT_TIMEOUT_SEC, timeout + 30))
        except ApiException as exc:
            if exc.status == 410:
                raise Gone() from exc
            if exc.status == 403:
                raise Forbidden(exc.reason) from exc
            raise
        with self._lock:
            self._response = response
        try:
            if self.stop_event.is_set():
                return version
            for line in iter_lines(response.stream(amt=None, decode_content=True)):
                version = self._event(json.loads(line), version)
                if self.stop_event.is_set():
                    break
        finally:
            with self._lock:
                self._response = None
            response.release_conn()
        return version

    def _event(self, event: dict[str, Any], version: str) -> str:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
        new_version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self.table.apply(self.plural, str(kind), obj)
        return new_version


class RouteWatch:
    """The watchers behind one route table: cluster-wide, or per tenant namespace when that is refused.

    In per-namespace mode a namespace whose resources may not be read either is left alone (and
    tried again after ``DENIED_RETRY_SEC``): it is some other tenant's, not served by these credentials.
    """

    def __init__(self, kube: KubeClient, table: MirrorTable,
                 resources: tuple[Resource, ...] = PLATFORM_RESOURCES) -> None:
        self.kube = kube
        self.table = table
        self.resources = {r.plural: r for r in resources}
        self.stop_event = threading.Event()
        self._lock = threading.Lock()
        self.watchers: dict[tuple[str, str | None], Watcher] = {}
        self.per_namespace: set[str] = set()  # resources watched per namespace (cluster-wide was refused)
        self._namespaces: set[str] = set()
        self._denied: dict[tuple[str, str], float] = {}  # (plural, namespace) -> when it was refused
        self._discovery: threading.Thread | None = None
        self._discovered = threading.Event()  # the tenant namespaces were looked for once (per-namespace mode)

    def start(self) -> None:
        for plural in self.resources:
            self._spawn(plural, None)

    def synced(self, namespace: str) -> bool:
        """Whether the table holds NAMESPACE's state (its watches have listed), so a miss is a real miss."""
        with self._lock:
            for plural in self.resources:
                per_namespace = plural in self.per_namespace
                watcher = self.watchers.get((plural, namespace if per_namespace else None))
                if watcher is None and not per_namespace:
                    return False  # not started yet
                if watcher is not None and not watcher.listed.is_set():
                    return False
        return True

    def loaded(self) -> bool:
        """Whether the table holds the platform's whole state: every resource listed cluster-wide, or, where it
        is watched per tenant namespace, the tenant namespaces looked for once and each found one listed (those
        these credentials may not read are left out, as ``synced`` leaves them). Until then a replica knows only
        part of the functions, and its ``/ready`` says so rather than answer 404 for the rest."""
        with self._lock:
            for plural in self.resources:
                if plural in self.per_namespace:
                    if not self._discovered.is_set():
                        return False
                    if any(not w.listed.is_set() for (p, _), w in self.watchers.items() if p == plural):
                        return False
                else:
                    watcher = self.watchers.get((plural, None))
                    if watcher is None or not watcher.listed.is_set():
                        return False
        return True

    def listed(self, namespace: str) -> bool:
        """Whether every resource of NAMESPACE has been listed by a watcher that covers it: unlike ``synced``,
        a namespace whose resources may not be read is not listed (nothing is known of it)."""
        with self._lock:
            for plural in self.resources:
                watcher = self.watchers.get((plural, None)) or self.watchers.get((plural, namespace))
                if watcher is None or not watcher.listed.is_set():
                    return False
        return True

    def add_namespace(self, namespace: str) -> None:
        """A tenant namespace the API has touched; watched on its own in per-namespace mode."""
        with self._lock:
            if namespace in self._namespaces:
                return
            self._namespaces.add(namespace)
            plurals = set(self.per_namespace)
        for plural in plurals:
            self._spawn(plural, namespace)

    def requests(self) -> int:
        with self._lock:
            return sum(w.requests for w in self.watchers.values())

    def stop(self, timeout: float = 5.0) -> None:
        self.stop_event.set()
        with self._lock:
            watchers = list(self.watchers.values())
        for watcher in watchers:
            watcher.stop()
        deadline = time.monotonic() + timeout
        for watcher in watchers:
            watcher.join(max(0.0, deadline - time.monotonic()))

    def _spawn(self, plural: str, namespace: str | None) -> None:
        with self._lock:
            if self.stop_event.is_set() or (plural, namespace) in self.watchers:
                return
            if namespace is not None:
                denied = self._denied.get((plural, namespace))
                if denied is not None and time.monotonic() - denied < DENIED_RETRY_SEC:
                    return
                self._denied.pop((plural, namespace), None)
            watcher = Watcher(self.kube, self.table, self.resources[plural], namespace, self.stop_event,
                              self._forbidden)
            self.watchers[(plural, namespace)] = watcher
        watcher.start()

    def _forbidden(self, watcher: Watcher, reason: str) -> None:
        plural, namespace = watcher.plural, watcher.namespace
        with self._lock:
            self.watchers.pop((plural, namespace), None)
            if namespace is not None:
                self._denied[(plural, namespace)] = time.monotonic()
                log.info("may not watch %s in %s (%s): not served by these credentials", plural, namespace, reason)
                return
            first = not self.per_namespace
            self.per_namespace.add(plural)
            known = set(self._namespaces)
        log.warning("may not watch %s cluster-wide (%s): watching per tenant namespace", plural, reason)
        for ns in known:
            self._spawn(plural, ns)
        if first:
            self._discovery = threading.Thread(target=self._discover, name="sless-watch-namespaces", daemon=True)
            self._discovery.start()

    def _discover(self) -> None:
        """Find tenant namespaces by label now and then (other API replicas create them too)."""
        while not self.stop_event.is_set():
            try:
                found = self.kube.call_sync("namespaces", self.kube.core.list_namespace,
                                            label_selector=crd.TENANT_SELECTOR)
                for item in found.items:
                    self.add_namespace(item.metadata.name)
            except Exception as exc:
                log.info("cannot list tenant namespaces (%s): watching only those this API touches", exc)
            with self._lock:
                wanted = [(p, ns) for p in self.per_namespace for ns in self._namespaces]
            for plural, ns in wanted:
                self._spawn(plural, ns)  # retries namespaces refused long enough ago
            self._discovered.set()
            self.stop_event.wait(DISCOVERY_INTERVAL_SEC)
