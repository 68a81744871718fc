"""The function client of the invoke path: a call through its route to the function's runtime, over pooled
keep-alive connections, with connect retries, time limits, and the invocation record. Shared by the HTTP proxy,
cron, the event dispatchers and async calls."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

import aiohttp

from sless_api import metrics, tracing
from sless_api.domain import calloutput
from sless_api.domain.errors import PlatformError
from sless_api.domain.ports import Router
from sless_api.domain.routing import Route
from sless_api.gateway import calltiming
from sless_api.gateway.calltiming import CallTiming
from sless_api.gateway.headers import to_caller
from sless_api.gateway.requestid import HEADER, new_request_id
from sless_api.gateway.upstream import (
    UpstreamBroken,
    UpstreamConnection,
    UpstreamPool,
    UpstreamRefused,
    UpstreamResponse,
    request_head,
)
from sless_api.stores.invocations import Invocation, InvocationLog

log = logging.getLogger("sless.proxy")


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


def error_reply(exc: PlatformError) -> InvokeResult:
    """A backend's refusal as the caller sees it, with its ``Retry-After`` advice when it has one."""
    result = error_body(exc.status, exc.message)
    if exc.retry_after is not None:
        result.headers.append(("retry-after", str(exc.retry_after)))
    return result


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
               timing: CallTiming | None = None, version: int | None = None, attempt: int | None = None) -> None:
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
            version=version if reached else None, attempt=attempt,
            output=timing.output if timing is not None else None))

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
                   body: bytes, trigger: str, request_id: str | None = None, waited_sec: float = 0.0,
                   attempt: int | None = None) -> InvokeResult:
        """One buffered invocation (cron, events, async calls); recorded like a proxied call, with a request id of
        its own unless the caller gave one (an async call keeps the id its caller was answered with).

        ``waited_sec``: how long the call already waited in the platform before this attempt (an async call in its
        queue), counted in its ``queue`` phase. ``attempt``: which try at the same work this is (an event's
        delivery, an async call's retry), kept in the record.
        """
        if tracing.enabled():  # the context HEADERS carry (the queued request's, the message's) is continued
            with tracing.span(f"{trigger} {route.namespace}/{route.function}", "consumer", headers,
                              sless_trigger=trigger, sless_request_id=request_id) as current:
                result = await self._call(route, method, path_qs, tracing.with_context(headers), body, trigger,
                                          request_id, waited_sec, attempt)
                tracing.record_status(current, result.status)
                return result
        return await self._call(route, method, path_qs, headers, body, trigger, request_id, waited_sec, attempt)

    async def _call(self, route: Route, method: str, path_qs: str, headers: list[tuple[str, str]], body: bytes,
                    trigger: str, request_id: str | None, waited_sec: float, attempt: int | None) -> InvokeResult:
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
        except UpstreamError as exc:
            result = error_body(exc.status, exc.message)
        except PlatformError as exc:
            result = error_reply(exc)
        self.record(route.namespace, route.function, method, path_qs.split("?", 1)[0], result.status, started,
                    len(body), len(result.body), trigger, result.error, request_id, timing, route.version, attempt)
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
OUTPUT_RAW = calloutput.OUTPUT_HEADER.encode()


class Exchange:
    """``Invoker.request``: a class rather than a generator-based context manager, since every proxied call enters
    one, and an async generator's machinery was several microseconds of it."""

    __slots__ = ("_address", "_began", "_body", "_connection", "_headers", "_in_flight", "_invoker", "_method",
                 "_path_qs", "_route", "_timing", "_token", "_upstream")

    def __init__(self, invoker: Invoker, route: Route, method: str, path_qs: str,
                 headers: list[tuple[str, str]] | bytes, body: bytes, timing: CallTiming | None) -> None:
        self._invoker, self._route, self._method, self._path_qs = invoker, route, method, path_qs
        self._headers, self._body, self._timing = headers, body, timing
        self._connection: UpstreamConnection | None = None  # set once the answer's head came
        self._address: tuple[str, int] = ("", 0)

    async def __aenter__(self) -> Answer:
        invoker, route, timing = self._invoker, self._route, self._timing
        self._token = calltiming.CURRENT.set(timing)
        self._in_flight = metrics.in_flight(route.namespace, route.function)
        self._in_flight.inc()  # until _end: waiting for a process or pod, and the exchange itself
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
            connection, resp, (host, port) = await self._connect(base_url, time.monotonic() + limit)
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
            timing.output = resp.header(OUTPUT_RAW)
        return Answer(resp, limit, self._began + invoker.stream_max)

    async def _connect(self, base_url: str, deadline: float,
                       ) -> tuple[UpstreamConnection, UpstreamResponse, tuple[str, int]]:  # fmt: skip
        """The answer's head from BASE_URL, or from another address of the function when BASE_URL refused the
        connection and the upstream has one (``elsewhere``: a pod with nothing listening any more is not tried
        again while others are ready); else the refused address is tried again (``Invoker._reconnect``)."""
        invoker, refused_urls = self._invoker, [base_url]
        while True:
            host, port, host_header = upstream_address(base_url)
            request = request_head(self._method, self._path_qs, host_header, self._headers, self._body)
            try:
                connection, resp = await invoker.pool.exchange(host, port, self._method, request,
                                                               deadline - time.monotonic())  # fmt: skip
                return connection, resp, (host, port)
            except UpstreamRefused as refused:
                elsewhere = getattr(self._upstream, "elsewhere", None) if refused.refused else None
                moved = elsewhere(refused_urls) if elsewhere is not None else None
                if moved is None:
                    connection, resp = await invoker._reconnect(host, port, self._method, request, deadline, refused)
                    return connection, resp, (host, port)
                base_url = moved
                refused_urls.append(moved)

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
            self._end()

    def _end(self) -> None:
        """The exchange is over, whichever way (once: either the success path or ``_fail``)."""
        calltiming.CURRENT.reset(self._token)
        self._in_flight.dec()

    def _fail(self, exc: BaseException) -> None:
        """The call ends with EXC: the UpstreamError for a timeout or a broken exchange (raised here), else EXC
        itself is left to propagate."""
        self._end()
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
