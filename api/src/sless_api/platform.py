"""The interfaces between the API and a backend (standalone or Kubernetes).

Two halves, because two kinds of callers need them:

- :class:`FunctionBackend` changes state (functions, versions, triggers, jobs, secrets): the REST
  resources speak only to it, so the same REST surface, validation and error mapping serve both backends.
- :class:`Router` says where a call goes (:meth:`Router.route`, :meth:`Router.event_route`,
  :meth:`Router.upstream`): the invoke proxy, the cron scheduler and the event dispatchers need only
  this (and :class:`ChangeFeed` to hear of trigger changes), so a process that only invokes (the
  Kubernetes event dispatcher) builds a router alone, with no code store and no CRUD.

:class:`Platform` is what the app wires: a backend, its router, and the background services it
hands over (cron, events), which the app starts and stops without knowing which backend it has.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sless_core.models import FunctionSpec, JobSpec, TriggerSpec
from sless_core.traffic import TrafficSplit, WeightedRoundRobin

if TYPE_CHECKING:
    from sless_api.secrets.model import SecretMeta, SecretValues
    from sless_api.versions import Version


class PlatformError(Exception):
    """Base of the errors a backend reports; the API maps each to one status code."""

    status = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class NotFound(PlatformError):
    status = 404


class Conflict(PlatformError):
    status = 409


class Unsupported(PlatformError):
    status = 422


class Unavailable(PlatformError):
    """The function exists but cannot serve now (it failed to start, it is building)."""

    status = 503


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


@dataclass
class FunctionRecord:
    namespace: str
    spec: FunctionSpec
    phase: str = "Pending"
    message: str = "waiting for code: upload a zip"
    code_hash: str | None = None
    image: str | None = None
    created_at: float = field(default_factory=time.time)
    last_built_at: float | None = None

    def to_api(self) -> dict[str, Any]:
        body = self.spec.to_dict()
        body.update(
            namespace=self.namespace,
            phase=self.phase,
            message=self.message,
            code_hash=self.code_hash,
            image=self.image,
            created_at=iso(self.created_at),
            last_built_at=iso(self.last_built_at),
        )
        return body


@dataclass
class TriggerRecord:
    namespace: str
    spec: TriggerSpec
    created_at: float = field(default_factory=time.time)
    last_fired_at: float | None = None
    message: str = ""

    def to_api(self, base_url: str = "") -> dict[str, Any]:
        body = self.spec.to_dict()
        body.update(namespace=self.namespace, created_at=iso(self.created_at),
                    last_fired_at=iso(self.last_fired_at), message=self.message)
        if self.spec.type == "http":
            body["url"] = f"{base_url}/fn/{self.namespace}/{self.spec.function}"
        return body


@dataclass
class JobRecord:
    namespace: str
    spec: JobSpec
    phase: str = "Pending"
    message: str = ""
    started_at: float | None = None
    completed_at: float | None = None
    created_at: float = field(default_factory=time.time)

    def to_api(self) -> dict[str, Any]:
        body = self.spec.to_dict()
        body.update(namespace=self.namespace, phase=self.phase, message=self.message,
                    started_at=iso(self.started_at), completed_at=iso(self.completed_at),
                    created_at=iso(self.created_at))
        return body


@dataclass(frozen=True)
class Route:
    """Where and how the proxy may call a function; resolved without a backend round trip per call."""

    namespace: str
    function: str
    timeout_sec: float
    auth: str  # "public" or "token"
    max_concurrency: int = 0  # the function's own limit of calls in flight through /fn; 0: none
    #: the version that serves calls of this route (recorded with each call); None: not known
    version: int | None = None
    #: the backend's name of the upstream when it is not the function's own (a split's other version)
    target: str = ""
    #: a traffic split: each call takes one of its routes (``served``); None: this route serves every call
    split: RouteSplit | None = field(default=None, compare=False, repr=False)

    def served(self) -> Route:
        """The route one call takes: under a split, the version the round robin picks next."""
        return self if self.split is None else self.split.pick()


class RouteSplit:
    """The routes of a split's versions and the deterministic round robin that shares calls among them."""

    def __init__(self, choices: list[tuple[Route, int]]) -> None:
        self.routes = {route.version: route for route, _ in choices}
        self._robin = WeightedRoundRobin((route.version or 0, weight) for route, weight in choices)

    def pick(self) -> Route:
        return self.routes[self._robin.pick()]


@dataclass(frozen=True)
class CallRef:
    """Which call's output to read: its request id and when it ran (epoch seconds)."""

    request_id: str
    started_at: float
    duration_sec: float


