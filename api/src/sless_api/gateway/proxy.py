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
import re
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from sless_api import metrics
from sless_api.auth import AuthError, TokenVerifier, bearer_token
from sless_api.domain.errors import CallbackRefused, PlatformError
from sless_api.domain.ports import Router
from sless_api.domain.routing import Route
from sless_api.gateway import calltiming
from sless_api.gateway.accesslog import log_access
from sless_api.gateway.admission import Admission, Throttled
from sless_api.gateway.calltiming import CallTiming
from sless_api.gateway.pathguard import raw_path, reaches_runtime_internals, split_invoke
from sless_api.gateway.replies import Reply, UnsafeHeader, reply_for
from sless_api.gateway.requestid import HEADER, SCOPE_KEY, accept_or_new, new_request_id
from sless_api.gateway.slowclients import ABORT_EXTENSION
from sless_api.gateway.upstream import (
    UpstreamBroken,
    UpstreamConnection,
    UpstreamPool,
    UpstreamRefused,
    UpstreamResponse,
    request_head,
)
from sless_api.logsetup import current_request_id
from sless_api.stores.invocations import Invocation, InvocationLog

log = logging.getLogger("sless.proxy")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# RFC 9110 7.6.1 connection-specific fields, plus those that describe this hop's framing.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})


