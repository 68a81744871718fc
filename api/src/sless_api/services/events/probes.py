"""``/health``, ``/ready`` and ``/metrics`` of ``sless-events``, over any consumer of event triggers."""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from sless_api import metrics
from sless_api.services.events.dispatcher import Dispatcher
from sless_api.stores.invocations import InvocationLog


class Consumer(Protocol):
    """What the probes read: the dispatcher, and whether the trigger list is complete."""

    @property
    def dispatcher(self) -> Dispatcher: ...

    def synced(self) -> bool: ...


class Probes:
    """``/health`` and ``/ready`` on a small HTTP port (kubelet probes, and the tests' window in)."""

    def __init__(self, events: Consumer, invocations: InvocationLog, scrape_token: str = "") -> None:
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
