"""Python-only behaviour of the python3.11 runtime, beyond the shared contract.

Async handlers, module loading (dependency directory, dotted entrypoints, no
shadowing by the runtime's own files), Python-specific result types, the
documented fate of a timed-out handler thread, HTTP edge cases of the
hand-written parser, and configuration errors. Real server processes, as in
test_contract.py.
"""

from __future__ import annotations

import json
import socket
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

PY = "python3.11"
ServerFactory = Callable[..., Any]
RunnerFactory = Callable[..., Any]
LoadFailure = Callable[..., str]


@pytest.fixture(autouse=True)
def _python_runtime_written() -> None:
    """Skip (like the shared harness does) while the runtime's entry files are missing."""
    runtime_dir = Path(__file__).resolve().parents[2] / "runtimes" / PY
    if not (runtime_dir / "server.py").is_file() or not (runtime_dir / "runner.py").is_file():
        pytest.skip("runtimes/python3.11/server.py, runner.py not written yet")


def write_function(root: Path, source: str, name: str = "handler.py", files: dict[str, str] | None = None) -> Path:
    """A code directory with ``name`` (dedented ``source``) and extra files."""
    code = root / "fn"
    code.mkdir(exist_ok=True)
    (code / name).write_text(textwrap.dedent(source))
    for rel, text in (files or {}).items():
        path = code / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return code


def raw_exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes, read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        out = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return out
            if not chunk:
                return out
            out += chunk


# --------------------------------------------------------------------------- async handlers


#: Handlers write their marker whole (a temporary file renamed into place): a test polling for the marker must
#: never find it created but still empty.
PUBLISH = """
    import os

    def publish(path, text):
        with open(path + ".tmp", "w") as out:
            out.write(text)
        os.replace(path + ".tmp", path)
"""

ASYNC_SOURCE = PUBLISH + """
    import asyncio

    async def handle(event):
        seconds = float(event["_query"].get("s", "0"))
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            publish(event["_query"]["marker"], "cancelled")
            raise
        return {"slept": seconds}
"""


def test_async_handlers_run_concurrently(start_server: ServerFactory, tmp_path: Path) -> None:
    server = start_server(PY, write_function(tmp_path, ASYNC_SOURCE))
    results: list[int] = []

    def call() -> None:
        results.append(requests.get(f"{server.url}/x?s=2", timeout=30).status_code)

    threads = [threading.Thread(target=call) for _ in range(10)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [200] * 10
    assert time.monotonic() - started < 8.0


def test_async_handler_timeout_cancels_it(start_server: ServerFactory, tmp_path: Path) -> None:
    server = start_server(PY, write_function(tmp_path, ASYNC_SOURCE), env={"SLESS_TIMEOUT_SEC": "1"})
    marker = tmp_path / "cancelled"
    resp = requests.get(f"{server.url}/x", params={"s": "10", "marker": str(marker)}, timeout=30)
    assert resp.status_code == 504
    assert resp.json() == {"error": "function timed out after 1s", "type": "Timeout"}
    deadline = time.monotonic() + 5
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.read_text() == "cancelled"
    assert requests.get(f"{server.url}/x?s=0", timeout=10).json() == {"slept": 0.0}


def test_runner_awaits_async_handler(run_runner: RunnerFactory, tmp_path: Path) -> None:
    code = write_function(tmp_path, "async def handle(event):\n    return {'got': event}\n")
    proc = run_runner(PY, {"a": 1}, code_dir=code)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"got": {"a": 1}}


# --------------------------------------------------------------------------- the timed-out thread


def test_timed_out_sync_handler_keeps_running(start_server: ServerFactory, tmp_path: Path) -> None:
    code = write_function(
        tmp_path,
        PUBLISH
        + """
    import time

    def handle(event):
        time.sleep(2.5)
        publish(event["_query"]["marker"], "finished")
        return "late"
""",
    )
    server = start_server(PY, code, env={"SLESS_TIMEOUT_SEC": "1"})
    marker = tmp_path / "finished"
    resp = requests.get(f"{server.url}/x", params={"marker": str(marker)}, timeout=30)
    assert resp.status_code == 504
    assert resp.headers["Connection"] == "close"
    assert not marker.exists()
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.read_text() == "finished"
    assert "keeps running" in server.stderr


