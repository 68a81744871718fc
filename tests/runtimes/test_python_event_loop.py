"""The Python runtime's epoll server and handler threads: idle connections cost no thread, the pool is
bounded (and grows past handlers that block, so probes do not wait behind them), and requests that arrive
in pieces are put together."""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.poll import holds

PY = "python3.11"
ServerFactory = Callable[..., Any]
LoadFailure = Callable[..., str]


@pytest.fixture(autouse=True)
def _python_runtime_written() -> None:
    if not (Path(__file__).resolve().parents[2] / "runtimes" / PY / "server.py").is_file():
        pytest.skip("runtimes/python3.11/server.py not written yet")


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def read_response(sock: socket.socket) -> bytes:
    """One Content-Length framed response from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_idle_keep_alive_connections_cost_no_thread(start_server: ServerFactory) -> None:
    server = start_server(PY, env={"SLESS_HANDLER_THREADS": "4", "SLESS_MAX_HANDLER_THREADS": "4"})
    socks = []
    try:
        for _ in range(300):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.sendall(b"GET /text HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock).endswith(b"hello")
            socks.append(sock)
        # main (event loop), watchdog, at most 4 handler threads
        assert threads_of(server.proc.pid) <= 6
        started = time.monotonic()
        for sock in socks[::30]:  # every connection is still served
            sock.sendall(b"GET /number HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock).endswith(b"42")
        assert time.monotonic() - started < 5
    finally:
        for sock in socks:
            sock.close()


def test_pool_bounds_concurrent_handlers(start_server: ServerFactory) -> None:
    server = start_server(PY, env={"SLESS_HANDLER_THREADS": "2", "SLESS_MAX_HANDLER_THREADS": "2"})
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        started = time.monotonic()
        calls = [pool.submit(requests.get, f"{server.url}/slow?s=1", timeout=30) for _ in range(4)]
        assert [c.result().status_code for c in calls] == [200] * 4
        elapsed = time.monotonic() - started
    assert elapsed >= 1.9, f"4 x 1 s on 2 threads took {elapsed:.2f} s: the pool is not bounded"


def test_probe_does_not_wait_behind_blocked_handlers(start_server: ServerFactory) -> None:
    server = start_server(PY, env={"SLESS_HANDLER_THREADS": "2"})
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        calls = [pool.submit(requests.get, f"{server.url}/slow?s=3", timeout=30) for _ in range(4)]
        time.sleep(0.5)  # the scenario: the calls get into their 3 s handlers (the runtime reports no such state)
        # both core threads are stuck in handlers: the pool has grown past them
        probe_started = time.monotonic()
        assert requests.get(f"{server.url}/_/health", timeout=10).status_code == 200
        assert time.monotonic() - probe_started < 1.0
        assert [c.result().status_code for c in calls] == [200] * 4


def test_pool_grows_past_blocked_handlers(start_server: ServerFactory) -> None:
    server = start_server(PY, env={"SLESS_HANDLER_THREADS": "2"})  # the ceiling stays at its default
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        started = time.monotonic()
        calls = [pool.submit(requests.get, f"{server.url}/slow?s=2", timeout=30) for _ in range(12)]
        assert [c.result().status_code for c in calls] == [200] * 12
        elapsed = time.monotonic() - started
    assert elapsed < 5.0, f"12 x 2 s took {elapsed:.1f} s: sleeping handlers did not get threads of their own"


def test_pool_ceiling_holds_while_handlers_block(start_server: ServerFactory) -> None:
    server = start_server(PY, env={"SLESS_HANDLER_THREADS": "1", "SLESS_MAX_HANDLER_THREADS": "3"})
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        started = time.monotonic()
        calls = [pool.submit(requests.get, f"{server.url}/slow?s=1", timeout=30) for _ in range(6)]
        holds("at most 3 handler threads (with main and watchdog: 5)", lambda: threads_of(server.proc.pid) <= 5,
              for_sec=0.6, why="the 6 calls come at once; a pool that grew past its ceiling would start a thread "
              "for each blocked call as it arrives, within milliseconds; 0.6 s is that and stays inside the 1 s "
              "handlers")
        assert [c.result().status_code for c in calls] == [200] * 6
        elapsed = time.monotonic() - started
    assert 1.9 <= elapsed < 4.5


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"SLESS_HANDLER_THREADS": "0"}, "SLESS_HANDLER_THREADS"),
        ({"SLESS_HANDLER_THREADS": "many"}, "SLESS_HANDLER_THREADS"),
        ({"SLESS_MAX_HANDLER_THREADS": "-3"}, "SLESS_MAX_HANDLER_THREADS"),
    ],
)
def test_bad_pool_settings_exit_non_zero(load_failure: LoadFailure, env: dict[str, str], needle: str) -> None:
    assert needle in load_failure(PY, None, env)


def test_request_in_pieces_is_put_together(start_server: ServerFactory) -> None:
    server = start_server(PY)
    body = json.dumps({"piece": "x" * 5000}).encode()
    request = (b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        for i in range(0, len(request), 700):  # head and body split at arbitrary points
            sock.sendall(request[i:i + 700])
            time.sleep(0.01)
        answer = read_response(sock)
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["piece"] == "x" * 5000


def test_chunked_body_in_pieces_with_pipelined_request(start_server: ServerFactory) -> None:
    server = start_server(PY)
    data = (b"POST /raw HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n"
            b"6\r\n world\r\n"
            b"0\r\nX-Trailer: t\r\n\r\n"
            b"GET /text HTTP/1.1\r\nHost: x\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        for i in range(0, len(data), 3):
            sock.sendall(data[i:i + 3])
            time.sleep(0.002)
        first = read_response(sock)
        second = read_response(sock)
    assert first.startswith(b"HTTP/1.1 200 ") and first.endswith(b"hello world")
    assert second.endswith(b"hello")


@pytest.mark.parametrize(
    "chunked",
    [
        b"5\r\nhelloXX",  # no CRLF after the chunk's data
        b"5\r\nhello\r\n" + b"1" * 9000,  # a size line without end
    ],
)
def test_bad_chunked_framing_is_400(start_server: ServerFactory, chunked: bytes) -> None:
    server = start_server(PY)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /raw HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
        answer = read_response(sock)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert requests.get(f"{server.url}/text", timeout=10).text == "hello"


def test_client_that_leaves_mid_request_is_forgotten(start_server: ServerFactory) -> None:
    server = start_server(PY)
    for partial in (b"GET /text HTTP/1.1\r\nHost:", b"POST /echo HTTP/1.1\r\nContent-Length: 100\r\n\r\n{"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(partial)
    assert requests.get(f"{server.url}/text", timeout=10).text == "hello"
    fds = len(os.listdir(f"/proc/{server.proc.pid}/fd"))
    assert fds < 20, f"{fds} open descriptors: connections of clients that left were kept"


BARRIER_HANDLER = '''import threading

CALLS = 40
#: every call waits here until all of them are inside the handler at once (or the barrier gives up)
meeting = threading.Barrier(CALLS)


def handle(event):
    meeting.wait(timeout=60)
    return "met"
'''


def test_blocked_handlers_get_a_thread_each(start_server: ServerFactory, tmp_path: Path) -> None:
    """One thread serves requests while they keep finishing; handlers that block (here: on each other) get a
    thread each, whatever SLESS_HANDLER_THREADS, so 40 calls can all be inside the handler at once."""
    (tmp_path / "handler.py").write_text(BARRIER_HANDLER)
    server = start_server(PY, code_dir=tmp_path, env={"SLESS_HANDLER_THREADS": "1", "SLESS_TIMEOUT_SEC": "120"})
    with concurrent.futures.ThreadPoolExecutor(40) as pool:
        calls = [pool.submit(requests.get, f"{server.url}/", timeout=120) for _ in range(40)]
        answers = [c.result() for c in calls]
    assert [(a.status_code, a.text) for a in answers] == [(200, "met")] * 40


def test_blocked_handlers_stay_within_the_ceiling(start_server: ServerFactory, tmp_path: Path) -> None:
    """The same calls with SLESS_MAX_HANDLER_THREADS=8: never more than 8 in the handler at once (the barrier
    of 40 breaks instead of being met), and the process keeps its thread count."""
    (tmp_path / "handler.py").write_text(BARRIER_HANDLER.replace("timeout=60", "timeout=1"))
    server = start_server(PY, code_dir=tmp_path, env={"SLESS_HANDLER_THREADS": "1", "SLESS_MAX_HANDLER_THREADS": "8",
                                                      "SLESS_TIMEOUT_SEC": "120"})
    with concurrent.futures.ThreadPoolExecutor(40) as pool:
        calls = [pool.submit(requests.get, f"{server.url}/", timeout=120) for _ in range(40)]
        answers = [c.result() for c in calls]
    assert all(a.status_code == 500 and "BrokenBarrierError" in a.text for a in answers), answers[0].text
    assert threads_of(server.proc.pid) <= 10  # main, watchdog, at most 8 handler threads
