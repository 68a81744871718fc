"""The application factory: wires config, auth, storage, the invocation log and a backend into one ASGI app.

``/fn/...`` goes straight to the bare proxy handler; everything else is the Falcon REST API. The
lifespan starts the backend and the background services it hands over (cron, events) inside the server's
event loop and stops them on shutdown; which backend it is matters only to :func:`build_services`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import falcon
import falcon.asgi

from sless_api import tracing
from sless_api.auth import AuthConfig, TokenVerifier
from sless_api.domain.errors import PlatformError
from sless_api.domain.ports import Background, Platform
from sless_api.gateway.accesslog import AccessLog, flush_access_lines
from sless_api.gateway.admission import Admission
from sless_api.gateway.invoker import Invoker
from sless_api.gateway.pathguard import is_canonical, is_invoke_path, raw_path, refuse_path
from sless_api.gateway.proxy import ProxyApp
from sless_api.gateway.wsproxy import WsProxy
from sless_api.main.config import ApiConfig
from sless_api.rest.console.resource import Console, ConsoleAsset
from sless_api.rest.http import (
    TenantAuth,
    handle_platform_error,
    handle_unexpected,
    handle_validation_error,
    serialize_error,
)
from sless_api.rest.openapi import OpenApiDocument
from sless_api.rest.resources import calls, functions, jobs, namespaces, probes, queues, secrets, triggers
from sless_api.rest.resources.metrics import Metrics
from sless_api.services.asynccalls.runner import AsyncRunner
from sless_api.services.asynccalls.store import store_from_url as call_store_from_url
from sless_api.services.events.tenantqueues import TenantQueues
from sless_api.stores.code import code_store
from sless_api.stores.invocations import InvocationLog, log_from_url
from sless_core.errors import ValidationError

log = logging.getLogger("sless.app")
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass
class Services:
    """What the app owns, so tests and `sless up` can reach the same objects."""

    config: ApiConfig
    platform: Platform
    invocations: InvocationLog | None
    invoker: Invoker
    verifier: TokenVerifier | None
    async_calls: AsyncRunner
    #: publishing to a tenant's queues and its dead letters (None: no broker configured)
    queues: TenantQueues | None = None
    background: list[Background] = field(default_factory=list)


def make_verifier(auth: AuthConfig | None) -> TokenVerifier | None:
    if auth is None:
        log.warning("no token verification configured (set SLESS_JWT_SECRET, SLESS_JWT_PUBLIC_KEY or "
                    "SLESS_JWKS_URL): /v1 answers 503 until it is")
        return None
    return TokenVerifier(auth)


def upload_spool(config: ApiConfig) -> Path:
    """Where uploads are streamed before the backend takes them (cleaned of interrupted ones at start)."""
    return config.data_dir / "tmp"


def build_rest(services: Services) -> falcon.asgi.App[Any, Any]:
    app = falcon.asgi.App(middleware=[TenantAuth(services.verifier)])
    app.set_error_serializer(serialize_error)
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(PlatformError, handle_platform_error)
    app.add_error_handler(ValidationError, handle_validation_error)
    app.req_options.strip_url_path_trailing_slash = True
    cfg, platform = services.config, services.platform
    base = "/v1/namespaces/{ns}"
    app.add_route("/health", probes.Health())
    app.add_route("/ready", probes.Ready(services))
    app.add_route("/v1/whoami", namespaces.WhoAmI())
    app.add_route("/v1/openapi.json", OpenApiDocument())
    app.add_route("/metrics", Metrics(cfg.metrics_token))
    app.add_route("/console", Console(platform, services.verifier, cfg.public_url))
    app.add_route("/console/{asset}", ConsoleAsset(platform, services.verifier, cfg.public_url))
    app.add_route(f"{base}/ensure", namespaces.Ensure(platform))
    app.add_route(f"{base}/functions", functions.Functions(platform, cfg.max_timeout_sec))
    app.add_route(f"{base}/functions/{{name}}", functions.Function(platform, cfg.max_timeout_sec))
    app.add_route(f"{base}/functions/{{name}}/upload",
                  functions.Upload(platform, cfg.max_upload_bytes, upload_spool(cfg)))
    app.add_route(f"{base}/functions/{{name}}/source", functions.Source(platform))
    app.add_route(f"{base}/functions/{{name}}/versions", functions.Versions(platform))
    app.add_route(f"{base}/functions/{{name}}/rollback", functions.Rollback(platform))
    app.add_route(f"{base}/functions/{{name}}/traffic", functions.Traffic(platform))
    app.add_route(f"{base}/functions/{{name}}/invocations", functions.Invocations(platform, services.invocations))
    app.add_route(f"{base}/functions/{{name}}/invocations/{{ident}}/logs",
                  functions.InvocationLogs(platform, services.invocations))
    app.add_route(f"{base}/triggers", triggers.Triggers(platform, cfg.public_url))
    app.add_route(f"{base}/triggers/{{name}}", triggers.Trigger(platform, cfg.public_url))
    app.add_route(f"{base}/jobs", jobs.Jobs(platform))
    app.add_route(f"{base}/jobs/{{name}}", jobs.Job(platform))
    app.add_route(f"{base}/secrets", secrets.Secrets(platform))
    app.add_route(f"{base}/secrets/{{name}}", secrets.Secret(platform))
    app.add_route(f"{base}/calls", calls.Calls(services.async_calls))
    app.add_route(f"{base}/calls/{{call_id}}", calls.Call(services.async_calls))
    app.add_route(f"{base}/queues/{{queue}}/messages", queues.Messages(services.queues, cfg.max_body_bytes))
    app.add_route(f"{base}/queues/{{queue}}/dead-letters", queues.DeadLetters(services.queues))
    app.add_route(f"{base}/queues/{{queue}}/dead-letters/redrive", queues.Redrive(services.queues))
    app.add_route(f"{base}/queues/{{queue}}/dead-letters/purge", queues.Purge(services.queues))
    app.add_route(f"{base}/queues/{{queue}}/dead-letters/{{ident}}", queues.DeadLetter(services.queues))
    return app


@dataclass(frozen=True)
class RouteEntry:
    """One route of the REST app and the methods its resource answers."""

    template: str
    resource: object
    methods: tuple[str, ...]


def route_table(rest: falcon.asgi.App[Any, Any]) -> list[RouteEntry]:
    """Every route the REST app serves, so tests can walk all of them (a route added later is walked too).

    Falcon has no public listing of its routes; its compiled router keeps them as a tree of nodes.
    """
    entries: list[RouteEntry] = []
    nodes = list(rest._router._roots)
    while nodes:
        node = nodes.pop()
        nodes.extend(node.children)
        if node.resource is not None:
            methods = tuple(m for m in falcon.constants.COMBINED_METHODS if hasattr(node.resource, f"on_{m.lower()}"))
            entries.append(RouteEntry(str(node.uri_template), node.resource, methods))
    return sorted(entries, key=lambda e: e.template)


def build_services(config: ApiConfig) -> Services:
    invocations = log_from_url(config.database_url)
    if config.backend == "standalone":
        from sless_api.backends.standalone.platform import StandalonePlatform

        store = code_store(config.storage, config.data_dir / "objects")
        platform: Platform = StandalonePlatform(config.platform_settings(), store, invocations)
    elif config.backend == "kubernetes":
        from sless_api.backends.kube.platform import KubernetesPlatform

        store = code_store(config.storage, config.data_dir / "objects")
        platform = KubernetesPlatform(config.platform_settings(), store, invocations)
    else:
        raise SystemExit(f"unknown SLESS_BACKEND {config.backend!r}: use standalone or kubernetes")
    invoker = Invoker(platform.router, invocations, config.proxy_timeout_margin_sec, config.stream_max_sec)
    runner = AsyncRunner(call_store_from_url(config.database_url), invoker, config.async_calls)
    tenant_queues = TenantQueues(config.rabbitmq_url, config.max_body_bytes) if config.rabbitmq_url else None
    return Services(config, platform, invocations, invoker, make_verifier(config.auth), runner, tenant_queues)


class SlessApp:
    """The ASGI entry point."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.rest = build_rest(services)
        self.proxy = ProxyApp(services.invoker, services.verifier, services.config.max_body_bytes,
                              services.config.function_csp, services.async_calls,
                              Admission(services.config.tenant_max_concurrency, services.config.concurrency_queue_max,
                                        services.config.concurrency_queue_wait_sec))
        self.ws_proxy = WsProxy(self.proxy)
        self.logged = AccessLog(self._dispatch)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http" and is_invoke_path(raw_path(scope)):
            await self.proxy(scope, receive, send)  # request id and access line are the proxy's own
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:
            await self.logged(scope, receive, send)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        path = raw_path(scope)
        if kind == "websocket" and is_invoke_path(path):
            await self.ws_proxy(scope, receive, send)
        elif not is_canonical(path):
            await refuse_path(scope, receive, send)
        else:
            await self.rest(cast(dict[str, Any], scope), receive, send)

    async def startup(self) -> None:
        # In each worker, after gunicorn's fork: the exporter's thread is its own.
        tracing.configure("sless-api", os.environ)
        services = self.services
        removed = functions.clean_interrupted_uploads(upload_spool(services.config))
        if removed:
            log.info("removed %d upload(s) interrupted by an earlier stop", removed)
        await services.platform.start()
        services.async_calls.start()
        for service in services.platform.background_services(services.invoker):
            await service.start()
            services.background.append(service)

    async def shutdown(self) -> None:
        for item in self.services.background:
            await item.close()
        await self.services.async_calls.close()
        if self.services.queues is not None:
            await self.services.queues.close()
        await self.services.invoker.close()
        await self.services.platform.close()
        if self.services.invocations is not None:
            self.services.invocations.close(5.0)
        tracing.shutdown()
        flush_access_lines()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    log.exception("start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


def create_app(config: ApiConfig | None = None) -> SlessApp:
    """The app for CONFIG; without one (``uvicorn --factory sless_api.main.app:create_app``) this is the entry
    point, and it parses the environment itself."""
    return SlessApp(build_services(config or ApiConfig.from_env(os.environ)))
