"""``/health`` (the process answers) and ``/ready`` (it can serve: the backend has started); public probes."""

from __future__ import annotations

from typing import Any

import falcon.asgi

from sless_api.rest.http import PublicResource


class Health(PublicResource):
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"status": "ok"}


class Ready(PublicResource):
    def __init__(self, services: Any) -> None:
        self.services = services

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        stats = self.services.invocations.stats() if self.services.invocations is not None else {}
        resp.media = {"status": "ready", "backend": self.services.config.backend, "invocation_log": stats}
