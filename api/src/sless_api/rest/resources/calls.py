"""``/v1/namespaces/{ns}/calls[/{id}]``: asynchronous calls of the tenant's functions, their state and result."""

from __future__ import annotations

import asyncio

import falcon.asgi

from sless_api.rest.http import ApiError, query_int
from sless_api.services.asynccalls.model import CallState, is_call_id
from sless_api.services.asynccalls.runner import AsyncRunner
from sless_core.naming import validate_name


class Calls:
    """``GET``: newest first, optionally one function's or one state's (``?state=dead``: the dead letters)."""

    def __init__(self, runner: AsyncRunner) -> None:
        self.runner = runner

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str) -> None:
        limit = query_int(req, "limit", 50, 1, 500)
        function = req.get_param("function")
        if function is not None:
            validate_name(function)
        state = req.get_param("state")
        if state is not None and state not in {s.value for s in CallState}:
            raise ApiError(400, f"state must be one of {', '.join(s.value for s in CallState)}", field="state")
        cursor = req.get_param("cursor")
        if cursor is not None and not is_call_id(cursor):
            raise ApiError(400, "cursor is not one this API returned", field="cursor")
        calls = await asyncio.to_thread(self.runner.store.list, ns, function, state, limit + 1, cursor)
        base = f"/v1/namespaces/{ns}"
        resp.media = {"items": [c.to_api(base) for c in calls[:limit]],
                      "next_cursor": calls[limit - 1].id if len(calls) > limit else None}


class Call:
    def __init__(self, runner: AsyncRunner) -> None:
        self.runner = runner

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, call_id: str) -> None:
        if not is_call_id(call_id):
            raise ApiError(400, "a call id is 32 lowercase hex digits", field="call_id")
        call = await asyncio.to_thread(self.runner.store.get, ns, call_id)
        if call is None:
            raise ApiError(404, f"no call {call_id} in this namespace")
        resp.media = call.to_api(f"/v1/namespaces/{ns}")
