"""``/health`` (the process answers) and ``/ready`` (it can serve: the backend has started and its routes are all
known); public probes."""

from __future__ import annotations

from typing import Any

import falcon.asgi

from sless_api.rest.http import PublicResource
from sless_core.release import platform_version

#: Read once: a process's version does not change while it runs.
VERSION = platform_version()


class Health(PublicResource):
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = {"status": "ok", "version": VERSION}  # which release answers, pod by pod in a rollout


class Ready(PublicResource):
    def __init__(self, services: Any) -> None:
        self.services = services

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        backend = self.services.config.backend
        if not self.services.platform.router.loaded():  # a Service must not send it calls it would answer 404
            resp.status = falcon.HTTP_503
            resp.media = {"status": "loading", "backend": backend,
                          "error": "the route table is still loading from the cluster"}
            return
        stats = self.services.invocations.stats() if self.services.invocations is not None else {}
        resp.media = {"status": "ready", "backend": backend, "invocation_log": stats}
