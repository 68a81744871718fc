"""``/v1/namespaces/{ns}/jobs``: one-shot runs of a function; ``run_id`` 0 records, a larger one runs again."""

from __future__ import annotations

import falcon
import falcon.asgi

from sless_api.domain.ports import FunctionBackend
from sless_api.rest.http import ApiError, json_body, page
from sless_api.rest.traced import job_span
from sless_core.models import MAX_RUN_ID, JobSpec, validate_run_id
from sless_core.naming import validate_name


class Jobs:
    def __init__(self, platform: FunctionBackend) -> None:
        self.platform = platform

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str) -> None:
        records = await self.platform.list_jobs(ns)
        resp.media = page(records, req, key=lambda r: r.spec.name, render=lambda r: r.to_api())

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str) -> None:
        spec = JobSpec.from_user(await json_body(req))
        with job_span(req, ns, spec.name):
            record = await self.platform.create_job(ns, spec)
        resp.status = falcon.HTTP_201
        resp.media = record.to_api()


class Job:
    def __init__(self, platform: FunctionBackend) -> None:
        self.platform = platform

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        resp.media = (await self.platform.get_job(ns, validate_name(name))).to_api()

    async def on_patch(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        body = await json_body(req)
        if not isinstance(body, dict) or set(body) != {"run_id"}:
            raise ApiError(400, f'only {{"run_id": <integer 0..{MAX_RUN_ID}>}} can be changed', field="run_id")
        # The same rule as on POST, for both backends: they receive a checked run_id.
        run_id = validate_run_id(body["run_id"])
        with job_span(req, ns, validate_name(name)):
            resp.media = (await self.platform.rerun_job(ns, name, run_id)).to_api()

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        await self.platform.delete_job(ns, validate_name(name))
        resp.status = falcon.HTTP_204