def end_to_end(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Headers minus hop-by-hop ones, including any the Connection header names."""
    pairs = list(headers)
    named = connection_named(pairs)
    return [(k, v) for k, v in pairs if (low := k.lower()) not in HOP_BY_HOP and low not in named]


def connection_named(headers: list[tuple[str, str]]) -> set[str]:
    """The fields a Connection header names (hop-by-hop for this exchange only)."""
    return {t.strip().lower() for k, v in headers if k.lower() == "connection" for t in v.split(",")}


def to_caller(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """A function's response headers as its caller gets them: end-to-end, without the runtime's report
    to the platform (``X-Sless-Handler-Ms``)."""
    return [(k, v) for k, v in end_to_end(headers) if k.lower() != calltiming.HANDLER_MS_HEADER]


@dataclass
class InvokeResult:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    error: str | None = None


#: The most a buffered call (cron, events, async calls) reads of an answer: an endless stream stops there.
BUFFERED_MAX_BYTES = 64 * 1024 * 1024
#: A connection the function's address refused is tried again, at once and then after each of these pauses
#: (2.75 s in all, never past the call's own limit): nothing was sent, so any method may be. An address that
#: refuses is mostly a pod that got its SIGTERM (and closed its listener) before every node's Service rules
#: dropped it: the rules follow the endpoint's removal only at kube-proxy's next sync (at least a second apart,
#: later on a loaded node, and a rollout's new pod has just caused one), and until then each new connection
#: to the Service picks an endpoint anew, the leaving pod among them. One retry after 0.2 s was not enough:
#: a rollout under load saw it refused twice. Else a process being replaced, ready a moment later.
CONNECT_RETRY_PAUSES_SEC = (0.0, 0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.5, 0.5)
#: An address that could not be resolved or reached is tried once more, after this pause (no Service yet).
UNREACHABLE_RETRY_PAUSES_SEC = (0.2,)


def error_body(status: int, message: str) -> InvokeResult:
    body = json.dumps({"error": message}).encode()
    return InvokeResult(status, [("content-type", "application/json")], body, error=message)


class Invoker:
    """Calls functions through their routes; shared by the HTTP proxy, cron and event dispatchers."""

    def __init__(self, platform: Router, invocations: InvocationLog | None, timeout_margin_sec: float,
                 stream_max_sec: float = 3600.0) -> None:
        self.platform = platform
        self.invocations = invocations
        self.margin = timeout_margin_sec
        self.stream_max = stream_max_sec
        self.pool = UpstreamPool()
        self._session: aiohttp.ClientSession | None = None  # WebSockets only (wsproxy)

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                                  skip_auto_headers=("User-Agent", "Accept-Encoding",
                                                                     "Content-Type"))
        return self._session

    async def close(self) -> None:
        self.pool.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def record(self, route_ns: str, name: str, method: str, path: str, status: int, started: float,
               req_bytes: int, resp_bytes: int, trigger: str, error: str | None, request_id: str | None,
               timing: CallTiming | None = None, version: int | None = None) -> None:
        duration = time.monotonic() - started
        metrics.observe_invocation(route_ns, name, trigger, status, duration)
        if self.invocations is None:
            return
        reached = timing is not None and (timing.forwarded or timing.cold)
        self.invocations.record(Invocation(
            namespace=route_ns, function=name, method=method, path=path, status=status,
            duration_ms=duration * 1000, request_bytes=req_bytes, response_bytes=resp_bytes, trigger=trigger,
            error=error, started_at=time.time(), request_id=request_id,
            cold=timing.cold if timing is not None and reached else None,
            queue_ms=None if timing is None or timing.queue_sec is None else timing.queue_sec * 1000,
            start_ms=timing.start_sec * 1000 if timing is not None and reached else None,
            handler_ms=timing.handler_ms if timing is not None else None,
            version=version if reached else None))

    def request(self, route: Route, method: str, path_qs: str, headers: list[tuple[str, str]] | bytes,
                body: bytes, timing: CallTiming | None = None) -> Exchange:
        """One upstream exchange on a pooled connection (``async with``, giving the ``Answer``); timeouts and
        connection failures become UpstreamError.

        The answer's head must come within the function's timeout plus the margin; then its body may take
        as long as it keeps coming: the same limit applies to each wait for more of it (a stream's idle
        time), ``stream_max_sec`` to the whole exchange.

        ``timing`` (when given) learns whether a process had to start, how long the call waited in the
        platform, and the handler's time the runtime reported.
        """
        return Exchange(self, route, method, path_qs, headers, body, timing)

    async def _open(self, host: str, port: int, method: str, request: bytes,
                    limit: float) -> tuple[UpstreamConnection, UpstreamResponse]:  # fmt: skip
        """The upstream answer's head within ``limit`` seconds; a refused connection is tried again."""
        deadline = time.monotonic() + limit
        try:
            return await self.pool.exchange(host, port, method, request, limit)
        except UpstreamRefused as refused:
            return await self._reconnect(host, port, method, request, deadline, refused)

    async def _reconnect(self, host: str, port: int, method: str, request: bytes, deadline: float,
                         refused: UpstreamRefused) -> tuple[UpstreamConnection, UpstreamResponse]:  # fmt: skip
        """Connect again after each pause (``CONNECT_RETRY_PAUSES_SEC`` for a refusal, else
        ``UNREACHABLE_RETRY_PAUSES_SEC``) until a connection is made, the pauses run out (the last failure is
        raised, saying how often it was tried) or the next pause would pass ``deadline``."""
        started, tries = time.monotonic(), 1
        for pause in CONNECT_RETRY_PAUSES_SEC if refused.refused else UNREACHABLE_RETRY_PAUSES_SEC:
            if time.monotonic() + pause >= deadline:
                break
            await asyncio.sleep(pause)
            tries += 1
            try:
                return await self.pool.exchange(host, port, method, request, deadline - time.monotonic())
            except UpstreamRefused as again:
                refused = again
        elapsed = time.monotonic() - started
        raise UpstreamRefused(f"{refused} ({tries} tries in {elapsed:.1f}s)", refused.refused) from None

    async def call(self, route: Route, method: str, path_qs: str, headers: list[tuple[str, str]],
                   body: bytes, trigger: str, request_id: str | None = None, waited_sec: float = 0.0) -> InvokeResult:
        """One buffered invocation (cron, events, async calls); recorded like a proxied call, with a request id of
        its own unless the caller gave one (an async call keeps the id its caller was answered with).

        ``waited_sec``: how long the call already waited in the platform before this attempt (an async call in its
        queue), counted in its ``queue`` phase.
        """
        started = time.monotonic()
        route = route.served()
        request_id = request_id or new_request_id()
        headers = [*((k, v) for k, v in headers if k.lower() != HEADER), ("X-Request-Id", request_id)]
        timing = CallTiming(ready=started - max(0.0, waited_sec))
        try:
            async with self.request(route, method, path_qs, headers, body, timing) as resp:
                data = await read_capped(resp, BUFFERED_MAX_BYTES)
                result = InvokeResult(resp.status, to_caller(resp.headers_text()), data,
                                      error=None if resp.status < 500 else data[:500].decode("utf-8", "replace"))
        except (UpstreamError, PlatformError) as exc:
            result = error_body(exc.status, exc.message)
        self.record(route.namespace, route.function, method, path_qs.split("?", 1)[0], result.status, started,
                    len(body), len(result.body), trigger, result.error, request_id, timing, route.version)
        return result


async def read_capped(resp: Answer, limit: int) -> bytes:
    """The answer's body, at most ``limit`` bytes of it (the rest is never read; the connection closes)."""
    parts, size = [], 0
    while size < limit:
        chunk = await resp.readany()
        if not chunk:
            break
        parts.append(chunk[:limit - size])
        size += len(chunk)
    return b"".join(parts)


@dataclass
class Answer:
    """A runtime's answer as the proxy reads it: the raw response, with the call's idle limit and deadline."""

    response: UpstreamResponse
    idle_sec: float
    deadline: float

    @property
    def status(self) -> int:
        return self.response.status

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        return self.response.raw_headers

    def headers_text(self) -> list[tuple[str, str]]:
        return self.response.headers_text()

    async def readany(self) -> bytes:
        """The next part of the body (``b""`` at its end), within the call's idle limit and deadline."""
        return await self.response.readany(self.idle_sec, self.deadline)

    def close(self) -> None:
        self.response.close()


def upstream_address(base_url: str) -> tuple[str, int, str]:
    """``http://host:port`` as (host, port, Host header); cached, since a backend has a handful of them."""
    found = _ADDRESSES.get(base_url)
    if found is None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise UpstreamBroken(f"not an http:// address: {base_url}")
        port = parsed.port or 80
        found = (parsed.hostname, port, parsed.netloc)
        if len(_ADDRESSES) < 10_000:
            _ADDRESSES[base_url] = found
    return found


_ADDRESSES: dict[str, tuple[str, int, str]] = {}
HANDLER_MS_RAW = calltiming.HANDLER_MS_HEADER.encode()


async def client_gone(receive: Receive) -> None:
    """Return once the client has disconnected (its request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Exchange:
    """``Invoker.request``: a class rather than a generator-based context manager, since every proxied call enters
    one, and an async generator's machinery was several microseconds of it."""

    __slots__ = ("_address", "_began", "_body", "_connection", "_headers", "_invoker", "_method", "_path_qs",
                 "_route", "_timing", "_token", "_upstream")

    def __init__(self, invoker: Invoker, route: Route, method: str, path_qs: str,
                 headers: list[tuple[str, str]] | bytes, body: bytes, timing: CallTiming | None) -> None:
        self._invoker, self._route, self._method, self._path_qs = invoker, route, method, path_qs
        self._headers, self._body, self._timing = headers, body, timing
        self._connection: UpstreamConnection | None = None  # set once the answer's head came
        self._address: tuple[str, int] = ("", 0)

    async def __aenter__(self) -> Answer:
        invoker, route, timing = self._invoker, self._route, self._timing
        self._token = calltiming.CURRENT.set(timing)
        limit = route.timeout_sec + invoker.margin
        self._began = time.monotonic()
        upstream = self._upstream = invoker.platform.upstream(route)
        try:
            base_url = await upstream.__aenter__()
        except BaseException as exc:
            self._fail(exc)
            raise
        try:
            if timing is not None:
                timing.forwarded = True
                timing.queue_sec = max(0.0, time.monotonic() - timing.ready - timing.start_sec)
            host, port, host_header = upstream_address(base_url)
            request = request_head(self._method, self._path_qs, host_header, self._headers, self._body)
            connection, resp = await invoker._open(host, port, self._method, request, limit)
        except BaseException as exc:
            try:
                await upstream.__aexit__(type(exc), exc, exc.__traceback__)
            except BaseException as replaced:  # the platform's own account of the failure (a process killed)
                self._fail(replaced)
                raise
            self._fail(exc)
            raise
        self._connection, self._address = connection, (host, port)
        if timing is not None:
            timing.handler_ms = calltiming.handler_ms(resp.header(HANDLER_MS_RAW))
        return Answer(resp, limit, self._began + invoker.stream_max)

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        assert self._connection is not None
        self._invoker.pool.release(*self._address, self._connection)
        try:
            await self._upstream.__aexit__(kind, exc, tb)
        except BaseException as replaced:
            self._fail(replaced)
            raise
        if exc is not None:
            self._fail(exc)  # raises the UpstreamError it stands for, if it is one; else EXC goes on
        else:
            calltiming.CURRENT.reset(self._token)

    def _fail(self, exc: BaseException) -> None:
        """The call ends with EXC: the UpstreamError for a timeout or a broken exchange (raised here), else EXC
        itself is left to propagate."""
        calltiming.CURRENT.reset(self._token)
        route, head = self._route, self._connection is not None
        if isinstance(exc, TimeoutError):
            metrics.UPSTREAM_ERRORS.labels("timeout").inc()
            if not head:
                message = f"function did not answer within {route.timeout_sec:g}s"
            elif time.monotonic() - self._began >= self._invoker.stream_max:
                message = (f"function's response cut after {self._invoker.stream_max:g}s "
                           "(the longest a response may last)")
            else:
                message = f"function's response idle for more than {route.timeout_sec:g}s"
            raise UpstreamError(504, message) from None
        if isinstance(exc, UpstreamBroken):
            metrics.UPSTREAM_ERRORS.labels("unreachable").inc()
            if head:
                raise UpstreamError(502, f"function's response broke off: {exc}") from None
            raise UpstreamError(502, f"function unreachable: {exc}") from None


class UpstreamError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# Response headers the server in front sets on every response: the function's copy would be a duplicate.
SERVER_OWNED = frozenset({"date", "server"})
# Request headers the platform owns: the caller's credentials never reach a function, the caller
# cannot claim a verified identity the platform did not check, and an async call's callback URL (it may
# carry the receiver's token) stays with the platform.
CALLBACK_HEADER = "x-sless-callback-url"
CREDENTIAL_HEADERS = frozenset({"authorization", "cookie", "x-sless-sub", CALLBACK_HEADER})
FORWARDED = ("x-forwarded-for", "x-forwarded-proto", "x-forwarded-host")
_NOT_UPSTREAM = HOP_BY_HOP | CREDENTIAL_HEADERS | {HEADER}
# What a caller never gets of a function's response head (raw bytes, lower case); Content-Length is set again, and
# X-Request-Id is the platform's (the one the call was given).
_NOT_TO_CALLER = frozenset(h.encode() for h in HOP_BY_HOP | SERVER_OWNED | {calltiming.HANDLER_MS_HEADER, HEADER})
_REQUEST_ID = HEADER.encode()


def caller_head(raw: Iterable[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]], bytes | None]:
    """A function's response head as the proxy sends it on, from the bytes the runtime sent (never decoded
    and encoded again): lower-case names, end-to-end only (``to_caller``), without the fields the server in
    front sets itself (``SERVER_OWNED``); and the runtime's ``Content-Length``, if it sent one."""
    pairs = list(raw)
    named: set[bytes] = set()
    length: bytes | None = None
    for k, v in pairs:
        low = k.lower()
        if low == b"connection":
            named.update(t.strip().lower() for t in v.split(b","))
        elif low == b"content-length" and length is None:
            length = v
    return [(low, v) for k, v in pairs if (low := k.lower()) not in _NOT_TO_CALLER and low not in named], length


