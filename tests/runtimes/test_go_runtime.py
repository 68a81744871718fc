"""Go-only behaviour of the go1.23 runtime, beyond the shared contract suite.

build.sh itself (compile errors mapped to the user's files, modules from the Go
proxy, the build cache, SLESS_ENTRYPOINT, the user's replace directives, the
language version of a package without go.mod) and what only Go handlers can do
(ctx deadline and cancellation, error type names, structs as results). Every
function is written into a temporary directory by the test; every build runs
the real build.sh and every server is the real binary.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

# Fixture types (see conftest.py); spelled out so the module imports nothing from it.
ServerFactory = Callable[..., Any]
RunnerFactory = Callable[..., Any]

# Direct parametrization overrides conftest's three-runtime `runtime` fixture, so
# these tests run once, with the id [go1.23] (selected by `-k go1.23`).
pytestmark = pytest.mark.parametrize("runtime", ["go1.23"])

RUNTIME_DIR = Path(__file__).resolve().parents[2] / "runtimes" / "go1.23"
BUILD_SH = RUNTIME_DIR / "build.sh"
BUILD_TIMEOUT = 600.0

HEADER = 'package function\n\nimport "context"\n\n'


def write_function(root: Path, files: dict[str, str]) -> Path:
    """Create a code dir with the given relative files."""
    for rel, text in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return root


def build(code_dir: Path, out_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run build.sh with our environment (minus inherited SLESS_*) plus ``env``."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SLESS_")}
    full_env.update(env)
    return subprocess.run(
        [str(BUILD_SH), str(code_dir), str(out_dir)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
    )


# --------------------------------------------------------------------------- build.sh


def test_compile_error_names_the_users_file_and_line(runtime: str, tmp_path: Path) -> None:
    code = write_function(
        tmp_path / "code",
        {
            "handler.go": HEADER
            + "func Handle(ctx context.Context, event map[string]any) (any, error) {\n"
            + "\treturn helper(), nil\n}\n",
            "helper.go": "package function\n\nfunc helper() int {\n\treturn undefinedName\n}\n",
        },
    )
    proc = build(code, tmp_path / "out")
    assert proc.returncode == 1, proc.stderr
    assert "helper.go:4:9: undefined: undefinedName" in proc.stderr
    assert "sless-go-build" not in proc.stderr  # temporary paths are mapped back
    assert not (tmp_path / "out" / "server").exists()


def test_wrong_entrypoint_signature_explains_the_expected_one(runtime: str, tmp_path: Path) -> None:
    code = write_function(tmp_path / "code", {"f.go": 'package function\n\nfunc Handle() string { return "" }\n'})
    proc = build(code, tmp_path / "out")
    assert proc.returncode == 1
    assert "func(ctx context.Context, event map[string]any) (any, error)" in proc.stderr
    assert "(entrypoint glue)" in proc.stderr


def test_usage_errors_exit_2(runtime: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert build(empty, tmp_path / "out").returncode == 2  # no .go files
    code = write_function(tmp_path / "code", {"f.go": HEADER})
    proc = build(code, tmp_path / "out", SLESS_ENTRYPOINT="not valid")
    assert proc.returncode == 2
    assert "SLESS_ENTRYPOINT" in proc.stderr


UUID_FUNCTION = """package function

import (
\t"context"

\t"github.com/google/uuid"
)

