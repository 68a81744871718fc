"""WebSocket at ``/fn/{ns}/{name}[/{path}]``: an upgrade request passes through to the function, frames both ways.

The same route, trigger and auth checks as an HTTP call come first (404, 401, 403, 429 are answered as HTTP
responses with a JSON body, before any upgrade). Then the proxy opens a WebSocket to the function's runtime
and accepts the client's only once the function has accepted (deny by default: a function that exports no
websocket handler refuses the upgrade, and the client gets 400 ``this function does not accept WebSocket
connections``). Messages are relayed as they come, text as text and binary as binary; closing either side
closes the other with its code. The function's timeout (plus the proxy margin) limits idle time (no message
either way), ``SLESS_PROXY_STREAM_MAX_SEC`` the whole connection. The invocation record is written when the
connection ends: status 101, the bytes each way, and why it ended when it was not a close.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import aiohttp

from sless_api import metrics
from sless_api.domain.errors import PlatformError
from sless_api.domain.routing import Route
from sless_api.gateway.admission import Throttled
from sless_api.gateway.asgi import Receive, Scope, Send
from sless_api.gateway.calltiming import CallTiming
from sless_api.gateway.headers import upstream_headers
from sless_api.gateway.invoker import error_body
from sless_api.gateway.pathguard import raw_path, reaches_runtime_internals, split_invoke
from sless_api.gateway.proxy import ProxyApp, _Reply
from sless_api.gateway.requestid import scope_request_id

#: Handshake headers of the client's hop: the upstream handshake makes its own.
HANDSHAKE = frozenset({"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
                       "sec-websocket-protocol", "sec-websocket-accept"})
NOT_ACCEPTED = "this function does not accept WebSocket connections"


class _Ended(Exception):
    """The relay is over: ``error`` says why when it was not a close."""

    def __init__(self, error: str | None) -> None:
        super().__init__(error)
        self.error = error


class WsProxy:
    """The ASGI handler for WebSocket scopes under ``/fn/...``."""

    def __init__(self, proxy: ProxyApp) -> None:
        self.proxy = proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.monotonic()
        target = split_invoke(raw_path(scope))
        if (await receive())["type"] != "websocket.connect":
            return
        if target is None or reaches_runtime_internals(target.tail):
            await deny(scope, send, 404, "use /fn/{namespace}/{function}[/path]")
            return
        ns, name, sub = target.namespace, target.function, target.tail
        query = scope.get("query_string", b"").decode("latin-1")
        path_qs = sub + ("?" + query if query else "")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        request_id = scope_request_id(scope)
        status, error, received, sent = 500, None, 0, 0
        timing = CallTiming(ready=time.monotonic())
        invoker = self.proxy.invoker
        version: int | None = None
        try:
            route, params = ProxyApp.at_path((await invoker.platform.route(ns, name)).served(), sub)
            version = route.version
            if route.policy is not None and not route.policy.allows("GET"):  # a WebSocket opens with a GET
                raise _Reply(error_body(405, "GET is not allowed: the function's http trigger allows "
                                             f"{route.policy.allow_header()}"))
            caller = await self.proxy.authorize(route, headers) if route.auth == "token" else None
            kept = [(k, v) for k, v in headers if k.lower() not in HANDSHAKE]
            forwarded = upstream_headers(kept, (scope.get("client") or [None])[0],
                                         "https" if scope.get("scheme") == "wss" else "http",
                                         next((v for k, v in headers if k.lower() == "host"), None), caller,
                                         request_id)
            if params is not None:
                forwarded.append(("X-Sless-Params", params))
            protocols = [p.strip() for k, v in headers if k.lower() == "sec-websocket-protocol"
                         for p in v.split(",") if p.strip()]
            async with self.proxy.admission.admit(ns, name, route.max_concurrency):
                status, received, sent, error = await self._connect(scope, route, path_qs, forwarded, protocols,
                                                                    receive, send, timing)
        except _Reply as reply:
            status, error = reply.result.status, reply.result.error
            await deny(scope, send, status, error or "")
        except PlatformError as exc:
            status, error = exc.status, exc.message
            advice = [] if exc.retry_after is None else [(b"retry-after", str(exc.retry_after).encode())]
            await deny(scope, send, exc.status, exc.message, advice)
        except Throttled as exc:
            status, error = 429, exc.message
            metrics.THROTTLED.labels(ns, name).inc()
            await deny(scope, send, 429, exc.message, [(b"retry-after", str(exc.retry_after).encode())])
        if status != 404 or error is None:
            invoker.record(ns, name, "GET", sub, status, started, received, sent, "http", error, request_id,
                           timing, version)

    async def _connect(self, scope: Scope, route: Route, path_qs: str, headers: list[tuple[str, str]],
                       protocols: list[str], receive: Receive, send: Send,
                       timing: CallTiming) -> tuple[int, int, int, str | None]:
        """Open the function's WebSocket, accept the client's, relay; (status, bytes in, bytes out, error)."""
        invoker = self.proxy.invoker
        limit = route.timeout_sec + invoker.margin
        async with invoker.platform.upstream(route) as base_url:
            timing.forwarded = True
            timing.queue_sec = max(0.0, time.monotonic() - timing.ready - timing.start_sec)
            url = "ws" + base_url.removeprefix("http") + path_qs
            try:
                async with asyncio.timeout(limit):
                    upstream = await invoker.session.ws_connect(
                        url, headers=headers, protocols=protocols, autoping=True, compress=0,
                        max_msg_size=self.proxy.max_body)
            except aiohttp.WSServerHandshakeError as exc:
                status = 502 if exc.status >= 500 else 400
                message = f"function failed the WebSocket upgrade ({exc.status})" if status == 502 else NOT_ACCEPTED
                await deny(scope, send, status, message)
                return status, 0, 0, message
            except TimeoutError:
                metrics.UPSTREAM_ERRORS.labels("timeout").inc()
                message = f"function did not answer within {route.timeout_sec:g}s"
                await deny(scope, send, 504, message)
                return 504, 0, 0, message
            except aiohttp.ClientError as exc:
                metrics.UPSTREAM_ERRORS.labels("unreachable").inc()
                message = f"function unreachable: {type(exc).__name__}"
                await deny(scope, send, 502, message)
                return 502, 0, 0, message
            async with upstream:
                await send({"type": "websocket.accept", "subprotocol": upstream.protocol})
                relay = _Relay(upstream, receive, send)
                error = await relay.run(limit, invoker.stream_max, route.timeout_sec)
                return 101, relay.received, relay.sent, error


class _Relay:
    """Frames both ways between the client (ASGI) and the function (aiohttp), until one side closes."""

    def __init__(self, upstream: aiohttp.ClientWebSocketResponse, receive: Receive, send: Send) -> None:
        self.upstream = upstream
        self.receive = receive
        self.send = send
        self.received = 0  # bytes from the client
        self.sent = 0  # bytes to the client
        self.active = time.monotonic()
        self.client_closed = False

    async def run(self, idle_sec: float, max_sec: float, timeout_sec: float) -> str | None:
        began = time.monotonic()
        tasks = {asyncio.ensure_future(self._from_client()), asyncio.ensure_future(self._from_function())}
        try:
            while True:
                now = time.monotonic()
                wait = min(self.active + idle_sec, began + max_sec) - now
                if wait <= 0:
                    error = (f"cut after {max_sec:g}s (the longest a connection may last)"
                             if now >= began + max_sec else f"idle for more than {timeout_sec:g}s")
                    await self._close_both(1001, error)
                    return error
                done, _ = await asyncio.wait(tasks, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    failure = task.exception()
                    if isinstance(failure, _Ended):
                        return failure.error
                    if failure is not None:  # a send to either side failed: that side is gone
                        with contextlib.suppress(Exception):
                            await self._close_both(1011, "relay failed")
                        return f"relay failed: {type(failure).__name__}"
        finally:
            for task in tasks:
                task.cancel()

    async def _from_client(self) -> None:
        while True:
            message = await self.receive()
            kind = message["type"]
            if kind == "websocket.receive":
                self.active = time.monotonic()
                text = message.get("text")
                if text is not None:
                    self.received += len(text.encode("utf-8", "surrogatepass"))
                    await self.upstream.send_str(text)
                else:
                    data = message.get("bytes") or b""
                    self.received += len(data)
                    await self.upstream.send_bytes(data)
            elif kind == "websocket.disconnect":
                self.client_closed = True
                await self.upstream.close(code=_sendable(message.get("code", 1000)))
                raise _Ended(None)

    async def _from_function(self) -> None:
        async for message in self.upstream:
            self.active = time.monotonic()
            if message.type == aiohttp.WSMsgType.TEXT:
                self.sent += len(message.data.encode("utf-8", "surrogatepass"))
                await self.send({"type": "websocket.send", "text": message.data})
            elif message.type == aiohttp.WSMsgType.BINARY:
                self.sent += len(message.data)
                await self.send({"type": "websocket.send", "bytes": message.data})
        if self.client_closed:  # this side's close, forwarded: the other task ends the relay
            raise _Ended(None)
        code = self.upstream.close_code
        error = None if code is not None else "the function's connection broke off"
        with contextlib.suppress(OSError, RuntimeError):  # the client may be gone already
            await self.send({"type": "websocket.close", "code": _sendable(code if code is not None else 1011)})
        raise _Ended(error)

    async def _close_both(self, code: int, reason: str) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            await self.send({"type": "websocket.close", "code": code, "reason": reason[:120]})
        await self.upstream.close(code=code)


def _sendable(code: int | None) -> int:
    """A close code one may send (1005, 1006 and 1015 only describe a connection, they are never sent)."""
    if code is None or code in (1005, 1006, 1015) or not (1000 <= code <= 4999):
        return 1000
    return code


async def deny(scope: Scope, send: Send, status: int, message: str,
               extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """Refuse the upgrade with an HTTP answer and a JSON body (ASGI's WebSocket denial response), or, where
    the server cannot send one, by closing before the accept (the server answers 403)."""
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps({"error": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})