# --------------------------------------------------------------------------- loading


def test_deps_dir_and_code_dir_on_sys_path(start_server: ServerFactory, tmp_path: Path) -> None:
    deps = tmp_path / "deps"
    (deps / "somelib").mkdir(parents=True)
    (deps / "somelib" / "__init__.py").write_text("VALUE = 'from-deps'\n")
    code = write_function(
        tmp_path,
        """
        import helper
        import somelib

        def handle(event):
            return {"helper": helper.NAME, "lib": somelib.VALUE}
        """,
        files={"helper.py": "NAME = 'local-helper'\n"},
    )
    server = start_server(PY, code, env={"SLESS_DEPS_DIR": str(deps)})
    assert requests.get(f"{server.url}/x", timeout=10).json() == {"helper": "local-helper", "lib": "from-deps"}


def test_user_modules_named_like_runtime_files_are_the_users(
    start_server: ServerFactory, run_runner: RunnerFactory, tmp_path: Path
) -> None:
    code = write_function(
        tmp_path,
        """
        import runner
        import server

        def handle(event):
            return [server.WHO, runner.WHO]
        """,
        files={"server.py": "WHO = 'user-server'\n", "runner.py": "WHO = 'user-runner'\n"},
    )
    server = start_server(PY, code)
    assert requests.get(f"{server.url}/x", timeout=10).json() == ["user-server", "user-runner"]
    proc = run_runner(PY, {}, code_dir=code)
    assert json.loads(proc.stdout) == ["user-server", "user-runner"]


def test_dotted_entrypoint(start_server: ServerFactory, tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "",
        "pkg/sub/mod.py": "def main(event):\n    return 'dotted'\n",
    }
    code = write_function(tmp_path, "X = 1\n", name="unused.py", files=files)
    server = start_server(PY, code, env={"SLESS_ENTRYPOINT": "pkg.sub.mod.main"})
    assert requests.get(f"{server.url}/x", timeout=10).text == "dotted"


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"SLESS_ENTRYPOINT": "handler"}, "module.function"),
        ({"SLESS_ENTRYPOINT": "handler.VALUE"}, "not callable"),
        ({"SLESS_TIMEOUT_SEC": "soon"}, "SLESS_TIMEOUT_SEC"),
        ({"SLESS_MAX_BODY_BYTES": "-1"}, "SLESS_MAX_BODY_BYTES"),
        ({"PORT": "http"}, "PORT"),
    ],
)
def test_bad_configuration_exits_non_zero(
    load_failure: LoadFailure, tmp_path: Path, env: dict[str, str], needle: str
) -> None:
    code = write_function(tmp_path, "VALUE = 1\n\ndef handle(event):\n    return 1\n")
    assert needle in load_failure(PY, code, env)


def test_import_error_traceback_on_stderr(load_failure: LoadFailure, tmp_path: Path) -> None:
    code = write_function(tmp_path, "import no_such_dependency_xyz\n\ndef handle(event):\n    return 1\n")
    stderr = load_failure(PY, code)
    assert "Traceback" in stderr
    assert "no_such_dependency_xyz" in stderr


def test_port_in_use_exits_non_zero(load_failure: LoadFailure) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert "cannot listen" in load_failure(PY, None, {"PORT": str(port)})


# --------------------------------------------------------------------------- results


RESULTS_SOURCE = """
    def handle(event):
        case = event["_path"].rsplit("/", 1)[-1]
        if case == "bytes":
            return b"\\x00\\xffraw"
        if case == "bool-status":
            return {"statusCode": True, "body": "x"}
        if case == "string-status":
            return {"statusCode": "201"}
        if case == "range":
            return {"statusCode": 99}
        if case == "inject":
            return {"statusCode": 200, "headers": {"X-A": "1\\r\\nX-Injected: yes"}, "body": "x"}
        if case == "framing":
            return {"statusCode": 202, "headers": {"Content-Length": "999", "X-Ok": 5}, "body": "abc"}
        if case == "typed":
            return {"statusCode": 200, "headers": {"content-type": "text/csv"}, "body": "a,b"}
        if case == "empty":
            return {"statusCode": 204}
        if case == "set":
            return {1, 2}
        if case == "nan":
            return float("nan")
        if case == "exit":
            raise SystemExit(3)
        if case == "print":
            print("log line from the handler")
            return "printed"
        if case == "silent-error":
            raise KeyError()
        return None
"""