def upstream_headers(headers: list[tuple[str, str]], client: str | None, scheme: str, host: str | None,
                     sub: str | None, request_id: str) -> list[tuple[str, str]]:
    """What the function sees: end-to-end headers without credentials, ``X-Forwarded-*`` with the platform's
    values appended to whatever the client claimed, ``X-Sless-Sub`` only when the platform verified it, and
    the call's ``X-Request-Id`` (the one the platform accepted or made, never a second one)."""
    named = connection_named(headers) if any(k.lower() == "connection" for k, _ in headers) else ()
    kept: list[tuple[str, str]] = []
    claimed: dict[str, list[str]] | None = None
    for k, v in headers:
        low = k.lower()
        if low in _NOT_UPSTREAM or low in named:
            continue
        if low in FORWARDED:
            if claimed is None:
                claimed = {}
            claimed.setdefault(low, []).append(v)
        else:
            kept.append((k, v))
    for name, title, own in (("x-forwarded-for", "X-Forwarded-For", client),
                             ("x-forwarded-proto", "X-Forwarded-Proto", scheme),
                             ("x-forwarded-host", "X-Forwarded-Host", host)):
        values = claimed.get(name, []) if claimed is not None else []
        if own:
            values.append(own)
        if values:
            kept.append((title, ", ".join(values)))
    if sub is not None:
        kept.append(("X-Sless-Sub", sub))
    kept.append(("X-Request-Id", request_id))
    return kept


