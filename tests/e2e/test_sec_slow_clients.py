"""Slow clients against real servers: `sless up` and `sless-api` (gunicorn) as processes on loopback.

Hundreds of connections that send part of a request line and then nothing must neither lock out other
clients nor stay open: each is closed once the head deadline passes (or earlier, evicted by the
connection cap), while `/health` keeps answering.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support.platform import SECRET, SlessProcess, Tenant, serving, start_sless
from tests.support.poll import until
from tests.support.services import free_port

pytestmark = [pytest.mark.e2e]

HEADER_TIMEOUT = 2.0
MAX_CONNECTIONS = 100
SLOW = 300
LIMITS = {"SLESS_HEADER_TIMEOUT_SEC": str(HEADER_TIMEOUT), "SLESS_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
          "SLESS_MAX_HEADER_BYTES": "16384"}


@pytest.fixture(scope="module")
def sless_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlessProcess]:
    sp = start_sless(Path(tmp_path_factory.mktemp("sless-slow")), LIMITS)
    yield sp
    assert sp.stop() == 0, sp.log_tail()


@pytest.fixture(scope="module")
def sless_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = Path(tmp_path_factory.mktemp("sless-api-slow"))
    port = free_port()
    env = {**os.environ, **LIMITS, "SLESS_JWT_SECRET": SECRET, "SLESS_DATA_DIR": str(data),
           "SLESS_BIND": f"127.0.0.1:{port}", "SLESS_WORKERS": "1"}
    env.pop("SLESS_DATABASE_URL", None)
    with serving([sys.executable, "-m", "sless_api.main.serve"], env, data / "sless-api.log",
                 f"http://127.0.0.1:{port}") as url:
        yield url


def open_slow(url: str, count: int) -> list[socket.socket]:
    """``count`` connections that each send the start of a request line and then nothing."""
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for _ in range(count):
        sock = socket.create_connection((host, int(port)), timeout=5)
        sock.sendall(b"GET /hea")
        socks.append(sock)
    return socks


def wait_closed(socks: list[socket.socket], within: float) -> tuple[list[socket.socket], list[bytes]]:
    """Read every socket until the server closes it or ``within`` seconds pass; the still-open ones and
    what the closed ones received."""
    sel = selectors.DefaultSelector()
    received: dict[socket.socket, bytes] = {}
    for sock in socks:
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
        received[sock] = b""
    open_ = set(socks)
    deadline = time.monotonic() + within
    while open_ and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.2):
            fileobj = key.fileobj
            assert isinstance(fileobj, socket.socket)
            sock = fileobj
            try:
                data = sock.recv(4096)
            except ConnectionResetError:
                data = b""
            if data:
                received[sock] += data
            else:
                sel.unregister(sock)
                open_.discard(sock)
    sel.close()
    closed = [received[s] for s in socks if s not in open_]
    return list(open_), closed


def health_times(url: str, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.monotonic()
        resp = requests.get(url + "/health", timeout=5, headers={"Connection": "close"})
        assert resp.status_code == 200, resp.text
        times.append(time.monotonic() - started)
    return times


def flood_and_check(url: str) -> None:
    socks = open_slow(url, SLOW)
    try:
        opened = time.monotonic()
        times = health_times(url, 20)
        assert max(times) < 1.0, times
        still_open, closed = wait_closed(socks, HEADER_TIMEOUT + 4 - (time.monotonic() - opened))
        assert not still_open, f"{len(still_open)} slow connections outlived the {HEADER_TIMEOUT} s head deadline"
        assert len(closed) == SLOW
        # The ones that were not evicted by the cap got a 408 before the close.
        timed_out = [c for c in closed if c.startswith(b"HTTP/1.1 408 ")]
        assert 0 < len(timed_out) <= MAX_CONNECTIONS, len(timed_out)
        assert all(b'"error"' in c for c in timed_out)
        assert max(health_times(url, 5)) < 1.0
    finally:
        for sock in socks:
            sock.close()


def test_sless_up_survives_slow_headers(sless_up: SlessProcess) -> None:
    flood_and_check(sless_up.url)


def test_silent_connections_are_closed_without_an_answer(sless_up: SlessProcess) -> None:
    """Not a byte sent: closed at the head deadline, and no 408 that a client would take for the
    answer to the request it sends next on its pre-opened connection."""
    host, port = sless_up.url.removeprefix("http://").split(":")
    socks = [socket.create_connection((host, int(port)), timeout=5) for _ in range(20)]
    try:
        started = time.monotonic()
        still_open, closed = wait_closed(socks, HEADER_TIMEOUT + 3)
        assert not still_open
        assert time.monotonic() - started >= HEADER_TIMEOUT - 0.5
        assert closed == [b""] * 20
    finally:
        for sock in socks:
            sock.close()


def test_sless_up_refuses_oversized_heads(sless_up: SlessProcess) -> None:
    big = {"X-Filler": "a" * 20000}
    resp = requests.get(sless_up.url + "/health", headers=big, timeout=10)
    assert resp.status_code == 431 and "error" in resp.json()
    assert requests.get(sless_up.url + "/health", headers={"X-Filler": "a" * 1000}, timeout=10).status_code == 200


def _post_head(tenant: Tenant, length: int) -> socket.socket:
    """A request to a route that reads its JSON body (so the app waits for it), minus the body."""
    host, port = tenant.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(f"POST /v1/namespaces/{tenant.ns}/functions HTTP/1.1\r\nHost: x\r\n"
                 f"Authorization: Bearer {tenant.token}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n".encode())
    return sock


def test_a_stalled_body_is_cut_a_slow_one_is_not(sless_up: SlessProcess) -> None:
    tenant = Tenant(sless_up.url, "slow-body")
    tenant.api("POST", "/ensure", expect=(200, 201))
    stalled = _post_head(tenant, 100)
    slow = _post_head(tenant, 6)
    try:
        stalled.sendall(b'{"a": ')
        started = time.monotonic()
        for byte in b'{"a":1}'[:6]:  # one byte every half head deadline: progress, never a stall
            slow.sendall(bytes([byte]))
            time.sleep(HEADER_TIMEOUT / 2)
        still_open, _ = wait_closed([stalled], max(1.0, HEADER_TIMEOUT + 3 - (time.monotonic() - started)))
        assert not still_open, "a body that stopped coming kept its connection"
        slow.settimeout(10)
        answer = slow.recv(4096)
        assert answer.startswith(b"HTTP/1.1 "), answer  # the request reached the app and was answered
        assert b"HTTP/1.1 408" not in answer
    finally:
        stalled.close()
        slow.close()


def test_a_head_whose_body_never_starts_is_cut(sless_up: SlessProcess) -> None:
    """The body deadline runs from the end of the head, even when not a byte of the body ever comes."""
    tenant = Tenant(sless_up.url, "no-body")
    tenant.api("POST", "/ensure", expect=(200, 201))
    silent = _post_head(tenant, 100)
    try:
        still_open, _ = wait_closed([silent], HEADER_TIMEOUT + 3)
        assert not still_open, "a head announcing a body that never came kept its connection"
    finally:
        silent.close()


def test_idle_keep_alive_connections_are_evicted_before_new_clients_are_refused(sless_up: SlessProcess) -> None:
    """Cap full of idle keep-alive connections: a new client still gets in."""
    sessions = []
    try:
        for _ in range(MAX_CONNECTIONS):
            s = requests.Session()
            assert s.get(sless_up.url + "/health", timeout=5).status_code == 200
            sessions.append(s)
        assert max(health_times(sless_up.url, 5)) < 1.0
    finally:
        for s in sessions:
            s.close()


def test_sless_api_survives_slow_headers(sless_api: str) -> None:
    flood_and_check(sless_api)


def test_only_a_server_busy_on_every_connection_refuses_new_ones(tmp_path: Path) -> None:
    """The cap evicts waiting connections first; when every connection is in a request, 503."""
    cap = 5
    # A long head/body deadline: the busy connections must outlive the test's checks.
    sp = start_sless(tmp_path / "data", {**LIMITS, "SLESS_MAX_CONNECTIONS": str(cap), "SLESS_HEADER_TIMEOUT_SEC": "30"})
    busy: list[socket.socket] = []
    try:
        tenant = Tenant(sp.url, "slow-client-busy")
        token = tenant.token
        tenant.api("POST", "/ensure", expect=(200, 201))
        host, port = sp.url.removeprefix("http://").split(":")
        for _ in range(cap):
            sock = socket.create_connection((host, int(port)), timeout=5)
            # A complete head that promises a body it never sends: the request is in progress.
            sock.sendall(f"POST /v1/namespaces/{tenant.ns}/functions HTTP/1.1\r\nHost: x\r\n"
                         f"Authorization: Bearer {token}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode())
            busy.append(sock)
        # a list: a 503 Response is falsy (Response.__bool__ is .ok)
        [refused] = until("every connection in a request: a new client refused",
                          lambda: [r] if (r := requests.get(sp.url + "/health", timeout=5)).status_code == 503
                          else None, 10, 0.1)
        assert "connection limit" in refused.json()["error"]
        for sock in busy:
            sock.close()
        busy.clear()
        deadline = time.monotonic() + 5
        while requests.get(sp.url + "/health", timeout=5).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        for sock in busy:
            sock.close()
        sp.stop()


KEEPALIVE = 1.0


@pytest.fixture(scope="module")
def short_keepalive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlessProcess]:
    """Keep-alive shorter than the head deadline, so each one's effect is told apart."""
    sp = start_sless(Path(tmp_path_factory.mktemp("sless-keepalive")),
                     {**LIMITS, "SLESS_KEEPALIVE_SEC": str(int(KEEPALIVE)), "SLESS_HEADER_TIMEOUT_SEC": "3"})
    yield sp
    assert sp.stop() == 0, sp.log_tail()