def test_python_result_types(start_server: ServerFactory, tmp_path: Path) -> None:
    server = start_server(PY, write_function(tmp_path, RESULTS_SOURCE))

    def get(case: str) -> requests.Response:
        return requests.get(f"{server.url}/{case}", timeout=10)

    resp = get("bytes")
    assert resp.headers["Content-Type"] == "application/octet-stream"
    assert resp.content == b"\x00\xffraw"
    # Only an integer (not a bool, not a string) makes a dict a response description.
    assert get("bool-status").json() == {"statusCode": True, "body": "x"}
    assert get("string-status").json() == {"statusCode": "201"}
    resp = get("framing")
    assert resp.status_code == 202
    assert resp.content == b"abc"
    assert resp.headers["Content-Length"] == "3"
    assert resp.headers["X-Ok"] == "5"
    resp = get("typed")
    assert resp.headers["Content-Type"] == "text/csv"
    assert resp.text == "a,b"
    resp = get("empty")
    assert resp.status_code == 204
    assert resp.content == b""
    assert get("null").json() is None


@pytest.mark.parametrize(
    ("case", "type_"),
    [
        ("range", "InvalidResponse"),
        ("inject", "InvalidResponse"),
        ("set", "InvalidResponse"),
        ("nan", "InvalidResponse"),
        ("exit", "SystemExit"),
        ("silent-error", "KeyError"),
    ],
)
def test_bad_results_are_500(start_server: ServerFactory, tmp_path: Path, case: str, type_: str) -> None:
    server = start_server(PY, write_function(tmp_path, RESULTS_SOURCE))
    resp = requests.get(f"{server.url}/{case}", timeout=10)
    assert resp.status_code == 500
    body = resp.json()
    assert body["type"] == type_
    assert body["error"]
    assert "X-Injected" not in resp.headers
    assert requests.get(f"{server.url}/print", timeout=10).text == "printed"


def test_handler_output_reaches_stdout_promptly(start_server: ServerFactory, tmp_path: Path) -> None:
    server = start_server(PY, write_function(tmp_path, RESULTS_SOURCE))
    assert requests.get(f"{server.url}/print", timeout=10).text == "printed"
    deadline = time.monotonic() + 5
    while "log line from the handler" not in server.stdout and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "log line from the handler" in server.stdout


# --------------------------------------------------------------------------- HTTP edge cases


def test_pipelined_requests_answered_in_order(start_server: ServerFactory) -> None:
    server = start_server(PY)
    data = (
        b"GET /text HTTP/1.1\r\nHost: x\r\n\r\n"
        b'POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n{"a":7}'
        b"GET /number HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    out = raw_exchange(server.port, data)
    assert out.count(b"HTTP/1.1 200 OK") == 3
    first, second, third = out.index(b"hello"), out.index(b'"a":7'), out.rindex(b"42")
    assert first < second < third


def test_http10_closes_unless_keep_alive(start_server: ServerFactory) -> None:
    server = start_server(PY)
    out = raw_exchange(server.port, b"GET /text HTTP/1.0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 OK")
    assert out.endswith(b"hello")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET /text HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        first = b""
        while not first.endswith(b"hello"):  # the whole first answer, then the next request
            chunk = sock.recv(65536)
            assert chunk, f"closed after {first!r}"
            first += chunk
        assert b"Connection: keep-alive" in first
        sock.sendall(b"GET /number HTTP/1.0\r\n\r\n")
        rest = b""
        while chunk := sock.recv(65536):
            rest += chunk
        assert rest.endswith(b"42")


def test_expect_100_continue(start_server: ServerFactory) -> None:
    server = start_server(PY)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"POST /raw HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(b"abcde")
        resp = b""
        while not resp.endswith(b"abcde"):
            resp += sock.recv(65536)
        assert resp.startswith(b"HTTP/1.1 200 OK")


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"NONSENSE\r\n\r\n", 400),
        (b"GET /text HTTP/2.0\r\n\r\n", 505),
        (b"GET /text HTTP/1.1\r\nBad Header\r\n\r\n", 400),
        (b"POST /echo HTTP/1.1\r\nContent-Length: x1\r\n\r\n", 400),
        (b"POST /echo HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        (b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
        (b"GET /text HTTP/1.1\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n", 431),
    ],
)
def test_malformed_requests_get_json_errors(start_server: ServerFactory, request_bytes: bytes, status: int) -> None:
    server = start_server(PY)
    out = raw_exchange(server.port, request_bytes)
    assert out.startswith(f"HTTP/1.1 {status} ".encode())
    body = json.loads(out.split(b"\r\n\r\n", 1)[1])
    assert set(body) == {"error", "type"}
    assert requests.get(f"{server.url}/text", timeout=10).text == "hello"