func Handle(ctx context.Context, event map[string]any) (any, error) {
\treturn map[string]any{"id": uuid.NewString()}, nil
}
"""


@pytest.mark.slow
def test_module_from_the_go_proxy(runtime: str, tmp_path: Path, start_server: ServerFactory) -> None:
    code = write_function(
        tmp_path / "code",
        {
            "go.mod": "module example.com/uuidfn\n\ngo 1.23\n\nrequire github.com/google/uuid v1.6.0\n",
            "fn.go": UUID_FUNCTION,
        },
    )
    server = start_server(runtime, code_dir=code)
    first = requests.get(f"{server.url}/", timeout=10).json()["id"]
    second = requests.get(f"{server.url}/", timeout=10).json()["id"]
    assert len(first) == 36 and first.count("-") == 4 and first != second


def test_unchanged_code_builds_again_from_the_cache(runtime: str, tmp_path: Path) -> None:
    code = write_function(
        tmp_path / "code",
        {"f.go": HEADER + "func Handle(ctx context.Context, e map[string]any) (any, error) { return 7, nil }\n"},
    )
    times = []
    for name in ("first", "second"):
        started = time.monotonic()
        proc = build(code, tmp_path / name)
        times.append(time.monotonic() - started)
        assert proc.returncode == 0, proc.stderr
    print(f"build.sh: first {times[0]:.1f}s, unchanged second {times[1]:.1f}s")
    out = tmp_path / "second"
    assert os.access(out / "server", os.X_OK) and os.access(out / "runner", os.X_OK)
    ran = subprocess.run([str(out / "runner")], capture_output=True, text=True, timeout=30, check=False)
    assert (ran.returncode, ran.stdout) == (0, "7\n")


TWO_ENTRYPOINTS = (
    HEADER
    + 'func Handle(ctx context.Context, e map[string]any) (any, error) { return "default", nil }\n'
    + 'func Other(ctx context.Context, e map[string]any) (any, error) { return "other", nil }\n'
)


@pytest.mark.parametrize(
    ("entrypoint", "expected"),
    [("Other", "other"), ("handler.other", "other"), ("handler.handle", "default")],
)
def test_custom_entrypoint(
    runtime: str, tmp_path: Path, start_server: ServerFactory, entrypoint: str, expected: str
) -> None:
    code = write_function(tmp_path / "code", {"handlers.go": TWO_ENTRYPOINTS})
    server = start_server(runtime, code_dir=code, env={"SLESS_ENTRYPOINT": entrypoint})
    assert requests.get(f"{server.url}/", timeout=10).text == expected


def test_users_replace_directives_apply(runtime: str, tmp_path: Path, run_runner: RunnerFactory) -> None:
    code = write_function(
        tmp_path / "code",
        {
            "go.mod": "module example.com/fn\n\ngo 1.23\n\nrequire example.com/greet v1.0.0\n\n"
            "replace (\n\texample.com/greet v1.0.0 => ./greet // vendored copy\n)\n",
            "greet/go.mod": "module example.com/greet\n\ngo 1.23\n",
            "greet/greet.go": 'package greet\n\nfunc Hi() string { return "hi from greet" }\n',
            "fn.go": 'package function\n\nimport (\n\t"context"\n\n\t"example.com/greet"\n)\n\n'
            "func Handle(ctx context.Context, e map[string]any) (any, error) { return greet.Hi(), nil }\n",
        },
    )
    proc = run_runner(runtime, {}, code_dir=code)
    assert (proc.returncode, proc.stdout) == (0, '"hi from greet"\n'), proc.stderr


@pytest.mark.parametrize(
    ("replacement", "refusal"),
    [
        ("../outside", "outside the function's code"),
        ("./greet/../../outside", "outside the function's code"),
        ('"../outside"', "outside the function's code"),
        ("..", "outside the function's code"),
        ("/", "the absolute path /"),
        ("/etc", "the absolute path /etc"),
    ],
)
def test_a_replace_that_leaves_the_upload_is_refused(runtime: str, tmp_path: Path, replacement: str,
                                                     refusal: str) -> None:
    """A hostile go.mod: a local replacement outside the upload would compile the build host's files (and quote
    them in its errors); it is refused by name before anything compiles. The folder it names exists, with a
    module that would build, so only the rule stops it."""
    outside = write_function(tmp_path / "outside", {"go.mod": "module example.com/greet\n\ngo 1.23\n",
                                                    "greet.go": "package greet\n\nfunc Hi() string { return \"x\" }\n"})
    assert (outside / "go.mod").is_file()
    code = write_function(
        tmp_path / "code",
        {
            "go.mod": "module example.com/fn\n\ngo 1.23\n\nrequire example.com/greet v1.0.0\n\n"
            f"replace example.com/greet => {replacement}\n",
            "greet/go.mod": "module example.com/greet\n\ngo 1.23\n",
            "fn.go": 'package function\n\nimport (\n\t"context"\n\n\t"example.com/greet"\n)\n\n'
            "func Handle(ctx context.Context, e map[string]any) (any, error) { return greet.Hi(), nil }\n",
        },
    )
    proc = build(code, tmp_path / "out")
    assert proc.returncode == 1, proc.stderr
    assert refusal in proc.stderr and "only folders inside" in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "server").exists()


def test_package_without_go_mod_gets_go_1_23_semantics(runtime: str, tmp_path: Path, run_runner: RunnerFactory) -> None:
    # Range over a function iterator only compiles with language version >= 1.23.
    code = write_function(
        tmp_path / "code",
        {
            "fn.go": 'package function\n\nimport (\n\t"context"\n\t"maps"\n\t"slices"\n)\n\n'
            "func Handle(ctx context.Context, e map[string]any) (any, error) {\n"
            "\tkeys := []string{}\n\tfor k := range maps.Keys(e) {\n\t\tkeys = append(keys, k)\n\t}\n"
            "\tslices.Sort(keys)\n\treturn keys, nil\n}\n"
        },
    )
    proc = run_runner(runtime, {"b": 1, "a": 2}, code_dir=code)
    assert (proc.returncode, proc.stdout) == (0, '["a","b"]\n'), proc.stderr


# --------------------------------------------------------------------------- Go handlers

CONTEXT_FUNCTION = """package function

