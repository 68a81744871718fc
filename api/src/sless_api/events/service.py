"""``sless-events``: the event dispatcher of the Kubernetes backend, as a process (a Deployment) of its own.

It runs the same :class:`~sless_api.events.dispatcher.Dispatcher` as `sless up`, wired by
:mod:`.kube`: event triggers from a watch, calls to the functions' Services through the invoker,
invocation records and the idempotency store in PostgreSQL. Several replicas may run: each consumes
every trigger's queue (the broker spreads the messages) and the shared store keeps one message id
from running twice (:mod:`.pgdedup`).

| variable | default | meaning |
|---|---|---|
| ``SLESS_RABBITMQ_URL`` | required | the broker |
| ``SLESS_DATABASE_URL`` | required | ``postgresql://...``: invocation log and idempotency store |
| ``KUBECONFIG`` | in-cluster | as the API (``SLESS_KUBE_*`` too) |
| ``SLESS_EVENTS_HOST`` | ``127.0.0.1`` | where ``/health`` and ``/ready`` listen (``0.0.0.0`` in a pod) |
| ``SLESS_EVENTS_PORT`` | ``8091`` | their port |
| ``SLESS_EVENT_*`` | | the dispatcher's knobs (events README) |
| ``SLESS_MAX_TIMEOUT_SEC``, ``SLESS_PROXY_TIMEOUT_MARGIN_SEC``, ``SLESS_MAX_BODY_BYTES`` | | as the API |
| ``SLESS_LOG_LEVEL``, ``SLESS_LOG_FORMAT`` | ``INFO``, ``json`` | as the API |
| ``SLESS_METRICS_TOKEN`` | unset: off | ``/metrics`` on the probe port answers this bearer token only |

``/health``: the process and its event loop answer. ``/ready``: connected to RabbitMQ and the trigger
list loaded (503 otherwise, and from SIGTERM on). SIGTERM (or SIGINT): stop consuming at once,
let calls in flight finish for up to ``SLESS_EVENT_DRAIN_SEC`` (messages waiting for a retry go back
to the queue with their attempts remembered), flush the invocation log, exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sless_api import metrics
from sless_api.config import ApiConfig
from sless_api.events.config import EventsConfig
from sless_api.events.kube import KubeEvents, NoCodeStore
from sless_api.events.pgdedup import PostgresDedupStore
from sless_api.invocations import InvocationLog, log_from_url
from sless_api.kube import KubeSettings
from sless_api.kube.platform import KubernetesPlatform
from sless_api.logsetup import configure_logging
from sless_api.proxy import Invoker

log = logging.getLogger("sless.events.service")
EXIT_CONFIG = 2


@dataclass(frozen=True)
class ServiceSettings:
    rabbitmq_url: str
    database_url: str
    host: str = "127.0.0.1"
    port: int = 8091

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ServiceSettings:
        source = os.environ if env is None else env
        rabbitmq = (source.get("SLESS_RABBITMQ_URL") or "").strip()
        if not rabbitmq:
            raise ValueError("SLESS_RABBITMQ_URL is required: the broker whose queues event triggers name")
        database = (source.get("SLESS_DATABASE_URL") or "").strip()
        if database.split(":", 1)[0].lower() not in ("postgresql", "postgres"):
            raise ValueError("SLESS_DATABASE_URL must be a postgresql:// URL: the invocation log and the "
                             "idempotency store that all dispatcher replicas share")
        raw_port = (source.get("SLESS_EVENTS_PORT") or "").strip() or str(cls.port)
        if not raw_port.isdigit() or not 0 < int(raw_port) < 65536:
            raise ValueError(f"SLESS_EVENTS_PORT must be a TCP port, got {raw_port!r}")
        host = (source.get("SLESS_EVENTS_HOST") or "").strip() or cls.host
        return cls(rabbitmq_url=rabbitmq, database_url=database, host=host, port=int(raw_port))


class Probes:
    """``/health`` and ``/ready`` on a small HTTP port (kubelet probes, and the tests' window in)."""

    def __init__(self, events: KubeEvents, invocations: InvocationLog, scrape_token: str = "") -> None:
        self.events = events
        self.invocations = invocations
        self.scrape_token = scrape_token
        self.stopping = False
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> None:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.ready)
        app.router.add_get("/metrics", self.metrics)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def metrics(self, request: web.Request) -> web.Response:
        """As the API's ``/metrics``: off without SLESS_METRICS_TOKEN, else only for that bearer token."""
        if not self.scrape_token:
            return web.json_response({"error": "metrics are off: set SLESS_METRICS_TOKEN to serve them"}, status=404)
        if not metrics.scrape_allowed(request.headers.get("Authorization"), self.scrape_token):
            return web.json_response({"error": "a scrape needs the metrics token"}, status=401)
        body, content_type = metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def ready(self, _request: web.Request) -> web.Response:
        dispatcher = self.events.dispatcher
        checks = {"rabbitmq": dispatcher.connected.is_set(), "triggers": self.events.synced(),
                  "running": not self.stopping}
        body: dict[str, Any] = {
            "status": "ready" if all(checks.values()) else "not ready",
            "checks": checks,
            "consuming": [f"{ns}/{name}" for ns, name in dispatcher.consuming()],
            "stats": dict(dispatcher.stats),
            "invocation_log": self.invocations.stats(),
        }
        return web.json_response(body, status=200 if all(checks.values()) else 503)


async def serve(settings: ServiceSettings, config: ApiConfig, events_config: EventsConfig,
                kube_settings: KubeSettings) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    invocations = log_from_url(settings.database_url)
    store = PostgresDedupStore(settings.database_url)
    try:
        platform = KubernetesPlatform(config, NoCodeStore(), invocations, kube_settings)
    except Exception as exc:  # no kubeconfig, no service account
        log.error("cannot reach Kubernetes: %s: %s", type(exc).__name__, exc)
        invocations.close(1.0)
        store.close()
        return EXIT_CONFIG
    invoker = Invoker(platform, invocations, config.proxy_timeout_margin_sec)
    events = KubeEvents(platform, invoker, config, events_config, store)
    probes = Probes(events, invocations, config.metrics_token)
    try:
        await probes.start(settings.host, settings.port)
        await events.start()
        log.info("sless-events: probes on %s:%d, consuming the queues of event triggers", settings.host,
                 settings.port)
        await stop.wait()
        log.info("stopping: no new messages; calls in flight finish (up to %.0fs)", events_config.drain_sec)
        probes.stopping = True
        await events.close()
    finally:
        await invoker.close()
        await probes.stop()
        invocations.close(5.0)
        store.close()
    log.info("stopped: %s", dict(events.dispatcher.stats))
    return 0


def main() -> int:
    try:
        configure_logging()
        settings = ServiceSettings.from_env()
        config = ApiConfig.from_env()
        events_config = EventsConfig.from_env(
            settings.rabbitmq_url, max_call_sec=config.max_timeout_sec + config.proxy_timeout_margin_sec)
        kube_settings = KubeSettings.from_env()
    except ValueError as exc:
        log.error("configuration: %s", exc)
        return EXIT_CONFIG
    return asyncio.run(serve(settings, config, events_config, kube_settings))


if __name__ == "__main__":
    sys.exit(main())