def test_absolute_form_target(start_server: ServerFactory) -> None:
    server = start_server(PY)
    out = raw_exchange(
        server.port, b"GET http://example.test/a/echo?q=1 HTTP/1.1\r\nHost: example.test\r\nConnection: close\r\n\r\n"
    )
    event = json.loads(out.split(b"\r\n\r\n", 1)[1])
    assert event["_path"] == "/a/echo"
    assert event["_query"] == {"q": "1"}


# --------------------------------------------------------------------------- runner


def test_runner_default_event_is_empty_object(run_runner: RunnerFactory) -> None:
    proc = run_runner(PY, None)  # SLESS_EVENT unset: the shared function echoes {}
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {}


def test_runner_rejects_non_object_event(run_runner: RunnerFactory) -> None:
    proc = run_runner(PY, "[1, 2]")
    assert proc.returncode == 2
    assert "JSON object" in proc.stderr


def test_runner_load_failure_exits_1(run_runner: RunnerFactory) -> None:
    proc = run_runner(PY, {}, env={"SLESS_ENTRYPOINT": "handler.missing"})
    assert proc.returncode == 1
    assert "missing" in proc.stderr


def test_runner_traceback_on_stderr(run_runner: RunnerFactory) -> None:
    proc = run_runner(PY, {"case": "crash"})
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr
    assert "ZeroDivisionError" in proc.stderr


def test_runner_unserializable_result_exits_1(run_runner: RunnerFactory, tmp_path: Path) -> None:
    code = write_function(tmp_path, "def handle(event):\n    return object()\n")
    proc = run_runner(PY, {}, code_dir=code)
    assert proc.returncode == 1
    assert "JSON" in proc.stderr


# --------------------------------------------------------------------------- signals


def test_sigterm_delivered_to_a_worker_thread_still_drains(start_server: ServerFactory) -> None:
    """The kernel may hand a process signal to any thread; the main thread must still notice."""
    import ctypes
    import os
    import signal

    server = start_server(PY)
    conn = server.connection()
    conn.request("GET", "/text")  # keeps a connection thread alive
    assert conn.getresponse().read() == b"hello"
    pid = server.proc.pid
    others = [int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid]
    assert others, "expected the watchdog and connection threads"
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.tgkill(pid, others[-1], signal.SIGTERM) == 0, ctypes.get_errno()
    assert server.proc.wait(timeout=15) == 0
    conn.close()


def test_async_websocket_handler_is_refused_with_a_reason(start_server: Any, tmp_path: Path) -> None:
    """Websocket handlers are plain functions: an ``async def websocket`` closes the connection with 1011 and says
    why on stderr, instead of never running."""
    (tmp_path / "handler.py").write_text("def handle(event):\n    return 'x'\n\nasync def websocket(ws, event):\n"
                                         "    ws.send('never')\n")
    server = start_server("python3.11", code_dir=tmp_path)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    frames = data.split(b"\r\n\r\n", 1)[1]
    assert frames[:1] == b"\x88" and frames[2:4] == (1011).to_bytes(2, "big")
    deadline = time.monotonic() + 10
    while "async def is not supported" not in server.stderr:
        assert time.monotonic() < deadline, server.stderr
        time.sleep(0.05)
