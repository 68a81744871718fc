"""The proxy's HTTP/1.1 client against real sockets: a scripted server answers with exact bytes, so each framing
(Content-Length, chunked, close-delimited, HEAD, 100 Continue), keep-alive reuse and each way a runtime can
misbehave (closing a pooled connection, an invalid answer, a second answer nobody asked for) is what the client
really reads off a socket."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import pytest
import uvloop

from sless_api.gateway.upstream import (
    HIGH_WATER_BYTES,
    SWEEP_SEC,
    UpstreamBroken,
    UpstreamPool,
    UpstreamRefused,
    UpstreamResponse,
    request_head,
)
from tests.support.poll import until_async

#: (request bytes, its index on the connection) -> the answer's bytes; None closes the connection unanswered
Answerer = Callable[[bytes, int], bytes | None]


class Scripted:
    """A loopback server that reads one request head at a time and writes what ``answer`` returns."""

    def __init__(self, answer: Answerer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        index = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                out = self.answer(request, index)
                index += 1
                if out is None:
                    break
                writer.write(out)
                await writer.drain()
                if out.startswith(b"HTTP/1.0"):  # a close-delimited answer ends when the connection does
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])


@contextlib.asynccontextmanager
async def scripted(answer: Answerer) -> AsyncIterator[Scripted]:
    server = Scripted(answer)
    server.server = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    try:
        yield server
    finally:
        server.server.close()
        for writer in server.writers:  # Server.close leaves accepted connections open
            writer.close()


def ok(body: bytes = b"ok", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


async def fetch(pool: UpstreamPool, port: int, method: str = "GET", body: bytes = b"",
                headers: list[tuple[str, str]] | None = None) -> tuple[UpstreamResponse, bytes]:
    request = request_head(method, "/path?q=1", f"127.0.0.1:{port}", headers or [("X-A", "1")], body)
    connection, response = await pool.exchange("127.0.0.1", port, method, request, 5)
    parts = []
    try:
        while chunk := await response.readany(5, asyncio.get_running_loop().time() + 60):
            parts.append(chunk)
    finally:
        pool.release("127.0.0.1", port, connection)
    return response, b"".join(parts)


def run(coro: Callable[[], object]) -> None:
    asyncio.run(coro())  # type: ignore[arg-type]


def test_content_length_answers_reuse_one_connection() -> None:
    async def main() -> None:
        pool = UpstreamPool()
        async with scripted(lambda req, i: ok(b"answer %d" % i, b"X-Sless-Handler-Ms: 1.5\r\n")) as srv:
            for i in range(3):
                response, body = await fetch(pool, srv.port)
                assert (response.status, body) == (200, b"answer %d" % i)
                assert response.header(b"x-sless-handler-ms") == b"1.5"
            assert srv.connections == 1
            assert srv.requests[0].startswith(b"GET /path?q=1 HTTP/1.1\r\nHost: 127.0.0.1:")
            assert b"\r\nX-A: 1\r\n" in srv.requests[0] and b"content-length" not in srv.requests[0].lower()
        pool.close()
    run(main)


def test_a_post_without_body_says_content_length_0_and_a_body_is_sent_whole() -> None:
    async def main() -> None:
        pool = UpstreamPool()
        async with scripted(lambda req, i: ok()) as srv:
            await fetch(pool, srv.port, "POST")
            await fetch(pool, srv.port, "PUT", b"x" * 100_000)
            assert b"Content-Length: 0\r\n" in srv.requests[0]
            assert srv.requests[1].endswith(b"\r\n\r\n" + b"x" * 100_000)
        pool.close()
    run(main)


def test_chunked_body_is_decoded_and_the_connection_kept() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"

    async def main() -> None:
        pool = UpstreamPool()
        async with scripted(lambda req, i: chunked) as srv:
            for _ in range(2):
                _response, body = await fetch(pool, srv.port)
                assert body == b"abcde"
            assert srv.connections == 1
        pool.close()
    run(main)


def test_close_delimited_body_ends_at_close_and_is_not_reused() -> None:
    async def main() -> None:
        pool = UpstreamPool()
        async with scripted(lambda req, i: b"HTTP/1.0 200 OK\r\n\r\nuntil the end") as srv:
            response, body = await fetch(pool, srv.port)
            assert (response.status, body) == (200, b"until the end")
            response, body = await fetch(pool, srv.port)
            assert body == b"until the end"
            assert srv.connections == 2
        pool.close()
    run(main)


def test_head_answer_has_no_body_despite_its_length() -> None:
    async def main() -> None:
        pool = UpstreamPool()
        async with scripted(lambda req, i: b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n") as srv:
            response, body = await fetch(pool, srv.port, "HEAD")
            assert (response.status, body, response.header(b"content-length")) == (200, b"", b"5")
        pool.close()
    run(main)


def test_100_continue_is_skipped_for_the_real_answer() -> None:
    async def main() -> None:
        pool = UpstreamPool()
        async with scripted(lambda req, i: b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"real")) as srv:
            response, body = await fetch(pool, srv.port, "POST", b"data")
            assert (response.status, body) == (200, b"real")
            assert response.header(b"content-length") == b"4"
        pool.close()
    run(main)


def test_a_stale_pooled_connection_is_retried_for_get_but_not_for_post() -> None:
    async def main() -> None:
        pool = UpstreamPool()
        # each connection answers once, then closes on its next request without answering (a runtime that
        # closed an idle connection just as it was reused)
        async with scripted(lambda req, i: ok() if i == 0 else None) as srv:
            await fetch(pool, srv.port)
            _response, body = await fetch(pool, srv.port, "GET")
            assert body == b"ok" and srv.connections == 2
            with pytest.raises(UpstreamBroken, match="closed before an answer"):
                await fetch(pool, srv.port, "POST")
            assert srv.connections == 2
        pool.close()
    run(main)


def test_invalid_answer_and_early_close_are_errors() -> None:
    async def main() -> None:
        pool = UpstreamPool()
        async with scripted(lambda req, i: b"NOT HTTP AT ALL\r\n\r\n") as srv:
            with pytest.raises(UpstreamBroken, match="invalid answer"):
                await fetch(pool, srv.port)
        async with scripted(lambda req, i: b"HTTP/1.0 200 OK\r\nContent-Length: 10\r\n\r\nshort") as srv:
            with pytest.raises(UpstreamBroken, match="middle of the answer"):
                await fetch(pool, srv.port)
        pool.close()
    run(main)


def test_a_second_unasked_answer_makes_the_connection_unusable() -> None:
    async def main() -> None:
        pool = UpstreamPool()
        async with scripted(lambda req, i: ok(b"one") + ok(b"smuggled")) as srv:
            _, first = await fetch(pool, srv.port)
            _, second = await fetch(pool, srv.port)
            assert (first, second) == (b"one", b"one")
            assert srv.connections == 2
        pool.close()
    run(main)


def test_refused_connection_and_silent_runtime() -> None:
    async def main() -> None:
        pool = UpstreamPool()
        async with scripted(lambda req, i: ok()) as srv:
            port = srv.port
        with pytest.raises(UpstreamRefused, match="connection refused"):
            await fetch(pool, port)

        async def never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(3)
            writer.close()
        silent = await asyncio.start_server(never, "127.0.0.1", 0)
        request = request_head("GET", "/", "x", [], b"")
        with pytest.raises(TimeoutError):
            await pool.exchange("127.0.0.1", silent.sockets[0].getsockname()[1], "GET", request, 0.3)
        silent.close()
        pool.close()
    run(main)


def test_limits_of_a_second_or_more_are_kept_by_the_pools_sweep() -> None:
    """Waits of a second or more share one periodic check instead of a timer each: still on time (within the
    sweep's period), for the head and for the body's idle time, and the check stops once nothing waits."""
    async def main() -> None:
        pool = UpstreamPool()

        async def head_only(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")  # and the rest never comes
            await asyncio.sleep(5)
            writer.close()

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(5)
            writer.close()

        loop = asyncio.get_running_loop()
        for handler in (silent, head_only):
            server = await asyncio.start_server(handler, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            request = request_head("GET", "/", "x", [], b"")
            began, response = loop.time(), None
            with pytest.raises(TimeoutError):
                _, response = await pool.exchange("127.0.0.1", port, "GET", request, 1.2)
                assert await response.readany(1.2, loop.time() + 60) == b"abc"
                began = loop.time()
                await response.readany(1.2, loop.time() + 60)
            waited = loop.time() - began
            assert 1.2 <= waited < 1.2 + 0.4, waited
            if response is not None:
                response.close()
            server.close()
        await until_async("the sweep stopped once nothing waits", lambda: pool._deadlines is not None
                          and pool._deadlines.timer is None and not pool._deadlines.due, 2 * SWEEP_SEC, 0.01)
        pool.close()
    run(main)


@pytest.mark.parametrize("bad", [("X-A", "1\r\nX-Injected: 1"), ("X-A\r\nX-B", "1"), ("X-A", "a\nb"),
                                 ("X-A", "a\rb"), ("X-A", "nul\0")])
def test_line_breaks_in_a_header_are_refused(bad: tuple[str, str]) -> None:
    with pytest.raises(UpstreamBroken, match="line break"):
        request_head("GET", "/", "h", [bad], b"")


def test_a_line_break_in_the_path_is_refused() -> None:
    with pytest.raises(UpstreamBroken, match="line break"):
        request_head("GET", "/a HTTP/1.1\r\nHost: evil\r\n\r\nGET /b", "h", [], b"")


def test_a_large_body_is_read_whole_with_reading_paused_in_between() -> None:
    big = bytes(range(256)) * (3 * HIGH_WATER_BYTES // 256)

    async def main() -> None:
        pool = UpstreamPool()
        async with scripted(lambda req, i: ok(big)) as srv:
            request = request_head("GET", "/", "h", [], b"")
            connection, response = await pool.exchange("127.0.0.1", srv.port, "GET", request, 5)
            # the runtime writes ahead of the reader: reading pauses at the mark
            await until_async("reading paused at the high-water mark",
                              lambda: connection.transport is not None and not connection.transport.is_reading(),
                              5, 0.01)
            parts = []
            while chunk := await response.readany(5, asyncio.get_running_loop().time() + 60):
                parts.append(chunk)
                assert len(chunk) <= HIGH_WATER_BYTES + (1 << 18)
            pool.release("127.0.0.1", srv.port, connection)
            assert b"".join(parts) == big
        pool.close()
    run(main)


def test_prune_forgets_closed_connections_and_addresses_nobody_uses() -> None:
    async def main() -> None:
        pool = UpstreamPool()
        async with scripted(lambda req, i: ok()) as first, scripted(lambda req, i: ok()) as second:
            await fetch(pool, first.port)
            await fetch(pool, second.port)
            assert (pool.addresses(), pool.idle_count()) == (2, 2)
        # both servers closed their connections: the runtime's side of a stopped function process

        def pruned() -> bool:
            """Prune, once the pool has seen the closes (a moment after the servers went): nothing left."""
            pool.prune()
            return (pool.addresses(), pool.idle_count()) == (0, 0)

        await until_async("both closed connections and their addresses pruned", pruned, 5, 0.01)
        pool.close()
    run(main)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_connection_the_runtime_closed_before_the_request_is_a_broken_call_at_once(loop: str) -> None:
    """A runtime that dies just after accepting: its connection is lost before the request is written. The call
    fails at once as UpstreamBroken (the proxy's 502), on uvloop (whose write on a closed transport raises
    RuntimeError: it was a 500) and on asyncio's loop (which drops the bytes: the call waited for its limit)."""
    async def main() -> None:
        pool = UpstreamPool()
        accepted: list[asyncio.StreamWriter] = []
        server = await asyncio.start_server(lambda _r, w: accepted.append(w), "127.0.0.1", 0)
        port = int(server.sockets[0].getsockname()[1])
        connection = await pool._connect("127.0.0.1", port, time.monotonic() + 5)
        while not accepted:
            await asyncio.sleep(0.01)
        accepted[0].close()  # the runtime goes away before the request is sent
        while not connection.closed:  # the client has seen the connection lost
            await asyncio.sleep(0.01)
        started = time.monotonic()
        request = request_head("POST", "/", f"127.0.0.1:{port}", [], b"{}")
        with pytest.raises(UpstreamBroken, match="closed before an answer"):
            await pool._head(connection, request, "POST", time.monotonic() + 5)
        assert time.monotonic() - started < 1.0  # at once, not at the call's limit
        server.close()
        pool.close()

    if loop == "uvloop":
        uvloop.run(main())
    else:
        asyncio.run(main())