def _health_on(sock: socket.socket) -> bytes:
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    return answer


def test_an_idle_keep_alive_connection_is_closed_after_its_limit(short_keepalive: SlessProcess) -> None:
    host, port = short_keepalive.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        _health_on(sock)
        answered = time.monotonic()
        time.sleep(KEEPALIVE / 2)
        _health_on(sock)  # still open at half the limit, and the limit starts again from this answer
        answered = time.monotonic()
        still_open, closed = wait_closed([sock], KEEPALIVE + 2)
        assert not still_open and closed == [b""]
        assert time.monotonic() - answered >= KEEPALIVE - 0.3


def test_a_busy_keep_alive_connection_is_never_closed(short_keepalive: SlessProcess) -> None:
    host, port = short_keepalive.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        for _ in range(7):  # 4 s of requests 0.6 s apart: several keep-alive limits, never one of idleness
            _health_on(sock)
            time.sleep(0.6 * KEEPALIVE)
        _health_on(sock)


def test_a_head_begun_on_a_keep_alive_connection_gets_the_head_deadline(short_keepalive: SlessProcess) -> None:
    """A next request's head that started keeps the connection past the keep-alive limit, until the head
    deadline: then it is answered 408, as on a fresh connection."""
    host, port = short_keepalive.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        _health_on(sock)
        sock.sendall(b"GET /hea")
        begun = time.monotonic()
        still_open, _ = wait_closed([sock], KEEPALIVE + 0.5)
        assert still_open, "a head in progress was closed at the keep-alive limit"
        still_open, closed = wait_closed([sock], 5)
        assert not still_open and closed[0].startswith(b"HTTP/1.1 408"), closed
        assert time.monotonic() - begun >= 3 - 0.3
