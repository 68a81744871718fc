"""``/v1/namespaces/{ns}/triggers``: http, cron and event triggers of a tenant's functions."""

from __future__ import annotations

import falcon
import falcon.asgi

from sless_api.domain.ports import FunctionBackend
from sless_api.domain.records import TriggerRecord
from sless_api.rest.http import ApiError, json_body, page
from sless_core.httproutes import path_shape
from sless_core.models import TriggerSpec, TriggerType
from sless_core.naming import validate_name


class _TriggerResource:
    """What both trigger resources need: the platform and the base of the URLs shown for http triggers."""

    def __init__(self, platform: FunctionBackend, public_url: str) -> None:
        self.platform = platform
        self.public_url = public_url

    def base_url(self, req: falcon.asgi.Request) -> str:
        return self.public_url or req.prefix

    async def refuse_same_route(self, ns: str, spec: TriggerSpec) -> None:
        """409 for an http trigger that would serve the same URLs as another of its function's (another name):
        the same path pattern up to its parameters' names, or both without a path (every path no pattern
        serves). Two would give one URL two auth settings, of which a caller could only ever get one; the
        other is changed with PATCH instead."""
        if spec.type != TriggerType.HTTP:
            return
        shape = path_shape(spec.path)
        for other in await self.platform.list_triggers(ns):
            if (other.spec.type == TriggerType.HTTP and other.spec.function == spec.function
                    and other.spec.name != spec.name and path_shape(other.spec.path) == shape):
                where = f"the path {other.spec.path}" if other.spec.path is not None else "the function's URL"
                raise ApiError(409, f"function {spec.function} has the http trigger {other.spec.name} already for "
                                    f"{where}: one URL has one http trigger (change it with PATCH "
                                    f"/triggers/{other.spec.name}, give this one another path, or delete it "
                                    f"first)")


class Triggers(_TriggerResource):
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str) -> None:
        base = self.base_url(req)
        records = await self.platform.list_triggers(ns)
        resp.media = page(records, req, key=lambda r: r.spec.name, render=lambda r: r.to_api(base))

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str) -> None:
        spec = TriggerSpec.from_user(await json_body(req))
        await self.refuse_same_route(ns, spec)
        record = await self.platform.create_trigger(ns, spec)
        resp.status = falcon.HTTP_201
        resp.media = record.to_api(self.base_url(req))


class Trigger(_TriggerResource):
    # Not a subclass of Triggers: it would inherit on_post, and POST /triggers/{name} would reach it.
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        record: TriggerRecord = await self.platform.get_trigger(ns, validate_name(name))
        resp.media = record.to_api(self.base_url(req))

    async def on_patch(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        patch = await json_body(req)
        if not isinstance(patch, dict):
            raise ApiError(400, "the request body must be a JSON object")
        name = validate_name(name)
        current: TriggerRecord = await self.platform.get_trigger(ns, name)
        await self.refuse_same_route(ns, current.spec.patched(patch))  # a new type or function may collide
        record = await self.platform.patch_trigger(ns, name, patch)
        resp.media = record.to_api(self.base_url(req))

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        await self.platform.delete_trigger(ns, validate_name(name))
        resp.status = falcon.HTTP_204
