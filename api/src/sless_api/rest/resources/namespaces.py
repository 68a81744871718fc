"""``/v1/namespaces/{ns}/ensure`` and ``/v1/whoami``: a tenant finds and creates its namespace."""

from __future__ import annotations

import falcon
import falcon.asgi

from sless_api.domain.ports import FunctionBackend
from sless_api.rest.http import claims_of


class Ensure:
    def __init__(self, platform: FunctionBackend) -> None:
        self.platform = platform

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str) -> None:
        created = await self.platform.ensure_namespace(ns)
        resp.status = falcon.HTTP_201 if created else falcon.HTTP_200
        resp.media = {"namespace": ns, "created": created}


class WhoAmI:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        claims = claims_of(req)
        resp.media = {"sub": claims.sub, "namespace": claims.namespace, "admin": claims.admin}
