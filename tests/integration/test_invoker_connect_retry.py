"""The proxy's upstream call survives an address that refuses connections for a while (nothing was sent, so every
try is safe for any method): a pod that got its SIGTERM before the node's Service rules dropped it, a process
being replaced. Real refused connections (a bound, not yet listening socket; a runtime process that closed its
listener on SIGTERM), not a fault injected into the client.

How long an address refuses is the one thing these tests choose (``REFUSING_SEC``): on a node it is the time
between the pod's SIGTERM and kube-proxy's next sync, which a rollout on a busy node showed to exceed the single
retry after 0.2 s the proxy made before (2 of 2,123 calls answered 502 "connection refused")."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from sless_api.domain.routing import Route
from sless_api.gateway.invoker import CONNECT_RETRY_PAUSES_SEC, Invoker
from tests.support.poll import until

REPO = Path(__file__).resolve().parents[2]
PYTHON_SERVER = REPO / "runtimes" / "python3.11" / "server.py"
#: How long the address refuses before something listens there again: longer than the old single retry's pause.
REFUSING_SEC = 1.0
#: How often the replacement test looks: the refusing window is measured from the moment the listener is seen closed.
STEP_SEC = 0.01
VERSIONED = "import os\n\ndef handle(event):\n    return {'version': os.environ['VERSION']}\n"


class OneAddress:
    """A router whose every route leads to one base URL (the part of a backend the Invoker uses)."""

    def __init__(self, base_url: str, timeout_sec: float = 5) -> None:
        self.base_url = base_url
        self.timeout_sec = timeout_sec

    async def route(self, namespace: str, name: str) -> Route:
        return Route(namespace, name, timeout_sec=self.timeout_sec, auth="public")

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
    await asyncio.sleep(after_sec)  # the address refuses this long (the scenario, not a wait for a condition)
    app = web.Application()
    app.router.add_post("/", _answer)
    runner = web.AppRunner(app)
    await runner.setup()
    sock.listen(16)
    await web.SockSite(runner, sock).start()
    return runner


async def _call_once(base_url: str, timeout_sec: float = 5, margin: float = 1.0) -> tuple[int, bytes, float]:
    """One buffered POST through a fresh Invoker: (status, body, seconds it took)."""
    invoker = Invoker(OneAddress(base_url, timeout_sec), None, margin)
    started = time.monotonic()
    try:
        result = await invoker.call(await invoker.platform.route("t", "f"), "POST", "/", [], b"{}", "http")
    finally:
        await invoker.close()
    return result.status, result.body, time.monotonic() - started


def test_an_address_refusing_for_a_second_is_answered_once_it_listens() -> None:
    async def run() -> tuple[int, bytes, float]:
        sock = _reserved_port()
        server = asyncio.create_task(_serve_on(sock, REFUSING_SEC))
        try:
            return await _call_once(f"http://127.0.0.1:{sock.getsockname()[1]}")
        finally:
            await (await server).cleanup()
            sock.close()

    status, body, elapsed = asyncio.run(run())
    assert (status, body) == (200, b"answered")
    assert elapsed >= REFUSING_SEC


def test_an_address_that_keeps_refusing_answers_502_after_every_pause() -> None:
    sock = _reserved_port()
    try:
        status, body, elapsed = asyncio.run(_call_once(f"http://127.0.0.1:{sock.getsockname()[1]}"))
    finally:
        sock.close()
    tries = len(CONNECT_RETRY_PAUSES_SEC) + 1
    assert status == 502 and b"function unreachable: connection refused" in body
    assert f"({tries} tries in ".encode() in body
    assert elapsed >= sum(CONNECT_RETRY_PAUSES_SEC)


def test_the_retries_end_at_the_calls_own_limit() -> None:
    sock = _reserved_port()
    try:
        status, body, elapsed = asyncio.run(_call_once(f"http://127.0.0.1:{sock.getsockname()[1]}", 0.5, 0.0))
    finally:
        sock.close()
    assert status == 502 and b"connection refused" in body
    assert elapsed < 1.0 < sum(CONNECT_RETRY_PAUSES_SEC)


def test_a_name_that_does_not_resolve_is_tried_once_more_only() -> None:
    status, body, elapsed = asyncio.run(_call_once("http://nothing.invalid:8080"))
    assert status == 502 and b"function unreachable: cannot connect" in body and b"(2 tries in " in body
    assert elapsed < 1.0


# -- a runtime process replaced under traffic ------------------------------------------------------------


def _start_runtime(code: Path, port: int, version: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLESS_") and k != "PORT"}
    env |= {"SLESS_HOST": "127.0.0.1", "PORT": str(port), "SLESS_CODE_DIR": str(code), "VERSION": version,
            "SLESS_DRAIN_SEC": "10"}  # fmt: skip
    return subprocess.Popen([sys.executable, str(PYTHON_SERVER)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def _runtimes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def test_a_runtime_replaced_under_traffic_drops_no_call(tmp_path: Path) -> None:
    """Two callers keep calling one address through one Invoker (pooled keep-alive connections) while the runtime
    there gets SIGTERM, closes its listener and its idle connections, and the next version listens on the same
    address only ``REFUSING_SEC`` later: every call is answered 200, by the old version or the new."""
    if not PYTHON_SERVER.is_file():
        pytest.skip("the python runtime is not in this checkout")
    (tmp_path / "handler.py").write_text(VERSIONED)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    answers: list[tuple[int, bytes]] = []
    stop = threading.Event()

    async def callers() -> None:
        invoker = Invoker(OneAddress(f"http://127.0.0.1:{port}"), None, 1.0)
        route = await invoker.platform.route("t", "f")

        async def keep_calling() -> None:
            while not stop.is_set():
                result = await invoker.call(route, "GET", "/", [], b"", "http")
                answers.append((result.status, result.body))
                await asyncio.sleep(0.005)

        try:
            await asyncio.gather(keep_calling(), keep_calling())
        finally:
            await invoker.close()

    with _runtimes() as procs:
        procs.append(_start_runtime(tmp_path, port, "1"))
        until("version 1 listening", lambda: _listening(port), 30, STEP_SEC)
        traffic = threading.Thread(target=asyncio.run, args=(callers(),), daemon=True)
        traffic.start()
        try:
            until("calls answered by version 1", lambda: len(answers) >= 20, 30, STEP_SEC)
            procs[0].send_signal(signal.SIGTERM)
            until("version 1 refusing connections", lambda: not _listening(port), 30, STEP_SEC)
            refusing_since = time.monotonic()
            until("version 1 gone", lambda: procs[0].poll() is not None, 30, STEP_SEC)
            # the address refuses REFUSING_SEC in all (the scenario), then version 2 takes it
            time.sleep(max(0.0, refusing_since + REFUSING_SEC - time.monotonic()))
            procs.append(_start_runtime(tmp_path, port, "2"))
            until("calls answered by version 2", lambda: any(b'"2"}' in body for _, body in answers[-10:]), 30,
                  STEP_SEC)
        finally:
            stop.set()
            traffic.join(30)
    failed = [answer for answer in answers if answer[0] != 200]
    assert not failed, failed[:5]
    versions = {body for _, body in answers}
    assert versions == {b'{"version":"1"}', b'{"version":"2"}'}, versions
