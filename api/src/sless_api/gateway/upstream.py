"""The invoke proxy's HTTP/1.1 client to function runtimes: one request, its answer's raw head, the body as it comes.

Why not aiohttp's client: on the proxy's hot path it was about a third of the process's CPU per call (request
and response objects, header multidicts, timers, a stream reader per body), while a proxied call needs none of
that: the request's head and body are complete before it is sent, the answer's head is passed on as raw bytes,
and the body is relayed chunk by chunk. This client is an ``asyncio.Protocol`` per connection, with llhttp
(``httptools``, already the server's parser) reading the answer: Content-Length, chunked and close-delimited
bodies, informational answers, keep-alive or not.

Connections are pooled per address, most recently used first (a warm connection), and dropped once idle for
``KEEPALIVE_SEC`` (below the runtimes' own 65 s idle limit, so the runtime never closes one as it is taken) or
when the runtime closes them. A connection goes back to the pool only after its whole answer was read and the
answer allowed keep-alive; a call that stops early (a client gone, a capped read, an error) closes it.

A reused connection that the runtime closed before a byte of the answer came is retried once on a new
connection for idempotent methods only (the request may have been processed); a connection that could not be
made is retried by the caller (``invoker.Invoker``), since nothing was sent.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable

import httptools

#: How long an idle pooled connection is kept (the runtimes close theirs after 65 s).
KEEPALIVE_SEC = 30.0
#: Idle connections kept per address; more are closed when released.
MAX_IDLE_PER_ADDRESS = 256
#: Releases between two sweeps of the pool for expired, closed and forgotten connections.
PRUNE_EVERY = 1000
#: Body bytes buffered from the runtime before reading from it pauses (a client slower than the function).
HIGH_WATER_BYTES = 1 << 20
#: Methods a request may be repeated with (RFC 9110 9.2.2) when a reused connection dies under it.
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
#: Methods whose requests carry no body unless given one (no Content-Length: 0 is sent with them).
BODILESS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS", "TRACE"})


class UpstreamBroken(Exception):
    """The exchange with the runtime failed; the message says how (it reaches the caller's error)."""


class UpstreamRefused(UpstreamBroken):
    """No connection could be made: nothing was sent, so trying again is safe for any method.

    ``refused``: the address refused the connection (nothing listens there now: a pod that has stopped
    listening, a Service without ready endpoints), rather than it could not be resolved or reached.
    """

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class _Stale(UpstreamBroken):
    """A reused connection closed before a byte of the answer came."""


def _timeout_waiter(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


#: How often the pool's deadlines are checked, and the shortest limit they serve (a shorter one gets its own timer).
SWEEP_SEC = 0.05
SWEPT_FROM_SEC = 1.0


class _Deadlines:
    """The time limits of a pool's waits for answers, checked by one sweep every ``SWEEP_SEC`` while any is
    pending, instead of a timer made and cancelled for every wait (one per proxied call, a measurable part of
    it). A limit of a second or more is kept to within ``SWEEP_SEC``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.due: dict[asyncio.Future[None], float] = {}
        self.timer: asyncio.TimerHandle | None = None

    def add(self, waiter: asyncio.Future[None], limit: float) -> None:
        self.due[waiter] = self.loop.time() + limit
        if self.timer is None:
            self.timer = self.loop.call_later(SWEEP_SEC, self.sweep)

    def discard(self, waiter: asyncio.Future[None]) -> None:
        self.due.pop(waiter, None)

    def sweep(self) -> None:
        self.timer = None
        now = self.loop.time()
        for waiter in [waiter for waiter, due in self.due.items() if due <= now]:
            del self.due[waiter]
            _timeout_waiter(waiter)
        if self.due:
            self.timer = self.loop.call_later(SWEEP_SEC, self.sweep)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class UpstreamResponse:
    """One answer from a runtime: its status and raw head once it came, then its body through ``readany``."""

    def __init__(self, connection: UpstreamConnection, method: str) -> None:
        self._connection = connection
        self._loop = connection.loop
        self.head_only = method == "HEAD"
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = False
        self._informational = False
        self._until_close = False
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._head = False
        self._complete = False
        self._error: UpstreamBroken | None = None
        self._received = False
        self._waiter: asyncio.Future[None] | None = None

    def header(self, name: bytes) -> bytes | None:
        """The first value of a header (``name`` in lower case)."""
        for key, value in self.raw_headers:
            if key.lower() == name:
                return value
        return None

    def headers_text(self) -> list[tuple[str, str]]:
        return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.raw_headers]

    async def wait_head(self, limit: float) -> None:
        """Until the answer's status and headers came: TimeoutError after ``limit`` seconds."""
        while not self._head:
            if self._error is not None:
                raise self._error
            await self._wait(limit)

    async def readany(self, idle: float, deadline: float) -> bytes:
        """The body bytes that came since the last call (waiting up to ``idle`` for some, never past the
        monotonic ``deadline``); ``b""`` once the body ended. TimeoutError when none came in time."""
        while True:
            if self._chunks:
                data = b"".join(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
                self._chunks.clear()
                if self._buffered >= HIGH_WATER_BYTES and not self._complete:
                    self._connection.resume()
                self._buffered = 0
                return data
            if self._complete:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait(min(idle, deadline - time.monotonic()))

    async def _wait(self, limit: float) -> None:
        if limit <= 0:
            raise TimeoutError
        waiter = self._waiter = self._loop.create_future()
        deadlines = self._connection.deadlines
        if deadlines is not None and limit >= SWEPT_FROM_SEC:
            deadlines.add(waiter, limit)
            try:
                await waiter
            finally:
                deadlines.discard(waiter)
                self._waiter = None
            return
        timer = self._loop.call_later(limit, _timeout_waiter, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def reusable(self) -> bool:
        """Whether its connection may serve another request: the whole answer read, keep-alive allowed."""
        return self._complete and not self._chunks and self.keep_alive and self._error is None

    def close(self) -> None:
        """Abandon the answer: its connection closes (the runtime sees the caller leave)."""
        self._connection.close()

    # The connection's parser reports here.

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._complete:
            self.raw_headers.append((name, value))

    def on_headers_complete(self, status: int, keep_alive: bool) -> None:
        if self._complete:  # a second answer nobody asked for: the connection cannot be trusted any more
            self.keep_alive = False
            return
        self._received = True
        if 100 <= status < 200:  # 100 Continue and the like: the real answer follows
            self._informational = True
            self.raw_headers = []
            return
        self.status, self.keep_alive, self._head = status, keep_alive, True
        names = {k.lower() for k, _ in self.raw_headers}
        no_body = self.head_only or status in (204, 304)
        self._until_close = not no_body and b"content-length" not in names and b"transfer-encoding" not in names
        if self.head_only:  # llhttp cannot know that a HEAD answer's Content-Length announces no body
            self._complete, self.keep_alive = True, False
            self._connection.close()
        self._wake()

    def on_body(self, data: bytes) -> None:
        if self._complete:
            return
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered >= HIGH_WATER_BYTES:
            self._connection.pause()
        self._wake()

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        self._complete = True
        self._wake()

    def fail(self, error: UpstreamBroken) -> None:
        if not self._complete and self._error is None:
            self._error = error
        self._wake()

    def lost(self, reused: bool) -> None:
        """The connection closed: the end of a close-delimited body, or a break."""
        if self._complete:
            return
        if self._head and self._until_close:
            self._complete = True
            self._wake()
        elif not self._received and reused:
            self.fail(_Stale("connection closed before an answer"))
        elif not self._head:
            self.fail(UpstreamBroken("connection closed before an answer"))
        else:
            self.fail(UpstreamBroken("connection closed in the middle of the answer"))


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to a runtime; it carries one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, deadlines: _Deadlines | None = None) -> None:
        self.loop = loop
        self.deadlines = deadlines  # the pool's, for its waits' limits; None: a timer per wait
        self.transport: asyncio.Transport | None = None
        self.response: UpstreamResponse | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.uses = 0
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.response is None:  # bytes nobody asked for: the connection cannot be trusted any more
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.response.fail(UpstreamBroken("the function switched protocols unasked"))
            self.close()
        except httptools.HttpParserError as exc:
            self.response.fail(UpstreamBroken(f"invalid answer: {exc}"))
            self.close()

    def eof_received(self) -> bool:
        return False  # close: a runtime that stops sending is done with this connection

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.response is not None:
            self.response.lost(reused=self.uses > 1)

    # httptools callbacks, forwarded to the exchange in progress.

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is not None:
            self.response.on_header(name, value)

    def on_headers_complete(self) -> None:
        if self.response is not None:
            self.response.on_headers_complete(self.parser.get_status_code(), self.parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response.on_body(body)

    def on_message_complete(self) -> None:
        if self.response is not None:
            self.response.on_message_complete()

    def send(self, request: bytes, method: str) -> UpstreamResponse:
        """Write REQUEST; its answer comes through the response returned. A connection the runtime closed before
        the request went out (a runtime dying just after it accepted) answers at once as lost: uvloop's write on
        a closed transport raises RuntimeError, asyncio's drops the bytes and would wait for an answer until the
        call's limit."""
        assert self.transport is not None
        self.uses += 1
        response = self.response = UpstreamResponse(self, method)
        if not self.closed:
            try:
                self.transport.write(request)
                return response
            except RuntimeError:  # uvloop: "the handler is closed"
                self.closed = True
        response.lost(reused=self.uses > 1)
        return response

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()


def request_head(method: str, target: str, host: str, headers: Iterable[tuple[str, str]] | bytes,
                 body: bytes) -> bytes:
    """The request's bytes; a line break or NUL in the method, target or a header is refused (it would smuggle a
    second request or header into the runtime).

    ``headers`` as bytes: header lines made and checked already (``proxy.upstream_lines``).
    """
    if isinstance(headers, bytes):
        if _UNSAFE.search(method + target + host):
            raise UpstreamBroken("request not sent: a line break or NUL in its method, path or a header")
        length = b"Content-Length: %d\r\n" % len(body) if body or method not in BODILESS else b""
        return b"".join((f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n".encode("latin-1"), headers, length,
                         b"\r\n", body))
    fields = [method, target, host]
    parts = [method, " ", target, " HTTP/1.1\r\nHost: ", host, "\r\n"]
    for name, value in headers:
        fields += (name, value)
        parts += (name, ": ", value, "\r\n")
    if _UNSAFE.search("".join(fields)):
        raise UpstreamBroken("request not sent: a line break or NUL in its method, path or a header")
    if body or method not in BODILESS:
        parts += ("Content-Length: ", str(len(body)), "\r\n")
    parts.append("\r\n")
    return "".join(parts).encode("latin-1") + body


_UNSAFE = re.compile("[\r\n\0]")


class UpstreamPool:
    """Keep-alive connections to runtimes, by ``host:port``."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[UpstreamConnection]] = {}
        self._releases = 0
        self._deadlines: _Deadlines | None = None  # made with the first connection, on the loop that uses the pool

    async def exchange(self, host: str, port: int, method: str, request: bytes,
                       limit: float) -> tuple[UpstreamConnection, UpstreamResponse]:
        """Send ``request`` on a pooled or new connection and wait for the answer's head, ``limit`` seconds at
        most in all (TimeoutError). The connection goes back through ``release`` once the body was read."""
        deadline = time.monotonic() + limit
        connection = self._take((host, port))
        if connection is not None:
            try:
                return connection, await self._head(connection, request, method, deadline)
            except _Stale:
                if method not in IDEMPOTENT:
                    raise UpstreamBroken("connection closed before an answer") from None
        connection = await self._connect(host, port, deadline)
        return connection, await self._head(connection, request, method, deadline)

    @staticmethod
    async def _head(connection: UpstreamConnection, request: bytes, method: str, deadline: float) -> UpstreamResponse:
        response = connection.send(request, method)
        try:
            await response.wait_head(deadline - time.monotonic())
        except BaseException:
            connection.close()
            raise
        return response

    def _take(self, address: tuple[str, int]) -> UpstreamConnection | None:
        idle = self._idle.get(address)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if not connection.closed and now - connection.idle_since < KEEPALIVE_SEC:
                return connection
            connection.close()
        return None

    async def _connect(self, host: str, port: int, deadline: float) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        if self._deadlines is None:
            self._deadlines = _Deadlines(loop)
        deadlines = self._deadlines
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(lambda: UpstreamConnection(loop, deadlines), host, port),
                deadline - time.monotonic())
        except ConnectionRefusedError:
            raise UpstreamRefused("connection refused", refused=True) from None
        except OSError as exc:
            raise UpstreamRefused(f"cannot connect: {exc.strerror or exc}") from None
        return protocol

    def release(self, host: str, port: int, connection: UpstreamConnection) -> None:
        """Back to the pool if its answer was read whole and allows keep-alive, else closed."""
        response, connection.response = connection.response, None
        if connection.closed or response is None or not response.reusable:
            connection.close()
            return
        idle = self._idle.setdefault((host, port), [])
        if len(idle) >= MAX_IDLE_PER_ADDRESS:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        idle.append(connection)
        self._releases += 1
        if self._releases % PRUNE_EVERY == 0:
            self.prune()

    def prune(self) -> None:
        """Close idle connections past ``KEEPALIVE_SEC`` and forget closed ones and addresses left with none
        (a stopped function process's port is not asked for again)."""
        now = time.monotonic()
        for address, idle in list(self._idle.items()):
            kept = []
            for connection in idle:
                if connection.closed or now - connection.idle_since >= KEEPALIVE_SEC:
                    connection.close()
                else:
                    kept.append(connection)
            if kept:
                self._idle[address] = kept
            else:
                del self._idle[address]

    def idle_count(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    def addresses(self) -> int:
        return len(self._idle)

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
        if self._deadlines is not None:
            self._deadlines.close()