import (
\t"context"
\t"os"
\t"time"
)

func Handle(ctx context.Context, e map[string]any) (any, error) {
\tdeadline, ok := ctx.Deadline()
\tif e["case"] == "deadline" {
\t\treturn map[string]any{"has": ok, "left": time.Until(deadline).Seconds()}, nil
\t}
\t<-ctx.Done()
\ttime.Sleep(1500 * time.Millisecond) // the goroutine keeps running after the 504
\treturn nil, os.WriteFile(e["marker"].(string), []byte(ctx.Err().Error()), 0o644)
}
"""


def test_ctx_carries_the_deadline(runtime: str, tmp_path: Path, start_server: ServerFactory) -> None:
    code = write_function(tmp_path / "code", {"fn.go": CONTEXT_FUNCTION})
    server = start_server(runtime, code_dir=code, env={"SLESS_TIMEOUT_SEC": "7.5"})
    got = requests.post(server.url, json={"case": "deadline"}, timeout=10).json()
    assert got["has"] is True
    assert 5.0 < got["left"] <= 7.5


def test_timeout_cancels_ctx_and_the_goroutine_keeps_running(
    runtime: str, tmp_path: Path, start_server: ServerFactory
) -> None:
    code = write_function(tmp_path / "code", {"fn.go": CONTEXT_FUNCTION})
    marker = tmp_path / "marker"
    server = start_server(runtime, code_dir=code, env={"SLESS_TIMEOUT_SEC": "0.5"})
    resp = requests.post(server.url, json={"marker": str(marker)}, timeout=10)
    assert resp.status_code == 504
    assert resp.json() == {"error": "function timed out after 0.5s", "type": "Timeout"}
    assert not marker.exists()  # answered before the handler finished
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.read_text() == "context deadline exceeded"


ERRORS_FUNCTION = """package function

import (
\t"context"
\t"errors"
\t"fmt"
)

type QuotaError struct{ Left int }

func (e *QuotaError) Error() string { return fmt.Sprintf("quota exhausted (%d left)", e.Left) }

