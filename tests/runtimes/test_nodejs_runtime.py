"""Node-only behaviour of the nodejs20 runtime, beyond the shared contract suite.

Dependency resolution through SLESS_DEPS_DIR, synchronous handlers, ES module
handlers, handler modules that cannot load, stray rejections/exceptions that
must not kill the server, and the AbortSignal a handler sees on timeout.
Every function here is written into a temporary directory by the test itself;
all processes are real (`node runtimes/nodejs20/server.js` / `runner.js`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.poll import until

# Fixture types (see conftest.py); spelled out so the module imports nothing from it.
ServerFactory = Callable[..., Any]
RunnerFactory = Callable[..., Any]
LoadFailure = Callable[..., str]

# Direct parametrization overrides conftest's three-runtime `runtime` fixture, so
# these tests run once, with the id [nodejs20] (selected by `-k nodejs20`).
pytestmark = pytest.mark.parametrize("runtime", ["nodejs20"])


def write_function(root: Path, files: dict[str, str]) -> Path:
    """Create a code (or deps) dir with the given relative files."""
    for rel, text in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return root


# --------------------------------------------------------------------------- SLESS_DEPS_DIR

USES_DEPS = """
'use strict';
const fake = require('fakepkg');
const scoped = require('@acme/scoped');
exports.handle = async () => ({ fake: fake.describe(), scoped: scoped.name });
"""


def fake_packages(root: Path) -> Path:
    """A node_modules tree: fakepkg (main in lib/, needs its own nested dep) and @acme/scoped."""
    return write_function(
        root,
        {
            "fakepkg/package.json": json.dumps({"name": "fakepkg", "version": "1.0.0", "main": "lib/main.js"}),
            "fakepkg/lib/main.js": (
                "const helper = require('helperpkg');\nexports.describe = () => 'fakepkg+' + helper.tag;\n"
            ),
            "fakepkg/node_modules/helperpkg/index.js": "exports.tag = 'nested-helper';\n",
            "@acme/scoped/package.json": json.dumps({"name": "@acme/scoped", "main": "index.js"}),
            "@acme/scoped/index.js": "exports.name = '@acme/scoped';\n",
        },
    )


@pytest.mark.parametrize("layout", ["prefix", "node_modules"])
def test_deps_dir_packages_resolve(runtime: str, start_server: ServerFactory, tmp_path: Path, layout: str) -> None:
    """SLESS_DEPS_DIR may be an install prefix (DIR/node_modules/pkg) or a node_modules dir."""
    code = write_function(tmp_path / "code", {"handler.js": USES_DEPS})
    deps = tmp_path / "deps"
    fake_packages(deps / "node_modules" if layout == "prefix" else deps)
    server = start_server(runtime, code, env={"SLESS_DEPS_DIR": str(deps)})
    resp = requests.get(f"{server.url}/x", timeout=10)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"fake": "fakepkg+nested-helper", "scoped": "@acme/scoped"}


def test_without_deps_dir_the_function_cannot_load(runtime: str, load_failure: LoadFailure, tmp_path: Path) -> None:
    """The control for the test above: the packages are found only through SLESS_DEPS_DIR."""
    code = write_function(tmp_path / "code", {"handler.js": USES_DEPS})
    fake_packages(tmp_path / "deps" / "node_modules")
    stderr = load_failure(runtime, code)
    assert "Cannot find module 'fakepkg'" in stderr


def test_code_dir_node_modules_win_over_deps_dir(runtime: str, start_server: ServerFactory, tmp_path: Path) -> None:
    """Packages vendored next to the code shadow the shared deps dir (normal Node lookup order)."""
    code = write_function(
        tmp_path / "code",
        {
            "handler.js": "exports.handle = () => require('fakepkg').describe();\n",
            "node_modules/fakepkg/index.js": "exports.describe = () => 'vendored';\n",
        },
    )
    deps = fake_packages(tmp_path / "deps" / "node_modules").parent
    server = start_server(runtime, code, env={"SLESS_DEPS_DIR": str(deps)})
    assert requests.get(f"{server.url}/x", timeout=10).text == "vendored"


def test_runner_resolves_deps_dir(runtime: str, run_runner: RunnerFactory, tmp_path: Path) -> None:
    code = write_function(tmp_path / "code", {"handler.js": USES_DEPS})
    deps = tmp_path / "deps"
    fake_packages(deps / "node_modules")
    proc = run_runner(runtime, {}, code, env={"SLESS_DEPS_DIR": str(deps)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"fake": "fakepkg+nested-helper", "scoped": "@acme/scoped"}


# --------------------------------------------------------------------------- handler styles

SYNC_HANDLER = """
'use strict';
let calls = 0;
exports.handle = function (event) {
  calls += 1;
  if (event._path === '/fail') throw new RangeError('sync failure');
  if (event._path === '/text') return 'plain sync';
  if (event._path === '/nothing') return undefined;
  return { sync: true, calls, method: event._method ?? null, self: this === module.exports };
};
"""


def test_sync_handler(runtime: str, start_server: ServerFactory, tmp_path: Path) -> None:
    server = start_server(runtime, write_function(tmp_path, {"handler.js": SYNC_HANDLER}))
    first = requests.post(f"{server.url}/obj", timeout=10)
    assert first.status_code == 200
    assert first.json() == {"sync": True, "calls": 1, "method": "POST", "self": True}
    # Loaded once: module state survives between requests.
    assert requests.get(f"{server.url}/obj", timeout=10).json()["calls"] == 2
    text = requests.get(f"{server.url}/text", timeout=10)
    assert text.headers["Content-Type"] == "text/plain; charset=utf-8" and text.text == "plain sync"
    nothing = requests.get(f"{server.url}/nothing", timeout=10)
    assert nothing.status_code == 200 and nothing.json() is None
    fail = requests.get(f"{server.url}/fail", timeout=10)
    assert fail.status_code == 500
    assert fail.json() == {"error": "sync failure", "type": "RangeError"}
    assert "sync failure" in server.stderr and "at exports.handle" in server.stderr


def test_sync_handler_in_runner(runtime: str, run_runner: RunnerFactory, tmp_path: Path) -> None:
    code = write_function(tmp_path, {"handler.js": SYNC_HANDLER})
    proc = run_runner(runtime, {"k": 1}, code)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"sync": True, "calls": 1, "method": None, "self": True}


def test_es_module_handler(runtime: str, start_server: ServerFactory, tmp_path: Path) -> None:
    code = write_function(
        tmp_path,
        {
            "package.json": json.dumps({"type": "module"}),
            "handler.js": "export const handle = async (event) => ({ esm: true, path: event._path });\n",
        },
    )
    server = start_server(runtime, code)
    assert requests.get(f"{server.url}/m", timeout=10).json() == {"esm": True, "path": "/m"}


def test_custom_error_class_name_is_the_type(runtime: str, start_server: ServerFactory, tmp_path: Path) -> None:
    code = write_function(
        tmp_path,
        {
            "handler.js": (
                "class NotFound extends Error {}\n"
                "exports.handle = async () => { throw new NotFound('no such note'); };\n"
            )
        },
    )
    server = start_server(runtime, code)
    resp = requests.get(f"{server.url}/x", timeout=10)
    assert resp.status_code == 500
    assert resp.json() == {"error": "no such note", "type": "NotFound"}


# --------------------------------------------------------------------------- load failures


@pytest.mark.parametrize(
    ("files", "entrypoint", "expected"),
    [
        ({"handler.js": "exports.handle = async (e) => {\n"}, "handler.handle", "SyntaxError"),
        (
            {"handler.js": "require('no-such-package');\n"},
            "handler.handle",
            "Cannot find module 'no-such-package'",
        ),
        ({"handler.js": "exports.handle = 42;\n"}, "handler.handle", 'no function "handle" (it is a number)'),
        ({"handler.js": "exports.handle = () => 1;\n"}, "handler", 'must look like "module.func"'),
        (
            {
                "package.json": '{"type": "module"}',
                "handler.js": "throw new Error('esm broken at import');\n",
            },
            "handler.handle",
            "esm broken at import",
        ),
    ],
    ids=["syntax-error", "missing-package", "not-a-function", "bad-entrypoint", "esm-throws"],
)
def test_handler_that_fails_to_load_exits_non_zero(
    runtime: str,
    load_failure: LoadFailure,
    tmp_path: Path,
    files: dict[str, str],
    entrypoint: str,
    expected: str,
) -> None:
    stderr = load_failure(runtime, write_function(tmp_path, files), env={"SLESS_ENTRYPOINT": entrypoint})
    assert expected in stderr


def test_runner_exits_1_when_the_handler_fails_to_load(runtime: str, run_runner: RunnerFactory, tmp_path: Path) -> None:
    code = write_function(tmp_path, {"handler.js": "throw new Error('broken at import');\n"})
    proc = run_runner(runtime, {}, code)
    assert proc.returncode == 1
    assert "broken at import" in proc.stderr and proc.stdout == ""


# --------------------------------------------------------------------------- resilience

STRAY_FAILURES = """
'use strict';
exports.handle = async (event) => {
  if (event._path === '/reject') Promise.reject(new Error('stray rejection'));
  if (event._path === '/throw') setTimeout(() => { throw new Error('thrown from a timer'); }, 0);
  return 'ok';
};
"""


def test_stray_rejection_and_uncaught_exception_do_not_kill_the_server(
    runtime: str, start_server: ServerFactory, tmp_path: Path
) -> None:
    server = start_server(runtime, write_function(tmp_path, {"handler.js": STRAY_FAILURES}))
    for path in ("/reject", "/throw", "/reject", "/throw"):
        assert requests.get(f"{server.url}{path}", timeout=10).text == "ok"
    until("the timer callbacks fired and were logged",
          lambda: "stray rejection" in server.stderr and "thrown from a timer" in server.stderr, 10, 0.05)
    assert requests.get(f"{server.url}/fine", timeout=10).text == "ok"
    assert server.proc.poll() is None


INVALID_RESULTS = """
'use strict';
exports.handle = (e) => {
  switch (e._path) {
    case '/status': return { statusCode: 1000, body: 'x' };
    case '/informational': return { statusCode: 150, body: 'x' };
    case '/header': return { statusCode: 200, headers: { 'X-Bad': 'a\\nb' } };
    case '/bigint': return { big: 10n };
    case '/connection': return { statusCode: 200, headers: { Connection: 'close' }, body: 'kept' };
    default: return 'ok';
  }
};
"""


def test_invalid_response_description_is_500(runtime: str, start_server: ServerFactory, tmp_path: Path) -> None:
    server = start_server(runtime, write_function(tmp_path, {"handler.js": INVALID_RESULTS}))
    for path in ("/status", "/informational", "/header", "/bigint"):
        resp = requests.get(f"{server.url}{path}", timeout=10)
        assert resp.status_code == 500, path
        body = resp.json()
        assert set(body) == {"error", "type"} and body["error"], path
        assert body["type"] == "InvalidResponse", path
    assert server.proc.poll() is None


def test_handler_connection_header_is_ignored(runtime: str, start_server: ServerFactory, tmp_path: Path) -> None:
    """Connection management is the server's: a handler's `Connection: close` does not end keep-alive."""
    server = start_server(runtime, write_function(tmp_path, {"handler.js": INVALID_RESULTS}))
    conn = server.connection()
    conn.request("GET", "/connection")
    resp = conn.getresponse()
    assert resp.read() == b"kept" and resp.getheader("Connection") == "keep-alive"
    sock = conn.sock
    conn.request("GET", "/other")
    assert conn.getresponse().read() == b"ok"
    assert conn.sock is sock
    conn.close()


TIMEOUT_SIGNAL = """
'use strict';
let lastAbort = null;
exports.handle = async (event, context) => {
  if (event._path === '/last') return { lastAbort };
  await new Promise((resolve) => {
    context.signal.addEventListener('abort', () => {
      lastAbort = { reason: context.signal.reason.message, remainingMs: context.remainingMs() };
      resolve();
    });
  });
  return 'aborted work finished';
};
"""


def test_timeout_aborts_the_context_signal(runtime: str, start_server: ServerFactory, tmp_path: Path) -> None:
    code = write_function(tmp_path, {"handler.js": TIMEOUT_SIGNAL})
    server = start_server(runtime, code, env={"SLESS_TIMEOUT_SEC": "0.5"})
    resp = requests.get(f"{server.url}/wait", timeout=30)
    assert resp.status_code == 504
    assert resp.json() == {"error": "function timed out after 0.5s", "type": "Timeout"}
    last = requests.get(f"{server.url}/last", timeout=10).json()
    assert last == {"lastAbort": {"reason": "function timed out after 0.5s", "remainingMs": 0}}


def test_keep_alive_timeout_outlives_upstream_pools(runtime: str, start_server: ServerFactory) -> None:
    """Idle connections stay open longer than a proxy's pool (<= 60 s) keeps them."""
    server = start_server(runtime)
    resp = requests.get(f"{server.url}/text", timeout=10)
    assert resp.headers["Keep-Alive"] == "timeout=65"