class Router(Protocol):
    """Where and how a call reaches a function; read on every call, so answered from memory."""

    async def route(self, namespace: str, name: str) -> Route:
        """The route of an http call through ``/fn``: NotFound unless an enabled http trigger exposes it."""
        ...

    async def event_route(self, namespace: str, name: str) -> Route:
        """The route of a call a trigger makes (event, cron): any deployed function, http trigger or not."""
        ...

    def upstream(self, route: Route) -> contextlib.AbstractAsyncContextManager[str]:
        """The base URL to send the call to, held for the length of the call."""
        ...


class ChangeFeed(Protocol):
    """Tells listeners (the cron scheduler, an event dispatcher) that triggers or functions changed."""

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call LISTENER after each change; returns what unsubscribes it. The standalone backend calls it on
        the event loop, the Kubernetes event table on a watcher thread (its listener hops to the loop)."""
        ...


class Background(Protocol):
    """A service a backend runs beside the API (cron, an event dispatcher); started after the backend."""

    async def start(self) -> None: ...
    async def close(self) -> None: ...


class CallOutcome(Protocol):
    @property
    def status(self) -> int: ...
    @property
    def error(self) -> str | None: ...


class CallInvoker(Protocol):
    """What a background service calls functions through (the proxy's :class:`~sless_api.proxy.Invoker`), so
    a backend hands out services without importing the proxy."""

    async def call(self, route: Route, method: str, path_qs: str, headers: list[tuple[str, str]], body: bytes,
                   trigger: str) -> CallOutcome: ...


class FunctionBackend(Protocol):
    """What changes state: the REST resources' whole view of a backend."""

    async def ensure_namespace(self, namespace: str) -> bool: ...

    async def list_functions(self, namespace: str) -> list[FunctionRecord]: ...
    async def get_function(self, namespace: str, name: str) -> FunctionRecord: ...
    async def create_function(self, namespace: str, spec: FunctionSpec) -> FunctionRecord: ...
    async def update_function(self, namespace: str, name: str, patch: dict[str, Any]) -> FunctionRecord: ...
    async def delete_function(self, namespace: str, name: str) -> None: ...
    async def upload_code(self, namespace: str, name: str, zip_path: Path, code_hash: str) -> FunctionRecord: ...
    async def get_source(self, namespace: str, name: str) -> list[dict[str, Any]]: ...
    async def list_versions(self, namespace: str, name: str) -> list[Version]: ...
    async def rollback(self, namespace: str, name: str, version: int | None) -> FunctionRecord: ...
    async def get_traffic(self, namespace: str, name: str) -> TrafficSplit | None: ...
    async def set_traffic(self, namespace: str, name: str, split: TrafficSplit) -> TrafficSplit:
        """Share http calls as SPLIT says once this returns; SplitRefused (404/409) when its versions do not fit."""
        ...
    async def clear_traffic(self, namespace: str, name: str) -> bool:
        """Drop the split (every call to the current version again); False when there was none."""
        ...

    async def list_triggers(self, namespace: str) -> list[TriggerRecord]: ...
    async def get_trigger(self, namespace: str, name: str) -> TriggerRecord: ...
    async def create_trigger(self, namespace: str, spec: TriggerSpec) -> TriggerRecord: ...
    async def patch_trigger(self, namespace: str, name: str, patch: dict[str, Any]) -> TriggerRecord: ...
    async def delete_trigger(self, namespace: str, name: str) -> None: ...

    async def list_jobs(self, namespace: str) -> list[JobRecord]: ...
    async def create_job(self, namespace: str, spec: JobSpec) -> JobRecord: ...
    async def get_job(self, namespace: str, name: str) -> JobRecord: ...
    async def rerun_job(self, namespace: str, name: str, run_id: int) -> JobRecord: ...
    async def delete_job(self, namespace: str, name: str) -> None: ...

    async def list_secrets(self, namespace: str) -> list[SecretMeta]: ...
    async def get_secret(self, namespace: str, name: str) -> SecretMeta: ...
    async def create_secret(self, namespace: str, name: str, data: SecretValues) -> SecretMeta: ...
    async def replace_secret(self, namespace: str, name: str, data: SecretValues) -> SecretMeta: ...
    async def delete_secret(self, namespace: str, name: str) -> None: ...

    async def call_logs(self, namespace: str, name: str, call: CallRef) -> dict[str, Any]:
        """``{"lines": [{"stream", "text", "ts"}], "truncated": bool}``: what one call of the function wrote.

        Raises Unsupported/Unavailable (with the reason) where the backend cannot read them back.
        """
        ...


class Platform(FunctionBackend, Protocol):
    """A whole backend as the app wires it: state, routing, lifecycle and background services."""

    @property
    def router(self) -> Router: ...

    async def start(self) -> None: ...
    async def close(self) -> None: ...

    def background_services(self, invoker: CallInvoker) -> list[Background]:
        """The services to run beside the API (none, cron, an event dispatcher), built but not started."""
        ...