func Handle(ctx context.Context, e map[string]any) (any, error) {
\tswitch e["case"] {
\tcase "custom":
\t\treturn nil, &QuotaError{Left: 0}
\tcase "wrapped":
\t\treturn nil, fmt.Errorf("saving: %w", errors.New("disk full"))
\tcase "typednil":
\t\tvar q *QuotaError
\t\treturn nil, q
\tcase "panicvalue":
\t\tpanic(fmt.Sprintf("bad input %v", e["n"]))
\t}
\treturn "ok", nil
}
"""


@pytest.mark.parametrize(
    ("case", "status", "type_", "message"),
    [
        ("custom", 500, "*function.QuotaError", "quota exhausted (0 left)"),
        ("wrapped", 500, "*fmt.wrapError", "saving: disk full"),
        ("panicvalue", 500, "panic", "bad input 3"),
    ],
)
def test_error_type_is_the_dynamic_type_name(
    runtime: str, tmp_path: Path, start_server: ServerFactory, case: str, status: int, type_: str, message: str
) -> None:
    code = write_function(tmp_path / "code", {"fn.go": ERRORS_FUNCTION})
    server = start_server(runtime, code_dir=code)
    resp = requests.post(server.url, json={"case": case, "n": 3}, timeout=10)
    assert resp.status_code == status
    assert resp.json() == {"error": message, "type": type_}


def test_typed_nil_error_does_not_kill_the_server(runtime: str, tmp_path: Path, start_server: ServerFactory) -> None:
    code = write_function(tmp_path / "code", {"fn.go": ERRORS_FUNCTION})
    server = start_server(runtime, code_dir=code)
    resp = requests.post(server.url, json={"case": "typednil"}, timeout=10)
    assert resp.status_code == 500
    assert resp.json()["type"] == "*function.QuotaError"
    assert requests.post(server.url, json={}, timeout=10).text == "ok"


STRUCT_FUNCTION = """package function

import "context"

type Reply struct {
\tStatusCode int               `json:"statusCode"`
\tHeaders    map[string]string `json:"headers"`
\tBody       any               `json:"body"`
}

type Greeting string

func Handle(ctx context.Context, e map[string]any) (any, error) {
\tif e["case"] == "typed" {
\t\treturn Greeting("<b>hi</b>"), nil
\t}
\treturn Reply{StatusCode: 202, Headers: map[string]string{"X-Kind": "struct"}, Body: []int{1, 2}}, nil
}
"""


def test_structs_and_typed_strings_map_like_their_json(
    runtime: str, tmp_path: Path, start_server: ServerFactory
) -> None:
    code = write_function(tmp_path / "code", {"fn.go": STRUCT_FUNCTION})
    server = start_server(runtime, code_dir=code)
    resp = requests.get(server.url, timeout=10)
    assert resp.status_code == 202
    assert resp.headers["X-Kind"] == "struct"
    assert resp.headers["Content-Type"] == "application/json"
    assert resp.json() == [1, 2]
    typed = requests.post(server.url, json={"case": "typed"}, timeout=10)
    assert typed.headers["Content-Type"] == "text/html; charset=utf-8"
    assert typed.text == "<b>hi</b>"


def raw_exchange(port: int, data: bytes) -> bytes:
    """Send raw bytes, read until the server closes the connection."""
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
    return out


@pytest.mark.parametrize(
    ("request_bytes", "status", "type_"),
    [
        (b"NONSENSE\r\n\r\n", 400, "BadRequest"),
        (b"GET /text HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400, "BadRequest"),
        (b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: x1\r\n\r\n", 400, "BadRequest"),
        (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "BadRequest"),
        (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "NotImplemented"),
        (b"GET /text HTTP/2.0\r\nHost: x\r\n\r\n", 505, "HTTPVersionNotSupported"),
        (b"GET /text HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n", 431, "HeaderTooLarge"),
    ],
)
def test_requests_net_http_rejects_get_json_errors(
    runtime: str, start_server: ServerFactory, request_bytes: bytes, status: int, type_: str
) -> None:
    server = start_server(runtime)
    out = raw_exchange(server.port, request_bytes)
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), out[:200]
    assert b"\r\nContent-Type: application/json" in head
    assert json.loads(body)["type"] == type_
    assert requests.get(f"{server.url}/text", timeout=10).text == "hello"


def test_wrapper_sources_are_vet_clean_and_unit_tested(runtime: str) -> None:
    wrapper = RUNTIME_DIR / "wrapper"
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    for argv in (["go", "vet", "./..."], ["go", "test", "-count=1", "./..."]):
        proc = subprocess.run(
            argv, cwd=wrapper, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False
        )
        assert proc.returncode == 0, f"{' '.join(argv)}:\n{proc.stdout}\n{proc.stderr}"