_NOT_UPSTREAM_RAW = frozenset(name.encode() for name in _NOT_UPSTREAM)
_FORWARDED_RAW = {name.encode(): (name.title().encode(), index) for index, name in enumerate(FORWARDED)}
_LINE_BREAKING = re.compile(b"[\r\n\0]")


def upstream_lines(headers: list[tuple[bytes, bytes]], client: str | None, scheme: str, sub: str | None,
                   request_id: str) -> bytes:
    """``upstream_headers`` of an ASGI head (lower-case names, raw values), as the header lines of the runtime's
    request, made in one pass without decoding. UpstreamBroken when a value would break its line."""
    named: frozenset[bytes] | set[bytes] = frozenset()
    if any(k == b"connection" for k, _ in headers):
        named = {t.strip().lower() for k, v in headers if k == b"connection" for t in v.split(b",")}
    parts: list[bytes] = []
    claimed: list[list[bytes]] | None = None
    host: bytes | None = None
    for k, v in headers:
        if k in _NOT_UPSTREAM_RAW or k in named:
            if k == b"host" and host is None:
                host = v
            continue
        forwarded = _FORWARDED_RAW.get(k)
        if forwarded is not None:
            if claimed is None:
                claimed = [[], [], []]
            claimed[forwarded[1]].append(v)
            continue
        parts += (k, b": ", v, b"\r\n")
    own = (client.encode("latin-1") if client else None, scheme.encode("latin-1") if scheme else None, host)
    for title, index in _FORWARDED_RAW.values():
        values = claimed[index] if claimed is not None else []
        mine = own[index]
        if mine:
            values.append(mine)
        if values:
            parts += (title, b": ", b", ".join(values), b"\r\n")
    if sub is not None:
        parts += (b"X-Sless-Sub", b": ", sub.encode("latin-1"), b"\r\n")
    parts += (b"X-Request-Id", b": ", request_id.encode("latin-1"), b"\r\n")
    # Lines of four parts each: the values are every fourth (the names came through the server's parser).
    if _LINE_BREAKING.search(b"".join(parts[2::4])):
        raise UpstreamBroken("request not sent: a line break or NUL in a header")
    return b"".join(parts)


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
        request_id = accept_or_new(v.decode("latin-1") for k, v in scope["headers"] if k == _REQUEST_ID)
        scope[SCOPE_KEY] = request_id
        token = current_request_id.set(request_id)
        try:
            await self._serve(scope, receive, reply, started, request_id)
        finally:
            metrics.count_request("fn", reply.status)
            client = scope.get("client")
            log_access(method, scope.get("path", ""), reply.status, reply.sent, started,
                       client[0] if client else None, request_id)
            current_request_id.reset(token)

    async def _serve(self, scope: Scope, receive: Receive, reply: Reply, started: float, request_id: str) -> None:
        method: str = scope["method"]
        answer_id = (_REQUEST_ID, request_id.encode())
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
        try:
            route = (await self.invoker.platform.route(ns, name)).served()
            version = route.version
            declared, framed, asks = _scan(raw)
            # Decoded headers only where something reads them by name: a token to check, an async wish, a callback.
            headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw] \
                if asks or route.auth == "token" else None
            caller = await self.authorize(route, headers or []) if route.auth == "token" else None
            body = await self._read_body(receive, declared) if framed else b""  # neither header: no body (RFC 9112)
            req_bytes = len(body)
            timing = CallTiming(ready=time.monotonic())
            forwarded: list[tuple[str, str]] | bytes
            if headers is None:
                forwarded = self._lines(raw, client, scheme, caller, request_id)
            else:
                host = next((v for k, v in headers if k == "host"), None)
                forwarded = upstream_headers(headers, client, scheme, host, caller, request_id)
                callback = next((v for k, v in headers if k == CALLBACK_HEADER), None)
                if self.queue is not None and wants_async(headers):
                    await self._answer(reply, await self._accept(ns, name, method, path_qs, forwarded, body,
                                                                 request_id, headers, callback), answer_id)
                    return  # recorded when it runs
                if callback is not None:
                    raise _Reply(error_body(400, "X-Sless-Callback-Url needs an asynchronous call "
                                                 "(Prefer: respond-async or X-Sless-Async: 1)"))
            async with self.admission.admit(ns, name, route.max_concurrency):
                status, resp_bytes, error = await self._forward(route, method, path_qs, forwarded, body, reply,
                                                                receive, timing, answer_id)
        except _Reply as refused:
            status, error = refused.result.status, refused.result.error
            await self._answer(reply, refused.result, answer_id)
        except PlatformError as exc:
            status, error = exc.status, exc.message
            await self._answer(reply, error_body(exc.status, exc.message), answer_id)
        except Throttled as exc:
            status, error = 429, exc.message
            metrics.THROTTLED.labels(ns, name).inc()
            throttled = error_body(429, exc.message)
            throttled.headers.append(("retry-after", str(exc.retry_after)))
            await self._answer(reply, throttled, answer_id)
        if status != 404 or error is None:
            self.invoker.record(ns, name, method, sub, status, started, req_bytes, resp_bytes, "http", error,
                                request_id, timing, version)

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
                       answer_id: tuple[bytes, bytes]) -> tuple[int, int, str | None]:
        try:
            async with self.invoker.request(route, method, path_qs, headers, body, timing) as resp:
                out, length = caller_head(resp.raw_headers)
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
    async def _answer(reply: Reply, result: InvokeResult, answer_id: tuple[bytes, bytes]) -> None:
        headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in result.headers]
        headers.append((b"content-length", str(len(result.body)).encode()))
        headers.append(answer_id)
        await reply.start(result.status, headers, result.body)


