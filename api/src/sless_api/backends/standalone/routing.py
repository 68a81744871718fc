"""Routing of the standalone backend: which functions the proxy may call, and their supervised processes.

Routes live in memory, so the proxy never touches SQLite per call. :meth:`StandaloneRouter.sync` makes
the route table and the supervisor agree with the state of one function after any change (a build, a
trigger, a secret); trigger changes are announced to the listeners (cron, the event dispatcher).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Collection
from typing import Any

from sless_api.backends.settings import PlatformSettings
from sless_api.backends.standalone.builder import BuildArtifact
from sless_api.backends.standalone.failures import start_failure
from sless_api.backends.standalone.host.pool import Scale
from sless_api.backends.standalone.host.sandbox import Limits, Sandbox
from sless_api.backends.standalone.host.spares import SPARE_RUNTIMES, SpareTemplate
from sless_api.backends.standalone.host.supervisor import (
    Busy,
    Lease,
    LimitExceeded,
    NotDeployed,
    ProcessSpec,
    StartFailed,
    Supervisor,
)
from sless_api.backends.standalone.state import StateStore, artifact_from_dict
from sless_api.domain.changes import ChangeListeners
from sless_api.domain.errors import NotFound, Unavailable
from sless_api.domain.httppaths import HttpRule, route_rules
from sless_api.domain.records import FunctionRecord
from sless_api.domain.routing import Route, RouteSplit
from sless_api.domain.versions import Version, function_config, number_of
from sless_api.gateway.admission import Throttled
from sless_api.stores.secrets.store import SecretStore
from sless_api.stores.secrets.usage import Delivery, deliver
from sless_core.models import FunctionSpec, Phase, TriggerType

log = logging.getLogger("sless.standalone")


def process_key(namespace: str, name: str) -> str:
    """The supervisor's (and the call logs') key of a function."""
    return f"{namespace}.{name}"


def current_version(state: StateStore, rec: FunctionRecord) -> int:
    """The number of the version REC serves (what its calls, runs and events are recorded with); it depends on the
    newest recorded version alone, so only that row is read (every event call asks)."""
    newest = state.newest_version(rec.namespace, rec.spec.name)
    return number_of([newest] if newest else [], rec.code_hash or "", function_config(rec.spec))


def split_key(namespace: str, name: str, version: int) -> str:
    """The key of a traffic split's other version (no function's key: names have no dots)."""
    return f"{process_key(namespace, name)}.v{version}"


class StandaloneRouter:
    """The :class:`~sless_api.domain.ports.Router` and :class:`~sless_api.domain.ports.ChangeFeed` of `sless up`."""

    def __init__(self, config: PlatformSettings, state: StateStore, supervisor: Supervisor, secrets: SecretStore,
                 sandbox: Sandbox) -> None:
        self.config = config
        self.state = state
        self.supervisor = supervisor
        self.secrets = secrets
        self.sandbox = sandbox
        self._routes: dict[tuple[str, str], Route] = {}
        self._split_keys: dict[tuple[str, str], str] = {}  # (ns, name) -> the key of its split's other version
        #: (ns, name) -> (the state's generation it was read at, its route, record and artifact): an event storm
        #: reads the function's three rows once, not per event.
        self._event_routes: dict[tuple[str, str], tuple[int, Route, FunctionRecord, dict[str, Any]]] = {}
        self._listeners = ChangeListeners()

    # the change feed
    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        return self._listeners.subscribe(listener)

    def changed(self) -> None:
        """Triggers (or the functions they call) changed: the listeners recompute."""
        self._listeners.notify()

    # processes
    async def process_spec(self, rec: FunctionRecord, artifact: BuildArtifact) -> ProcessSpec:
        """The server process of REC; its version covers code, spec and the secrets' revisions, so a
        written secret restarts the functions using it (new values are read only at start)."""
        secrets: Delivery = await deliver(self.secrets, rec.namespace, rec.spec.name, rec.spec.secrets)
        argv, env = artifact.server_command()
        env = {**env, **rec.spec.env_vars, **secrets.env, "SLESS_HOST": "127.0.0.1", "PYTHONDONTWRITEBYTECODE": "1",
               "SLESS_TIMEOUT_SEC": str(rec.spec.timeout_sec),
               "SLESS_MAX_BODY_BYTES": str(self.config.max_body_bytes)}
        # max_concurrency is the proxy's alone, scale the supervisor's: changing either restarts nothing
        process_spec = {k: v for k, v in rec.spec.to_dict().items() if k not in ("max_concurrency", "scale")}
        version = hashlib.sha256(json.dumps([rec.code_hash, process_spec, secrets.version],
                                            sort_keys=True).encode())
        limits = Limits.for_function(rec.spec.memory_mb, rec.spec.runtime, host=self.config.sandbox)
        jail = dataclasses.replace(artifact.jail(rec.namespace, limits), files=secrets.files)
        return ProcessSpec(argv=list(argv), env=env, cwd=artifact.code_dir, version=version.hexdigest()[:16],
                           drain_sec=float(rec.spec.timeout_sec) + self.config.proxy_timeout_margin_sec,
                           sandbox=self.sandbox, jail=jail, runtime=rec.spec.runtime,
                           spare=self._spare_template(rec, artifact, argv, limits),
                           **self._scaling(rec.spec))

    @staticmethod
    def _scaling(spec: FunctionSpec) -> dict[str, Any]:
        """What the supervisor honours of ``scale``: ``idle_sec`` as the function's own idle timeout, ``min``
        processes kept warm (``keep_warm``: at least one), and with ``max`` > 1 up to ``max`` processes balanced
        by calls in flight against ``target`` (host/pool.py). A scaled function's ``max_concurrency`` is per
        process, as it is per pod on Kubernetes."""
        if spec.scale is None:
            return {}
        scale = Scale(min=spec.scale.min, max=spec.scale.max, target=spec.scale.target, limit=spec.max_concurrency)
        return {"idle_sec": float(spec.scale.idle_sec), "keep_warm": spec.scale.min >= 1, "scale": scale}

    @staticmethod
    def function_limit(spec: FunctionSpec) -> int:
        """The proxy's limit of calls in flight for the whole function: its ``max_concurrency``, times ``scale.max``
        for a scaled one (whose limit is per process, each process below it being the supervisor's to keep)."""
        if spec.scale is None:
            return spec.max_concurrency
        return spec.max_concurrency * spec.scale.max

    def _spare_template(self, rec: FunctionRecord, artifact: BuildArtifact, argv: list[str],
                        limits: Limits) -> SpareTemplate | None:
        """The warm spares a Python or Node function may start from (spares.py): its tenant's code folder and its
        dependency folder read-only, and the platform's variables only (never the function's own or its secrets)."""
        if (not self.config.warm_spares or rec.spec.runtime not in SPARE_RUNTIMES or not self.sandbox.enabled
                or self.sandbox.cgroups is None):
            return None
        roots = [self.config.data_dir / "functions" / rec.namespace]
        # The spare sees the tenant's folder, not just this version's: the folders on the way must be
        # traversable by the tenant's uid (they are, 0755, unless the platform ran with a strict umask).
        if not all(d.is_relative_to(roots[0]) and d.stat().st_mode & 0o001
                   for d in (roots[0], artifact.code_dir.parent)):
            return None
        if artifact.deps_dir is not None:
            roots.append(artifact.deps_dir)
        base = {k: v for k, v in artifact.environment().items() if not k.startswith("SLESS_")}
        base["PYTHONDONTWRITEBYTECODE"] = "1"
        return SpareTemplate(tenant=rec.namespace, argv=tuple(argv), env=tuple(sorted(base.items())),
                             roots=tuple(roots), limits=limits, runtime=rec.spec.runtime)

    async def sync(self, namespace: str, name: str) -> None:
        """Make the supervisor and the route table agree with the state of one function.

        A running process of an older version is replaced (new one healthy first, then the switch);
        otherwise the process starts on the first call.
        """
        rec = self.state.get_function(namespace, name)
        key = process_key(namespace, name)
        http = [t for t in self.state.list_triggers(namespace, name) if t.spec.type == TriggerType.HTTP
                and t.spec.enabled]
        artifact = self.state.get_artifact(namespace, name) if rec else None
        if rec is None or not http or artifact is None:
            self._routes.pop((namespace, name), None)
            await self.supervisor.remove(key)
            await self._remove_split(namespace, name)
            return
        auth, policy, paths = route_rules(HttpRule(t.spec.path, t.spec.auth, t.spec.methods, t.spec.cors)
                                          for t in http)
        history = self.state.list_versions(namespace, name)
        current = number_of(history, rec.code_hash or "", function_config(rec.spec))
        route = Route(namespace, name, float(rec.spec.timeout_sec), auth, self.function_limit(rec.spec), current,
                      policy=policy, paths=paths)
        await self.supervisor.deploy(key, await self.process_spec(rec, artifact_from_dict(artifact)))
        self._routes[(namespace, name)] = await self._split_route(rec, route, history)

    async def _split_route(self, rec: FunctionRecord, route: Route, history: list[Version]) -> Route:
        """ROUTE, or under a traffic split a route that shares calls between it and the split's other version,
        whose process (``<key>.v<N>``) runs beside the current one; a process of a dropped split is removed."""
        namespace, name = rec.namespace, rec.spec.name
        found = self.state.get_traffic(namespace, name)
        other = found[0].other_than(route.version or 0) if found is not None else None
        version = next((v for v in history if other is not None and v.version == other.version), None)
        artifact = found[1] if found is not None else None
        wanted = split_key(namespace, name, other.version) if other is not None and version and artifact else None
        old = self._split_keys.pop((namespace, name), None)
        if old is not None and old != wanted:
            await self.supervisor.remove(old)
        if found is None or other is None or version is None or artifact is None or wanted is None:
            return route
        self._split_keys[(namespace, name)] = wanted
        other_rec = dataclasses.replace(rec, spec=FunctionSpec.from_dict({**version.config, "name": name}),
                                        code_hash=version.code_hash)
        await self.supervisor.deploy(wanted, await self.process_spec(other_rec, artifact_from_dict(artifact)))
        other_route = dataclasses.replace(route, version=other.version, target=wanted,
                                          timeout_sec=float(other_rec.spec.timeout_sec))
        weights = {e.version: e.weight for e in found[0].entries}
        return dataclasses.replace(route, split=RouteSplit([(route, weights.get(route.version or 0, 0)),
                                                            (other_route, other.weight)]))

    async def forget(self, namespace: str, name: str) -> None:
        """A deleted function: no route, no process; the listeners hear its triggers went with it."""
        self._routes.pop((namespace, name), None)
        self._event_routes.pop((namespace, name), None)
        self.changed()
        await self.supervisor.remove(process_key(namespace, name))
        await self._remove_split(namespace, name)

    async def drop_split(self, namespace: str, name: str) -> None:
        """The split was dropped (a deploy began): every call goes to the current process at once."""
        route = self._routes.get((namespace, name))
        if route is not None and route.split is not None:
            self._routes[(namespace, name)] = dataclasses.replace(route, split=None)
        await self._remove_split(namespace, name)

    async def _remove_split(self, namespace: str, name: str) -> None:
        old = self._split_keys.pop((namespace, name), None)
        if old is not None:
            await self.supervisor.remove(old)

    def split_process(self, namespace: str, name: str) -> str | None:
        """The supervisor's key of the split's other version while one runs (its calls' output is there)."""
        return self._split_keys.get((namespace, name))

    def process_state(self, key: str) -> str:
        try:
            return str(self.supervisor.status(key)["state"])
        except NotDeployed:
            return "absent"

    # the Router
    async def route(self, namespace: str, name: str) -> Route:
        route = self._routes.get((namespace, name))
        if route is not None:
            return route
        rec = self.state.get_function(namespace, name)
        if rec is None:
            raise NotFound(f"function {name!r} not found in {namespace}")
        if rec.phase != Phase.READY:
            raise NotFound(f"function {name!r} is not ready (phase {rec.phase})")
        raise NotFound(f"function {name!r} has no enabled http trigger")

    async def event_route(self, namespace: str, name: str) -> Route:
        """Event triggers call a Ready function whether or not it has an http trigger."""
        generation = self.state.generation()  # before reading: a write during the read makes the entry stale
        cached = self._event_routes.get((namespace, name))
        if cached is not None and cached[0] == generation:
            _, route, rec, artifact = cached
        else:
            found = self.state.get_function(namespace, name)
            if found is None:
                raise NotFound(f"function {name!r} not found")
            rec = found
            stored = self.state.get_artifact(namespace, name)
            if rec.phase != Phase.READY or stored is None:
                raise Unavailable(f"function {name!r} is not ready (phase {rec.phase})")
            artifact = stored
            route = Route(namespace, name, float(rec.spec.timeout_sec), "public",
                          version=current_version(self.state, rec))
            self._event_routes[(namespace, name)] = (generation, route, rec, artifact)
        key = process_key(namespace, name)
        if self.process_state(key) == "absent":
            await self.supervisor.deploy(key, await self.process_spec(rec, artifact_from_dict(artifact)))
        return route

    def upstream(self, route: Route) -> _Upstream:
        return _Upstream(self.supervisor.lease(route.target or process_key(route.namespace, route.function)), route)

    def loaded(self) -> bool:
        """Always: the routes come from the state store at start, before the API serves anything."""
        return True


class _Upstream:
    """``StandaloneRouter.upstream``: the process's lease, its failures as the platform's errors. A class rather
    than a generator-based context manager, since every proxied call enters it."""

    __slots__ = ("lease", "route")

    def __init__(self, lease: Lease, route: Route) -> None:
        self.lease = lease
        self.route = route

    async def __aenter__(self) -> str:
        try:
            return await self.lease.__aenter__()
        except (NotDeployed, StartFailed, LimitExceeded) as exc:
            raise self._platform_error(exc) from exc
        except Busy as exc:
            raise Throttled(f"function {self.route.function!r} is busy: {str(exc).split(': ', 1)[-1]}",
                            exc.retry_after) from exc

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            await self.lease.__aexit__(kind, exc, tb)
        except (NotDeployed, StartFailed, LimitExceeded) as error:
            raise self._platform_error(error) from error
        if isinstance(exc, NotDeployed | StartFailed | LimitExceeded):  # from the call itself, as before
            raise self._platform_error(exc) from exc

    def elsewhere(self, refused: Collection[str]) -> str | None:
        """Another process of the function for a call whose process refused the connection (``Lease.elsewhere``);
        the proxy's ``Exchange`` asks before it tries the same address again."""
        return self.lease.elsewhere(refused)

    def _platform_error(self, exc: Exception) -> Exception:
        route = self.route
        if isinstance(exc, NotDeployed):
            return NotFound(f"function {route.function!r} is not deployed")
        if isinstance(exc, StartFailed):
            log.warning("function %s/%s failed to start: %s", route.namespace, route.function, exc)
            return Unavailable(f"function {route.function!r} {start_failure(str(exc))}")
        return Unavailable(f"function {route.function!r} was {str(exc).split(': ', 1)[-1]}")
