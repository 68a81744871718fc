"""``/v1/namespaces/{ns}/functions``: create, read, update, delete, upload code, read source, invocations."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import falcon
import falcon.asgi

from sless_api.domain import versions
from sless_api.domain.errors import PlatformError
from sless_api.domain.ports import FunctionBackend
from sless_api.domain.records import FunctionRecord
from sless_api.domain.routing import CallRef
from sless_api.gateway.requestid import is_request_id
from sless_api.rest.http import ApiError, json_body, page, query_int, read_bounded
from sless_api.rest.traced import deploy_span
from sless_api.stores.invocations import InvocationLog
from sless_core.models import FunctionSpec
from sless_core.naming import validate_name
from sless_core.traffic import SplitRefused, TrafficSplit, parse_request

CHUNK = 256 * 1024
# Form fields beside the zip are not used; each is drained with this bound so none can be endless.
MAX_OTHER_PART_BYTES = 64 * 1024
MAX_PARTS = 16
MAX_CURSOR = 2**63 - 1  # invocation ids are 64-bit integers
SPOOL_PREFIX = "upload-"


def clean_interrupted_uploads(tmp_dir: Path) -> int:
    """Remove upload spool files whose process is gone (killed mid-upload: each is a whole zip of disk).

    Spool files carry their writer's pid, so a worker starting beside others (gunicorn) never removes an
    upload another live worker is receiving.
    """
    if not tmp_dir.is_dir():
        return 0
    removed = 0
    for entry in tmp_dir.glob(f"{SPOOL_PREFIX}*.zip"):
        pid = entry.name[len(SPOOL_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
            continue
        entry.unlink(missing_ok=True)
        removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Functions:
    def __init__(self, platform: FunctionBackend, max_timeout_sec: int) -> None:
        self.platform = platform
        self.max_timeout = max_timeout_sec

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str) -> None:
        records = await self.platform.list_functions(ns)
        resp.media = page(records, req, key=lambda r: r.spec.name, render=FunctionRecord.to_api)

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str) -> None:
        spec = FunctionSpec.from_user(await json_body(req), self.max_timeout)
        with deploy_span(req, ns, spec.name):
            record = await self.platform.create_function(ns, spec)
        resp.status = falcon.HTTP_201
        resp.media = record.to_api()


class Function:
    def __init__(self, platform: FunctionBackend, max_timeout_sec: int) -> None:
        self.platform = platform
        self.max_timeout = max_timeout_sec

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        resp.media = (await self.platform.get_function(ns, validate_name(name))).to_api()

    async def on_put(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        """A partial update: the fields given replace the stored ones (``scale`` merged key by key; null removes it)."""
        patch = await json_body(req)
        if not isinstance(patch, dict):
            raise ApiError(400, "the request body must be a JSON object")
        name = validate_name(name)
        with deploy_span(req, ns, name):
            record = await self.platform.update_function(ns, name, patch)
        resp.media = record.to_api()

    on_patch = on_put  # PUT has always been a partial update; PATCH says so

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        await self.platform.delete_function(ns, validate_name(name))
        resp.status = falcon.HTTP_204


class Upload:
    """Streams the zip to a temporary file, counting bytes, so an oversize upload is refused without buffering it."""

    def __init__(self, platform: FunctionBackend, max_upload_bytes: int, tmp_dir: Path) -> None:
        self.platform = platform
        self.max_bytes = max_upload_bytes
        self.tmp_dir = tmp_dir

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        validate_name(name)
        await self.platform.get_function(ns, name)
        if req.content_length is not None and req.content_length > self.max_bytes + 64 * 1024:
            raise ApiError(413, f"upload exceeds {self.max_bytes} bytes", limit=self.max_bytes)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.tmp_dir, prefix=f"{SPOOL_PREFIX}{os.getpid()}-", suffix=".zip")
        path = Path(tmp)
        try:
            with os.fdopen(fd, "wb") as out:
                digest = await self._receive(req, out)
            with deploy_span(req, ns, name):
                record = await self.platform.upload_code(ns, name, path, digest)
        finally:
            path.unlink(missing_ok=True)
        resp.status = falcon.HTTP_202
        resp.media = record.to_api()

    async def _receive(self, req: falcon.asgi.Request, out: Any) -> str:
        content_type = req.content_type or ""
        if content_type.startswith("multipart/form-data"):
            try:
                form = await req.get_media()
                parts = 0
                async for part in form:
                    if part.name == "code":
                        return await self._copy(part.stream, out)
                    parts += 1
                    if parts >= MAX_PARTS:
                        raise ApiError(400, f"more than {MAX_PARTS} multipart fields")
                    await read_bounded(part.stream, MAX_OTHER_PART_BYTES)
            except falcon.MediaMalformedError as exc:
                raise ApiError(400, "malformed multipart body") from exc
            raise ApiError(400, "multipart field 'code' (the zip) is missing")
        if content_type in ("application/zip", "application/octet-stream"):
            return await self._copy(req.stream, out)
        raise ApiError(415, "upload a zip as multipart/form-data field 'code' (or a raw application/zip body)")

    async def _copy(self, stream: Any, out: Any) -> str:
        digest, size = hashlib.sha256(), 0
        while True:
            chunk = await stream.read(CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > self.max_bytes:
                raise ApiError(413, f"upload exceeds {self.max_bytes} bytes", limit=self.max_bytes)
            digest.update(chunk)
            out.write(chunk)
        if size == 0:
            raise ApiError(400, "the uploaded zip is empty")
        return digest.hexdigest()


class Source:
    def __init__(self, platform: FunctionBackend) -> None:
        self.platform = platform

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        files = await self.platform.get_source(ns, validate_name(name))
        resp.media = {"files": files}


class Versions:
    """``GET .../functions/{name}/versions``: the deployed versions, newest (current) first."""

    def __init__(self, platform: FunctionBackend) -> None:
        self.platform = platform

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        resp.media = versions.listing(await self.platform.list_versions(ns, validate_name(name)))


class Rollback:
    """``POST .../functions/{name}/rollback`` ``{"version": N}`` (no body or ``{}``: the previous version)."""

    def __init__(self, platform: FunctionBackend) -> None:
        self.platform = platform

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        validate_name(name)
        body = await json_body(req) if req.content_length or req.content_type else None
        with deploy_span(req, ns, name):
            record = await self.platform.rollback(ns, name, versions.requested_version(body))
        resp.status = falcon.HTTP_202
        resp.media = record.to_api()


class Traffic:
    """``GET, PUT, DELETE .../functions/{name}/traffic``: the split of http calls between two versions.

    ``{"split": [{"version": N, "weight": W}, ...]}`` (``sless_core.traffic`` has the rules); no split reads
    as ``{"split": null}``: every call goes to the current version.
    """

    def __init__(self, platform: FunctionBackend) -> None:
        self.platform = platform

    @staticmethod
    def _answer(split: TrafficSplit | None) -> dict[str, Any]:
        return {"split": split.to_list() if split is not None else None}

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        resp.media = self._answer(await self.platform.get_traffic(ns, validate_name(name)))

    async def on_put(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        validate_name(name)
        split = parse_request(await json_body(req))
        try:
            resp.media = self._answer(await self.platform.set_traffic(ns, name, split))
        except SplitRefused as exc:
            raise ApiError(exc.status, exc.message) from None

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        await self.platform.clear_traffic(ns, validate_name(name))
        resp.status = falcon.HTTP_204


class Invocations:
    def __init__(self, platform: FunctionBackend, log: InvocationLog | None) -> None:
        self.platform = platform
        self.log = log

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str) -> None:
        record = await self.platform.get_function(ns, validate_name(name))
        limit = query_int(req, "limit", 50, 1, 500)
        cursor = req.get_param("cursor")
        digits = cursor is not None and cursor.isascii() and cursor.isdigit() and len(cursor) <= 19
        before = int(cursor) if cursor and digits and int(cursor) <= MAX_CURSOR else None
        if cursor and before is None:
            raise ApiError(400, "cursor is not one this API returned")
        if self.log is None:
            resp.media = {"items": [], "next_cursor": None}
            return
        # Only this function's own history: a function deleted and created again under the same name
        # does not show its predecessor's calls (epoch-second creation times: a second's slack).
        since = float(int(record.created_at))
        items, next_cursor = await asyncio.to_thread(self.log.list, ns, name, limit, before, since)
        resp.media = {"items": [i.to_dict() for i in items],
                      "next_cursor": None if next_cursor is None else str(next_cursor)}


def fuller(kept: dict[str, Any] | None, live: dict[str, Any] | None) -> dict[str, Any]:
    """A call's lines: those kept with its record (written before its answer, so they outlive the process) or
    those its process's output still holds (every line, a stream's after its head too, while the process or pod
    is there), whichever has more."""
    if kept is None:
        return live if live is not None else {"lines": [], "truncated": False}
    if live is None or len(live["lines"]) <= len(kept["lines"]):
        return kept
    return live


class InvocationLogs:
    """``GET .../invocations/{id}/logs``: what one call wrote (runtimes tag each line with its request id).

    ``{id}`` is the record's id or the call's request id (what the caller got in ``X-Request-Id``).

    The record is looked up by id *within* this function of this namespace, so another tenant's or
    another function's id is a 404 like an id that never existed; the lines are those kept with the record
    (``X-Sless-Output``) or the backend's, filed under this function only (``fuller``).
    """

    def __init__(self, platform: FunctionBackend, log: InvocationLog | None) -> None:
        self.platform = platform
        self.log = log

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, name: str,
                     ident: str) -> None:
        record = await self.platform.get_function(ns, validate_name(name))
        number = ident.isascii() and ident.isdigit() and len(ident) <= 19 and 0 < int(ident) <= MAX_CURSOR
        if not number and not is_request_id(ident):
            raise ApiError(400, "give an invocation's id (a positive integer) or its request id")
        missing = ApiError(404, f"no invocation {ident} of function {name!r}")
        if self.log is None:
            raise missing
        call = await asyncio.to_thread(self.log.get, ns, name, int(ident)) if number else None
        if call is None and is_request_id(ident):  # an id made of digits may be a caller's request id too
            call = await asyncio.to_thread(self.log.find_request, ns, name, ident)
        # A function deleted and created again under the same name does not show its predecessor's calls.
        if call is None or call.started_at < float(int(record.created_at)):
            raise missing
        if not call.request_id:
            resp.media = {"lines": [], "truncated": False}
            return
        ref = CallRef(call.request_id, call.started_at, call.duration_ms / 1000)
        kept = await asyncio.to_thread(self.log.get_output, ns, name, call.id) if call.id is not None else None
        try:
            live = await self.platform.call_logs(ns, name, ref)
        except PlatformError:
            if kept is None:
                raise
            live = None  # the process's output cannot be read (a cluster that does not allow it): what was kept
        resp.media = fuller(kept, live)