#: Request headers that change how a call is handled; the rest are only passed on.
_NOTABLE = frozenset({b"content-length", b"transfer-encoding", b"prefer", b"x-sless-async", CALLBACK_HEADER.encode()})


def _scan(headers: list[tuple[bytes, bytes]]) -> tuple[str | None, bool, bool]:
    """One look at a request head: its declared Content-Length, whether it has a body at all (a Content-Length or
    a Transfer-Encoding), and whether it asks for more than a plain call (an async wish, a callback)."""
    declared, framed, asks = None, False, False
    for k, v in headers:
        if k in _NOTABLE:
            if k == b"content-length":
                framed = True
                if declared is None:
                    declared = v.decode("latin-1")
            elif k == b"transfer-encoding":
                framed = True
            else:
                asks = True
    return declared, framed, asks


class AsyncQueue(Protocol):
    """What the proxy needs of the async runner: store a call, get its id."""

    async def submit(self, namespace: str, function: str, method: str, path: str, headers: list[tuple[str, str]],
                     body: bytes, request_id: str, callback_url: str | None = None) -> str: ...


def wants_async(headers: list[tuple[str, str]]) -> bool:
    """`Prefer: respond-async` (RFC 7240, among other preferences) or `X-Sless-Async: 1`."""
    for key, value in headers:
        name = key.lower()
        if name == "prefer" and any(p.split(";", 1)[0].strip().lower() == "respond-async" for p in value.split(",")):
            return True
        if name == "x-sless-async" and value.strip() in ("1", "true"):
            return True
    return False


class _Reply(Exception):
    def __init__(self, result: InvokeResult) -> None:
        super().__init__(result.error)
        self.result = result


__all__ = ["HOP_BY_HOP", "AsyncQueue", "InvokeResult", "Invoker", "ProxyApp", "UpstreamError", "end_to_end",
           "to_caller", "upstream_headers", "wants_async"]
