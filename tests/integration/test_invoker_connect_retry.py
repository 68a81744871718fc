"""The proxy's upstream call survives an address that refuses its first connection (nothing was sent, so the
second try is safe for any method): a pod that has just left its Service, a process being replaced. A real
refused connection (a bound, not yet listening socket), not a fault injected into the client."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from sless_api import proxy
from sless_api.platform import Route


class OneAddress:
    """A router whose every route leads to one base URL (the part of a backend the Invoker uses)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    async def route(self, namespace: str, name: str) -> Route:
        return Route(namespace, name, timeout_sec=5, auth="public")

    async def event_route(self, namespace: str, name: str) -> Route:
        return await self.route(namespace, name)

    @contextlib.asynccontextmanager
    async def upstream(self, route: Route) -> AsyncIterator[str]:
        yield self.base_url

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        return lambda: None

    async def start(self) -> None: ...

    async def close(self) -> None: ...


def _reserved_port() -> socket.socket:
    """A bound socket that does not listen: connections to its port are refused until it does."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


async def _answer(request: web.Request) -> web.Response:
    return web.Response(text="answered")


async def _serve_on(sock: socket.socket, after_sec: float) -> web.AppRunner:
    await asyncio.sleep(after_sec)
    app = web.Application()
    app.router.add_post("/", _answer)
    runner = web.AppRunner(app)
    await runner.setup()
    sock.listen(16)
    await web.SockSite(runner, sock).start()
    return runner


def test_a_refused_connection_is_tried_once_more(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proxy, "CONNECT_RETRY_PAUSE_SEC", 1.0)  # the listener starts in between

    async def run() -> tuple[int, bytes]:
        sock = _reserved_port()
        invoker = proxy.Invoker(OneAddress(f"http://127.0.0.1:{sock.getsockname()[1]}"), None, 1.0)
        server = asyncio.create_task(_serve_on(sock, 0.3))
        try:
            result = await invoker.call(await invoker.platform.route("t", "f"), "POST", "/", [], b"{}", "http")
        finally:
            await (await server).cleanup()
            await invoker.close()
            sock.close()
        return result.status, result.body

    assert asyncio.run(run()) == (200, b"answered")


def test_an_address_that_keeps_refusing_answers_502_after_the_second_try() -> None:
    async def run() -> tuple[int, bytes, float]:
        sock = _reserved_port()
        invoker = proxy.Invoker(OneAddress(f"http://127.0.0.1:{sock.getsockname()[1]}"), None, 1.0)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            result = await invoker.call(await invoker.platform.route("t", "f"), "POST", "/", [], b"{}", "http")
        finally:
            await invoker.close()
            sock.close()
        return result.status, result.body, loop.time() - started

    status, body, elapsed = asyncio.run(run())
    assert status == 502 and b"function unreachable: connection refused" in body
    assert elapsed >= proxy.CONNECT_RETRY_PAUSE_SEC  # it waited for the second try
