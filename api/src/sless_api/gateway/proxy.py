"""The invoke proxy: ``ANY /fn/{ns}/{name}[/{path}]`` forwarded to the function's runtime.

This is the hot path, so it is a bare ASGI handler (no framework routing per call), resolves routes
from the backend's in-memory table, reuses pooled keep-alive upstream connections, streams the
response back, and hands the invocation record to a bounded queue instead of writing it inline.

A response without a ``Content-Length`` (a function's chunked stream, Server-Sent Events) is relayed
chunk by chunk as it arrives. The function's timeout then limits each wait for the next chunk (idle
time), and ``SLESS_PROXY_STREAM_MAX_SEC`` the whole exchange; a client that leaves mid-stream closes
the upstream connection, which ends the function's stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Protocol

from sless_api import metrics, tracing
from sless_api.auth import AuthError, TokenVerifier, bearer_token
from sless_api.domain.errors import CallbackRefused, PlatformError
from sless_api.domain.httppaths import DotSegment
from sless_api.domain.httppolicy import HttpPolicy
from sless_api.domain.routing import Route
from sless_api.gateway.accesslog import log_access
from sless_api.gateway.admission import Admission, Throttled
from sless_api.gateway.asgi import Receive, Scope, Send, client_gone
from sless_api.gateway.calltiming import CallTiming
from sless_api.gateway.headers import (
    CALLBACK_HEADER,
    REQUEST_ID_RAW,
    caller_head,
    scan_request_head,
    upstream_headers,
    upstream_lines,
    wants_async,
)
from sless_api.gateway.invoker import Answer, Invoker, InvokeResult, UpstreamError, error_body, error_reply
from sless_api.gateway.pathguard import raw_path, reaches_runtime_internals, split_invoke
from sless_api.gateway.replies import Reply, UnsafeHeader, reply_for
from sless_api.gateway.requestid import SCOPE_KEY, accept_or_new_raw
from sless_api.gateway.slowclients import ABORT_EXTENSION
from sless_api.gateway.upstream import UpstreamBroken
from sless_api.logsetup import current_request_id

log = logging.getLogger("sless.proxy")


class ProxyApp:
    """The ASGI handler for ``/fn/...``."""

    def __init__(self, invoker: Invoker, verifier: TokenVerifier | None, max_body_bytes: int,
                 function_csp: str = "", queue: AsyncQueue | None = None,
                 admission: Admission | None = None) -> None:
        self.invoker = invoker
        self.admission = admission or Admission()
        self.verifier = verifier
        self.queue = queue  # where `Prefer: respond-async` calls go; None: every call is synchronous
        self.max_body = max_body_bytes
        self.csp = [(b"content-security-policy", function_csp.encode("latin-1"))] if function_csp else []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One call; its access line, request count and request id are this handler's own (``/fn`` does not go
        through ``accesslog.AccessLog``: its wrapping of every message was a measurable share of a call)."""
        started = time.monotonic()
        method: str = scope["method"]
        reply = reply_for(send, method, scope.get("extensions", {}).get(ABORT_EXTENSION))
        request_id = accept_or_new_raw(scope["headers"])
        scope[SCOPE_KEY] = request_id
        token = current_request_id.set(request_id)
        try:
            if tracing.enabled():
                await self._traced(scope, receive, reply, started, request_id)
            else:
                await self._serve(scope, receive, reply, started, request_id)
        finally:
            metrics.count_request("fn", reply.status)
            client = scope.get("client")
            log_access(method, scope.get("path", ""), reply.status, reply.sent, started,
                       client[0] if client else None, request_id)
            current_request_id.reset(token)

    async def _traced(self, scope: Scope, receive: Receive, reply: Reply, started: float, request_id: str) -> None:
        """The call inside its server span, which continues the caller's ``traceparent`` (``tracing``)."""
        target = split_invoke(raw_path(scope))
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        name = f"fn {target.namespace}/{target.function}" if target is not None else "fn"
        with tracing.span(name, "server", headers, http_request_method=scope["method"], sless_request_id=request_id,
                          sless_namespace=target.namespace if target else None,
                          sless_function=target.function if target else None) as current:
            await self._serve(scope, receive, reply, started, request_id)
            tracing.record_status(current, reply.status)

    async def _serve(self, scope: Scope, receive: Receive, reply: Reply, started: float, request_id: str) -> None:
        method: str = scope["method"]
        answer_id = (REQUEST_ID_RAW, request_id.encode())
        target = split_invoke(raw_path(scope))
        if target is None or reaches_runtime_internals(target.tail):
            await self._answer(reply, error_body(404, "use /fn/{namespace}/{function}[/path]"), answer_id)
            return
        ns, name, sub = target.namespace, target.function, target.tail
        query = scope.get("query_string", b"").decode("latin-1")
        path_qs = sub + ("?" + query if query else "")
        raw: list[tuple[bytes, bytes]] = scope["headers"]
        client = (scope.get("client") or [None])[0]
        scheme: str = scope.get("scheme", "http")
        req_bytes, status, error, resp_bytes = 0, 500, None, 0
        timing: CallTiming | None = None
        version: int | None = None
        # the trigger's CORS headers for this caller's origin, on any answer; None: the trigger sets no CORS
        cors: list[tuple[bytes, bytes]] | None = None
        platform_answered = False  # a CORS preflight: the function is not called, and no call is recorded
        try:
            route = (await self.invoker.platform.route(ns, name)).served()
            params: str | None = None
            if route.paths is not None:  # the function's triggers have path patterns: the path picks one
                route, params = self.at_path(route, sub)
            version = route.version
            if route.policy is not None:
                cors = self._cors(route.policy, method, raw)
                if not route.policy.allows(method):
                    refused = error_body(405, f"{method} is not allowed: the function's http trigger allows "
                                              f"{route.policy.allow_header()}")
                    refused.headers.append(("allow", route.policy.allow_header()))
                    raise _Reply(refused)
            declared, framed, asks = scan_request_head(raw)
            # Decoded headers only where something reads them by name: a token to check, an async wish, a callback.
            traced = tracing.enabled()
            headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw] \
                if asks or route.auth == "token" or traced else None
            caller = None
            if route.auth == "token":
                # checking the token (a key set fetched, at worst) is a step of its own in the trace
                with tracing.step("authenticate"):
                    caller = await self.authorize(route, headers or [])
            body = await self._read_body(receive, declared) if framed else b""  # neither header: no body (RFC 9112)
            req_bytes = len(body)
            timing = CallTiming(ready=time.monotonic())
            forwarded: list[tuple[str, str]] | bytes
            if headers is None:
                forwarded = self._lines(raw, client, scheme, caller, request_id)
                if params is not None:
                    forwarded += b"X-Sless-Params: " + params.encode("ascii") + b"\r\n"
            else:
                host = next((v for k, v in headers if k == "host"), None)
                forwarded = upstream_headers(headers, client, scheme, host, caller, request_id)
                if params is not None:
                    forwarded.append(("X-Sless-Params", params))
                callback = next((v for k, v in headers if k == CALLBACK_HEADER), None)
                if traced:  # an async call continues this request's trace when it runs
                    forwarded = tracing.with_context(forwarded)
                if self.queue is not None and wants_async(headers):
                    await self._answer(reply, await self._accept(ns, name, method, path_qs, forwarded, body,
                                                                 request_id, headers, callback), answer_id)
                    return  # recorded when it runs
                if callback is not None:
                    raise _Reply(error_body(400, "X-Sless-Callback-Url needs an asynchronous call "
                                                 "(Prefer: respond-async or X-Sless-Async: 1)"))
            async with self.admission.admit(ns, name, route.max_concurrency):
                if traced:
                    status, resp_bytes, error = await self._traced_forward(
                        route, method, path_qs, forwarded, body, reply, receive, timing, answer_id, cors)
                else:
                    status, resp_bytes, error = await self._forward(route, method, path_qs, forwarded, body, reply,
                                                                    receive, timing, answer_id, cors)
        except _Reply as refused:
            status, error = refused.result.status, refused.result.error
            platform_answered = refused.platform_answered
            await self._answer(reply, refused.result, answer_id, cors)
        except PlatformError as exc:
            status, error = exc.status, exc.message
            await self._answer(reply, error_reply(exc), answer_id, cors)
        except Throttled as exc:
            status, error = 429, exc.message
            metrics.THROTTLED.labels(ns, name).inc()
            throttled = error_body(429, exc.message)
            throttled.headers.append(("retry-after", str(exc.retry_after)))
            await self._answer(reply, throttled, answer_id, cors)
        if platform_answered:
            return
        if status != 404 or error is None:
            self.invoker.record(ns, name, method, sub, status, started, req_bytes, resp_bytes, "http", error,
                                request_id, timing, version)

    @staticmethod
    def at_path(route: Route, tail: str) -> tuple[Route, str | None]:
        """The route of the http trigger that serves TAIL, with its path parameters' JSON (``Route.at``); the
        platform's 404 when none serves it, 400 for a dot segment where patterns decide (``httppaths``)."""
        try:
            found = route.at(tail)
        except DotSegment:
            raise _Reply(error_body(400, "a path with a . or .. segment does not reach a function whose http "
                                         "triggers have path patterns")) from None
        if found is None:
            raise _Reply(error_body(404, f"no http trigger of function {route.function} serves this path"))
        return found

    @staticmethod
    def _cors(policy: HttpPolicy, method: str, raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]] | None:
        """The http trigger's CORS, before anything else of the call: a preflight is answered here (204, or 403 for
        an origin, method or header the trigger does not allow; raised: the platform's own answer). Gives the CORS
        headers of the answer to this caller's origin; None when the trigger sets no CORS."""
        cors: list[tuple[bytes, bytes]] | None = None if policy.cors is None else []
        origin = _header(raw, b"origin")
        if policy.cors is not None and origin is not None:
            asked = _header(raw, b"access-control-request-method")
            if method == "OPTIONS" and asked is not None:
                allowed = policy.cors.preflight(origin, asked, _header(raw, b"access-control-request-headers") or "")
                if allowed is None:
                    raise _Reply(error_body(403, "CORS preflight refused: this origin, method or header is not "
                                                 "allowed by the function's http trigger"))
                raise _Reply(InvokeResult(204, allowed, b""), platform_answered=True)
            cors = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in policy.cors.answer_headers(origin)]
        return cors

    async def _accept(self, ns: str, name: str, method: str, path_qs: str, forwarded: list[tuple[str, str]],
                      body: bytes, request_id: str, headers: list[tuple[str, str]],
                      callback: str | None) -> InvokeResult:
        """Store the call for the async runner and answer 202 with where its outcome will be."""
        assert self.queue is not None
        try:
            call_id = await self.queue.submit(ns, name, method, path_qs, forwarded, body, request_id, callback)
        except CallbackRefused as exc:
            raise _Reply(error_body(400, str(exc))) from None
        status_url = f"/v1/namespaces/{ns}/calls/{call_id}"
        out = [("content-type", "application/json"), ("location", status_url)]
        if any(k.lower() == "prefer" for k, _ in headers):
            out.append(("preference-applied", "respond-async"))
        payload = {"id": call_id, "state": "queued", "status_url": status_url, "request_id": request_id}
        return InvokeResult(202, out, json.dumps(payload).encode())

    async def authorize(self, route: Route, headers: list[tuple[str, str]]) -> str:
        """The verified caller's ``sub`` for a token trigger (401 without a token, 403 for another tenant)."""
        if self.verifier is None:
            raise _Reply(error_body(401, "this trigger requires a token, and no token verifier is configured"))
        header = next((v for k, v in headers if k.lower() == "authorization"), None)
        try:
            claims = await self.verifier.verify_async(bearer_token(header))
        except AuthError as exc:
            raise _Reply(error_body(401, str(exc))) from exc
        if claims.namespace != route.namespace and not claims.admin:
            raise _Reply(error_body(403, "this token belongs to another tenant"))
        return claims.sub

    @staticmethod
    def _lines(raw: list[tuple[bytes, bytes]], client: str | None, scheme: str, caller: str | None,
               request_id: str) -> bytes:
        try:
            return upstream_lines(raw, client, scheme, caller, request_id)
        except UpstreamBroken:
            raise _Reply(error_body(400, "a request header holds a line break or NUL")) from None

    async def _read_body(self, receive: Receive, declared: str | None) -> bytes:
        if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > self.max_body:
            raise _Reply(error_body(413, f"request body exceeds {self.max_body} bytes"))
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Reply(error_body(499, "client disconnected"))
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise _Reply(error_body(413, f"request body exceeds {self.max_body} bytes"))
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def _forward(self, route: Route, method: str, path_qs: str, headers: list[tuple[str, str]] | bytes,
                       body: bytes, reply: Reply, receive: Receive, timing: CallTiming,
                       answer_id: tuple[bytes, bytes],
                       cors: list[tuple[bytes, bytes]] | None) -> tuple[int, int, str | None]:
        try:
            async with self.invoker.request(route, method, path_qs, headers, body, timing) as resp:
                out, length = caller_head(resp.raw_headers)
                if cors is not None:  # the trigger's CORS settings, not the function's own, answer the browser
                    out = [(k, v) for k, v in out if not k.startswith(b"access-control-")] + cors
                out.extend(self.csp)
                out.append(answer_id)
                if length is not None:
                    out.append((b"content-length", length))
                elif method != "HEAD" and resp.status not in (204, 304):
                    await reply.start(resp.status, out, more=True)
                    return await self._relay(resp, reply, receive)
                # A whole small answer, head and body, leaves in one write: read on until its end or a second part.
                chunk = await resp.readany() if method != "HEAD" else b""
                following = await resp.readany() if chunk else b""
                await reply.start(resp.status, out, chunk, more=bool(following))
                while following:
                    chunk, following = following, await resp.readany()
                    await reply.more(chunk, bool(following))
                return resp.status, reply.sent, None if resp.status < 500 else f"function answered {resp.status}"
        except UnsafeHeader as exc:
            raise _Reply(error_body(502, f"function's answer refused: {exc}")) from None
        except UpstreamError as exc:
            if not reply.status:
                raise _Reply(error_body(exc.status, exc.message)) from None
            # The status line is gone already: the connection closes under the answer, so the client sees it cut
            # (a short body, or a stream without its final chunk), never a clean end.
            reply.abort()
            return exc.status, reply.sent, exc.message

    async def _traced_forward(self, route: Route, method: str, path_qs: str,
                              headers: list[tuple[str, str]] | bytes, body: bytes, reply: Reply, receive: Receive,
                              timing: CallTiming, answer_id: tuple[bytes, bytes],
                              cors: list[tuple[bytes, bytes]] | None) -> tuple[int, int, str | None]:
        """``_forward`` in a client span whose context the function gets, with the runtime's phases under it."""
        began = tracing.now_ns()
        with tracing.span("upstream", "client", sless_version=route.version) as current:
            sent = tracing.with_context(headers if isinstance(headers, list) else [])
            result = await self._forward(route, method, path_qs, sent, body, reply, receive, timing, answer_id, cors)
            tracing.phases(began, None if timing.queue_sec is None else timing.queue_sec * 1000,
                           timing.start_sec * 1000 if timing.cold else None, timing.handler_ms, timing.cold)
            tracing.record_status(current, result[0])
            return result

    @staticmethod
    async def _relay(resp: Answer, reply: Reply, receive: Receive) -> tuple[int, int, str | None]:
        """Pass a streamed body on chunk by chunk as it arrives, until it ends or the client leaves (then the
        upstream connection is closed, which ends the function's stream)."""
        gone = asyncio.ensure_future(client_gone(receive))
        try:
            while True:
                read = asyncio.ensure_future(resp.readany())
                await asyncio.wait((read, gone), return_when=asyncio.FIRST_COMPLETED)
                if not read.done():
                    read.cancel()
                    resp.close()
                    return resp.status, reply.sent, f"client disconnected after {reply.sent} bytes of the stream"
                chunk = read.result()  # a broken or idle stream raises here (UpstreamError once out of request())
                if not chunk:
                    await reply.more(b"", False)
                    return resp.status, reply.sent, None if resp.status < 500 else f"function answered {resp.status}"
                await reply.more(chunk, True)
        finally:
            gone.cancel()

    @staticmethod
    async def _answer(reply: Reply, result: InvokeResult, answer_id: tuple[bytes, bytes],
                      cors: list[tuple[bytes, bytes]] | None = None) -> None:
        headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in result.headers]
        if result.status != 204:  # a 204 has no Content-Length (RFC 9110)
            headers.append((b"content-length", str(len(result.body)).encode()))
        headers.append(answer_id)
        if cors and result.status != 204:  # a preflight's 204 has its CORS headers already
            headers.extend(cors)
        await reply.start(result.status, headers, result.body)


class AsyncQueue(Protocol):
    """What the proxy needs of the async runner: store a call, get its id."""

    async def submit(self, namespace: str, function: str, method: str, path: str, headers: list[tuple[str, str]],
                     body: bytes, request_id: str, callback_url: str | None = None) -> str: ...


class _Reply(Exception):
    def __init__(self, result: InvokeResult, platform_answered: bool = False) -> None:
        super().__init__(result.error)
        self.result = result
        self.platform_answered = platform_answered


def _header(raw: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The first value of header NAME (lower case, as servers give names) in an ASGI head."""
    return next((v.decode("latin-1") for k, v in raw if k == name), None)
