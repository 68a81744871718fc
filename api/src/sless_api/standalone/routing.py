"""Routing of the standalone backend: which functions the proxy may call, and their supervised processes.

Routes live in memory, so the proxy never touches SQLite per call. :meth:`StandaloneRouter.sync` makes
the route table and the supervisor agree with the state of one function after any change (a build, a
trigger, a secret); trigger changes are announced to the listeners (cron, the event dispatcher).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable

from sless_api.changes import ChangeListeners
from sless_api.config import ApiConfig
from sless_api.platform import FunctionRecord, NotFound, Route, Unavailable
from sless_api.secrets.store import SecretStore
from sless_api.secrets.usage import Delivery, deliver
from sless_api.standalone.builder import BuildArtifact
from sless_api.standalone.failures import caller_reason
from sless_api.standalone.sandbox import Limits, Sandbox
from sless_api.standalone.state import StateStore, artifact_from_dict
from sless_api.standalone.supervisor import LimitExceeded, NotDeployed, ProcessSpec, StartFailed, Supervisor
from sless_core.models import Phase, TriggerType

log = logging.getLogger("sless.standalone")


def process_key(namespace: str, name: str) -> str:
    """The supervisor's (and the call logs') key of a function."""
    return f"{namespace}.{name}"


class StandaloneRouter:
    """The :class:`~sless_api.platform.Router` and :class:`~sless_api.platform.ChangeFeed` of `sless up`."""

    def __init__(self, config: ApiConfig, state: StateStore, supervisor: Supervisor, secrets: SecretStore,
                 sandbox: Sandbox) -> None:
        self.config = config
        self.state = state
        self.supervisor = supervisor
        self.secrets = secrets
        self.sandbox = sandbox
        self._routes: dict[tuple[str, str], Route] = {}
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
        process_spec = {k: v for k, v in rec.spec.to_dict().items() if k != "max_concurrency"}  # the proxy's alone
        version = hashlib.sha256(json.dumps([rec.code_hash, process_spec, secrets.version],
                                            sort_keys=True).encode())
        limits = Limits.for_function(rec.spec.memory_mb, rec.spec.runtime, host=self.config.sandbox)
        jail = dataclasses.replace(artifact.jail(rec.namespace, limits), files=secrets.files)
        return ProcessSpec(argv=list(argv), env=env, cwd=artifact.code_dir, version=version.hexdigest()[:16],
                           drain_sec=float(rec.spec.timeout_sec) + self.config.proxy_timeout_margin_sec,
                           sandbox=self.sandbox, jail=jail, runtime=rec.spec.runtime)

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
            return
        auth = "public" if any(t.spec.auth == "public" for t in http) else "token"
        self._routes[(namespace, name)] = Route(namespace, name, float(rec.spec.timeout_sec), auth,
                                                rec.spec.max_concurrency)
        await self.supervisor.deploy(key, await self.process_spec(rec, artifact_from_dict(artifact)))

    async def forget(self, namespace: str, name: str) -> None:
        """A deleted function: no route, no process; the listeners hear its triggers went with it."""
        self._routes.pop((namespace, name), None)
        self.changed()
        await self.supervisor.remove(process_key(namespace, name))

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
        rec = self.state.get_function(namespace, name)
        if rec is None:
            raise NotFound(f"function {name!r} not found")
        artifact = self.state.get_artifact(namespace, name)
        if rec.phase != Phase.READY or artifact is None:
            raise Unavailable(f"function {name!r} is not ready (phase {rec.phase})")
        key = process_key(namespace, name)
        if self.process_state(key) == "absent":
            await self.supervisor.deploy(key, await self.process_spec(rec, artifact_from_dict(artifact)))
        return Route(namespace, name, float(rec.spec.timeout_sec), "public")

    @contextlib.asynccontextmanager
    async def upstream(self, route: Route) -> AsyncIterator[str]:
        try:
            async with self.supervisor.lease(process_key(route.namespace, route.function)) as base_url:
                yield base_url
        except NotDeployed as exc:
            raise NotFound(f"function {route.function!r} is not deployed") from exc
        except StartFailed as exc:
            log.warning("function %s/%s failed to start: %s", route.namespace, route.function, exc)
            raise Unavailable(f"function {route.function!r} failed to start: {caller_reason(str(exc))}") from exc
        except LimitExceeded as exc:
            raise Unavailable(f"function {route.function!r} was {str(exc).split(': ', 1)[-1]}") from exc
