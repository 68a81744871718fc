"""The invoke proxy's route table: which functions may be called, kept in memory from watch events.

The proxy asks :meth:`RouteTable.lookup` on every call, so it must be a dict read, never an API
server round trip. The watchers (``kube.watch``) feed Function and Trigger objects in; each change
recomputes the routes of the one function it touches.

A function is routable when it has at least one enabled http trigger and a deployed version:
phase Ready, or a rebuild (Building) or a failed rebuild (Failed) while ``status.image`` still
names the version from an earlier build that its Deployment keeps serving. So a code update does
not take a function offline for the length of its build.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sless_api.domain.httppaths import HttpRule, route_rules
from sless_api.domain.routing import Route, RouteSplit
from sless_core.crcodec import FunctionResource, InvalidResource, TriggerResource, key_of
from sless_core.models import TIMEOUT_DEFAULT_SEC, Phase, TriggerType
from sless_core.traffic import other_version_name

Key = tuple[str, str]
FUNCTIONS, TRIGGERS = "functions", "triggers"


@dataclass(frozen=True)
class FunctionView:
    phase: str
    image: str | None
    timeout_sec: float
    max_concurrency: int = 0
    #: why the codec refused the object ("": it is valid)
    invalid: str = ""
    #: the newest recorded version (what the Function's own Deployment serves); None: none recorded yet
    version: int | None = None
    #: a traffic split in effect: ((current, weight), (other, weight, its timeout)) once the operator
    #: reports the other version's pods ready (status.split); None: every call to the current version
    split: tuple[tuple[int, int], tuple[int, int, float]] | None = None
    #: the function has ``scale`` (KEDA may take it to zero): calls to it go through the activator
    scaled: bool = False

    @property
    def deployed(self) -> bool:
        if self.invalid:
            return False
        if self.phase == Phase.READY:
            return True
        return self.phase in (Phase.BUILDING, Phase.FAILED) and bool(self.image)


@dataclass(frozen=True)
class TriggerView:
    function: str
    type: str
    enabled: bool
    auth: str
    methods: tuple[str, ...] | None = None
    cors: dict[str, Any] | None = field(default=None, compare=True, hash=False)
    path: str | None = None


def function_view(obj: dict[str, Any]) -> FunctionView:
    """What the routes need of a Function, decoded by the one codec; an invalid one is never deployed."""
    try:
        fn = FunctionResource.from_cr(obj)
    except InvalidResource as exc:
        return FunctionView(phase=Phase.FAILED, image=None, timeout_sec=float(TIMEOUT_DEFAULT_SEC), invalid=exc.message)
    return FunctionView(phase=str(fn.status.phase or Phase.PENDING), image=fn.status.image or None,
                        timeout_sec=float(fn.spec.timeout_sec), max_concurrency=fn.spec.max_concurrency,
                        version=fn.current_version, split=split_in_effect(fn, obj), scaled=fn.spec.scale is not None)


def concurrency(fn: FunctionView) -> tuple[int, int]:
    """(max_concurrency, pod_concurrency) of a function's route: a scaled function's limit is per pod."""
    return (0, fn.max_concurrency) if fn.scaled else (fn.max_concurrency, 0)


def split_in_effect(fn: FunctionResource, obj: dict[str, Any]) -> tuple[tuple[int, int], tuple[int, int, float]] | None:
    """The split calls follow: ``spec.traffic`` naming the current version, and ``status.split`` saying the
    operator runs its other version and its pods are ready (until then every call goes to the current one)."""
    current = fn.current_version
    if fn.traffic is None or current is None or current not in fn.traffic.versions():
        return None
    other = fn.traffic.other_than(current)
    kept = fn.version(other.version) if other is not None else None
    running = (obj.get("status") or {}).get("split")
    if other is None or kept is None or not isinstance(running, dict):
        return None
    if running.get("version") != other.version or running.get("ready") is not True:
        return None
    weights = {e.version: e.weight for e in fn.traffic.entries}
    return (current, weights[current]), (other.version, other.weight, float(kept.spec.timeout_sec))


def trigger_view(obj: dict[str, Any]) -> TriggerView | None:
    """What the routes need of a Trigger; None for one the codec refuses (it routes nothing)."""
    try:
        spec = TriggerResource.from_cr(obj).spec
    except InvalidResource:
        return None
    return TriggerView(function=spec.function, type=spec.type, enabled=spec.enabled, auth=spec.auth,
                       methods=tuple(spec.methods) if spec.methods is not None else None, cors=spec.cors,
                       path=spec.path)


def view_of(kind: str, obj: dict[str, Any]) -> FunctionView | TriggerView | None:
    """What the route table keeps of a Function or Trigger object (None: a trigger that routes nothing)."""
    return function_view(obj) if kind == FUNCTIONS else trigger_view(obj)


def in_scope(objects: Iterable[dict[str, Any]], namespace: str | None) -> Iterator[tuple[Key, dict[str, Any]]]:
    """``(key, object)`` of each of OBJECTS that has a key and is in NAMESPACE (when given), one at a time."""
    for obj in objects:
        found = key_of(obj)
        if found is not None and (namespace is None or found[0] == namespace):
            yield found, obj


def views_of(kind: str, objects: Iterable[dict[str, Any]], namespace: str | None) -> dict[Key, Any]:
    """The views of OBJECTS of KIND (those in NAMESPACE when given), read one object at a time."""
    return {key: view_of(kind, obj) for key, obj in in_scope(objects, namespace)}


class RouteTable:
    """Functions and triggers as last seen by the watchers, and the routes derived from them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._functions: dict[Key, FunctionView] = {}
        self._triggers: dict[Key, TriggerView] = {}
        self._by_function: dict[Key, set[Key]] = {}  # (ns, function) -> its triggers' keys
        self._routes: dict[Key, Route] = {}
        self.changes = 0  # events applied; a test reads it to see the watch alive

    # reads (the proxy's hot path: plain dict lookups)
    def lookup(self, namespace: str, name: str) -> Route | None:
        return self._routes.get((namespace, name))

    def function(self, namespace: str, name: str) -> FunctionView | None:
        """The function as last seen, routable or not."""
        with self._lock:
            return self._functions.get((namespace, name))

    def explain(self, namespace: str, name: str) -> str:
        """Why a function has no route, from the same in-memory state."""
        fn = self._functions.get((namespace, name))
        if fn is None:
            return f"function {name!r} not found in {namespace}"
        if fn.invalid:
            return f"function {name!r} is invalid: {fn.invalid}"
        if not fn.deployed:
            return f"function {name!r} is not ready (phase {fn.phase})"
        return f"function {name!r} has no enabled http trigger"

    def routes(self) -> dict[Key, Route]:
        return dict(self._routes)

    # writes (the watcher threads)
    def apply(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED or DELETED) of a Function or Trigger."""
        key = key_of(obj)
        if key is None:
            return
        with self._lock:
            self.changes += 1
            touched = self._apply_locked(kind, event, key, obj)
            for fn_key in touched:
                self._recompute(fn_key)

    def replace(self, kind: str, objects: Iterable[dict[str, Any]], namespace: str | None = None) -> None:
        """The result of a (re)list: every object of KIND (in NAMESPACE, or everywhere) is exactly OBJECTS.

        OBJECTS may be a list's pages as they arrive (``watch.Watcher``): each object is reduced to its view
        before the next is read, outside the lock (lookups go on meanwhile), so a relist never holds more than a
        page of whole objects; the table changes in one step at the end, and not at all if reading fails."""
        self.replace_views(kind, views_of(kind, objects, namespace), namespace)

    def replace_views(self, kind: str, fresh: dict[Key, Any], namespace: str | None = None) -> None:
        """``replace`` with the objects already reduced to their views (``views_of``)."""
        with self._lock:
            self.changes += 1
            store: dict[Key, Any] = self._functions if kind == FUNCTIONS else self._triggers
            touched: set[Key] = set()
            for key in [k for k in store if namespace is None or k[0] == namespace]:
                touched |= self._set_locked(kind, key, None)
            for key, view in fresh.items():
                touched |= self._set_locked(kind, key, view)
            for fn_key in touched:
                self._recompute(fn_key)

    def _apply_locked(self, kind: str, event: str, key: Key, obj: dict[str, Any]) -> set[Key]:
        return self._set_locked(kind, key, None if event == "DELETED" else view_of(kind, obj))

    def _set_locked(self, kind: str, key: Key, view: Any) -> set[Key]:
        """KEY's view now VIEW (None: gone); the functions whose route that may change."""
        if kind == FUNCTIONS:
            if view is None:
                self._functions.pop(key, None)
            else:
                self._functions[key] = view
            return {key}
        touched: set[Key] = set()
        old = self._triggers.pop(key, None)
        if old is not None:
            old_fn = (key[0], old.function)
            touched.add(old_fn)
            siblings = self._by_function.get(old_fn)
            if siblings is not None:
                siblings.discard(key)
                if not siblings:
                    del self._by_function[old_fn]
        if view is not None:
            self._triggers[key] = view
            fn_key = (key[0], view.function)
            self._by_function.setdefault(fn_key, set()).add(key)
            touched.add(fn_key)
        return touched

    def _recompute(self, fn_key: Key) -> None:
        ns, name = fn_key
        fn = self._functions.get(fn_key)
        views = (self._triggers[k] for k in self._by_function.get(fn_key, ()))
        http = [t for t in views if t.type == TriggerType.HTTP and t.enabled]
        if fn is None or not fn.deployed or not http:
            self._routes.pop(fn_key, None)
            return
        auth, policy, paths = route_rules(HttpRule(t.path, t.auth, t.methods, t.cors) for t in http)
        max_concurrency, pod_concurrency = concurrency(fn)
        route = Route(ns, name, fn.timeout_sec, auth, max_concurrency, fn.version, scaled=fn.scaled,
                      pod_concurrency=pod_concurrency, policy=policy, paths=paths)
        if fn.split is not None:
            (_, weight), (other, other_weight, timeout) = fn.split
            # a split's other version runs fixed replicas (the operator scales only the function's own Deployment)
            beside = dataclasses.replace(route, version=other, target=other_version_name(name), timeout_sec=timeout,
                                         scaled=False, max_concurrency=fn.max_concurrency, pod_concurrency=0)
            route = dataclasses.replace(route, split=RouteSplit([(route, weight), (beside, other_weight)]))
        self._routes[fn_key] = route
