"""``/v1/namespaces/{ns}/secrets``: a tenant's secrets. Values go in, never out: reads show keys and versions."""

from __future__ import annotations

import falcon
import falcon.asgi

from sless_api.domain.ports import FunctionBackend
from sless_api.rest.http import json_body, page
from sless_api.stores.secrets import SecretMeta, parse_secret_body
from sless_core.naming import validate_name


class Secrets:
    def __init__(self, platform: FunctionBackend) -> None:
        self.platform = platform

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str) -> None:
        metas = await self.platform.list_secrets(ns)
        resp.media = page(metas, req, key=lambda m: m.name, render=SecretMeta.to_api)

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str) -> None:
        name, data = parse_secret_body(await json_body(req))
        meta = await self.platform.create_secret(ns, name, data)
        resp.status = falcon.HTTP_201
        resp.media = meta.to_api()


class Secret:
    def __init__(self, platform: FunctionBackend) -> None:
        self.platform = platform

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        resp.media = (await self.platform.get_secret(ns, validate_name(name))).to_api()

    async def on_put(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        """Replaces every key (keys left out are removed); the functions using the secret restart."""
        _, data = parse_secret_body(await json_body(req), validate_name(name))
        resp.media = (await self.platform.replace_secret(ns, name, data)).to_api()

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        await self.platform.delete_secret(ns, validate_name(name))
        resp.status = falcon.HTTP_204
