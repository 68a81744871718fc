"""Harness for the runtime contract tests: real runtime processes on loopback ports.

Every runtime (python3.11, nodejs20, go1.23) is started exactly as the platform
starts it, as a separate process with the contract's environment variables, so
the same tests check all three implementations. A runtime whose entry files do
not exist yet is skipped with a reason instead of failing, so the suite is usable
while a runtime is being written.

Fixtures:
- ``runtime``: parametrized over the three runtime names (skips missing ones).
- ``start_server``: factory ``start_server(runtime, code_dir=None, env=None)``
  -> ``RuntimeServer`` (base ``url``, ``proc``, ``port``, logs); stopped at teardown.
- ``spawn_server``: like ``start_server`` but does not wait for health (for
  start-up failure tests).
- ``run_runner``: factory ``run_runner(runtime, event, code_dir=None, env=None)``
  -> ``subprocess.CompletedProcess[str]``.
- ``load_failure``: ``load_failure(runtime, code_dir=None, env=None)`` asserts that
  the handler cannot be loaded (Go: the build fails, or the server exits non-zero;
  others: the server exits non-zero) and returns the error output.
- ``go_build``: session-cached ``runtimes/go1.23/build.sh CODE_DIR OUT_DIR``.

Test modules take everything from fixtures (no imports from this file), so they
work under any pytest import mode.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.spares import Procs

REPO = Path(__file__).resolve().parents[2]
RUNTIMES_DIR = REPO / "runtimes"
FUNCTIONS_DIR = Path(__file__).resolve().parent / "functions"
RUNTIMES = ("python3.11", "nodejs20", "go1.23")

#: Seconds to wait for GET /_/health after start (Go binaries are prebuilt).
STARTUP_TIMEOUT = 30.0
#: Seconds a Go build may take on a loaded 2-core machine.
GO_BUILD_TIMEOUT = 600.0

_ENTRY_FILES: dict[str, tuple[str, ...]] = {
    "python3.11": ("server.py", "runner.py"),
    "nodejs20": ("server.js", "runner.js"),
    "go1.23": ("build.sh",),
}
_TOOLS: dict[str, str] = {"nodejs20": "node", "go1.23": "go"}


def runtime_unavailable(runtime: str) -> str | None:
    """Why ``runtime`` cannot be tested here (missing files or tools), or None."""
    missing = [f for f in _ENTRY_FILES[runtime] if not (RUNTIMES_DIR / runtime / f).is_file()]
    if missing:
        return f"runtimes/{runtime}/{', '.join(missing)} not written yet"
    if not (FUNCTIONS_DIR / runtime).is_dir():
        return f"tests/runtimes/functions/{runtime}/ (shared test function) not written yet"
    tool = _TOOLS.get(runtime)
    if tool and shutil.which(tool) is None:
        return f"{tool} is not installed"
    return None


def require_runtime(runtime: str) -> None:
    """Skip the calling test when ``runtime`` is unavailable."""
    reason = runtime_unavailable(runtime)
    if reason:
        pytest.skip(reason)


def default_code_dir(runtime: str) -> Path:
    """The shared test function of ``runtime``."""
    return FUNCTIONS_DIR / runtime


def free_port() -> int:
    """A currently free loopback TCP port (tiny race accepted: nothing else binds here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(code_dir: Path, extra: Mapping[str, str] | None) -> dict[str, str]:
    """The process environment: ours minus any inherited SLESS_*/PORT, plus the contract's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLESS_") and k != "PORT"}
    env.update({"SLESS_HOST": "127.0.0.1", "SLESS_CODE_DIR": str(code_dir), "GOTOOLCHAIN": "local"})
    env.update(extra or {})
    return env


@dataclass
class GoBuilder:
    """Builds Go functions with build.sh once per (code dir, entrypoint) per session."""

    root: Path
    cache: dict[tuple[str, str], Path] = field(default_factory=dict)

    def build(self, code_dir: Path, env: Mapping[str, str]) -> Path:
        """OUT_DIR with ``server`` and ``runner`` for ``code_dir``; raises on build failure."""
        out, proc = self.try_build(code_dir, env)
        if proc is not None and proc.returncode != 0:
            raise RuntimeError(f"go build failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return out

    def try_build(self, code_dir: Path, env: Mapping[str, str]) -> tuple[Path, subprocess.CompletedProcess[str] | None]:
        """Build (or reuse) and return (OUT_DIR, the build process or None when cached)."""
        key = (str(code_dir.resolve()), env.get("SLESS_ENTRYPOINT", ""))
        if key in self.cache:
            return self.cache[key], None
        out = self.root / f"build{len(self.cache)}-{int(time.time() * 1000)}"
        out.mkdir(parents=True)
        proc = subprocess.run(
            [str(RUNTIMES_DIR / "go1.23" / "build.sh"), str(code_dir), str(out)],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=GO_BUILD_TIMEOUT,
            check=False,
        )
        if proc.returncode == 0:
            self.cache[key] = out
        return out, proc


def server_command(runtime: str, code_dir: Path, env: Mapping[str, str], go: GoBuilder) -> list[str]:
    """The command line that starts ``runtime``'s HTTP server (building Go first)."""
    if runtime == "python3.11":
        return [sys.executable, str(RUNTIMES_DIR / runtime / "server.py")]
    if runtime == "nodejs20":
        return ["node", str(RUNTIMES_DIR / runtime / "server.js")]
    return [str(go.build(code_dir, env) / "server")]


def runner_command(runtime: str, code_dir: Path, env: Mapping[str, str], go: GoBuilder) -> list[str]:
    """The command line of ``runtime``'s one-shot runner (building Go first)."""
    if runtime == "python3.11":
        return [sys.executable, str(RUNTIMES_DIR / runtime / "runner.py")]
    if runtime == "nodejs20":
        return ["node", str(RUNTIMES_DIR / runtime / "runner.js")]
    return [str(go.build(code_dir, env) / "runner")]


@dataclass
class RuntimeServer:
    """A runtime server process started by the harness."""

    runtime: str
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log_dir: Path

    @property
    def stdout(self) -> str:
        """Everything the process wrote to stdout so far."""
        return (self.log_dir / "stdout").read_text(errors="replace")

    @property
    def stderr(self) -> str:
        """Everything the process wrote to stderr so far."""
        return (self.log_dir / "stderr").read_text(errors="replace")

    def connection(self, timeout: float = 30.0) -> http.client.HTTPConnection:
        """A fresh keep-alive connection to the server."""
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT) -> None:
        """Poll GET /_/health until 200; fail with the logs if the process dies or hangs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.runtime} server exited with {self.proc.returncode} during start-up:\n{self.stderr}"
                )
            try:
                conn = self.connection(timeout=2.0)
                conn.request("GET", "/_/health")
                status = conn.getresponse().status
                conn.close()
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.runtime} server not healthy after {timeout}s:\n{self.stderr}")

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait, then SIGKILL; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        return self.proc.returncode


ServerFactory = Callable[..., RuntimeServer]
RunnerFactory = Callable[..., "subprocess.CompletedProcess[str]"]
LoadFailure = Callable[..., str]


@pytest.fixture(scope="session")
def go_build(tmp_path_factory: pytest.TempPathFactory) -> GoBuilder:
    """Session-wide Go build cache (a build takes many seconds)."""
    return GoBuilder(tmp_path_factory.mktemp("go-builds"))


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    """Each runtime name; skipped with a reason when it is not available."""
    name: str = request.param
    require_runtime(name)
    return name


def _spawn(
    runtime: str,
    code_dir: Path | None,
    env: Mapping[str, str] | None,
    go: GoBuilder,
    log_root: Path,
) -> RuntimeServer:
    require_runtime(runtime)
    code = Path(code_dir) if code_dir is not None else default_code_dir(runtime)
    port = free_port()
    full_env = base_env(code, {"PORT": str(port), **(env or {})})
    cmd = server_command(runtime, code, full_env, go)
    log_dir = log_root / f"{runtime}-{port}"
    log_dir.mkdir(parents=True)
    with open(log_dir / "stdout", "wb") as out, open(log_dir / "stderr", "wb") as err:
        proc = subprocess.Popen(cmd, env=full_env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    return RuntimeServer(runtime, f"http://127.0.0.1:{port}", port, proc, log_dir)


@pytest.fixture
def spawn_server(go_build: GoBuilder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    """Factory that starts a server process without waiting for it to become healthy."""
    started: list[RuntimeServer] = []
    log_root = tmp_path_factory.mktemp("runtime-logs")

    def spawn(runtime: str, code_dir: Path | None = None, env: Mapping[str, str] | None = None) -> RuntimeServer:
        server = _spawn(runtime, code_dir, env, go_build, log_root)
        started.append(server)
        return server

    yield spawn
    for server in started:
        server.stop()


@pytest.fixture
def start_server(spawn_server: ServerFactory) -> ServerFactory:
    """Factory that starts a server and waits until GET /_/health answers 200."""

    def start(runtime: str, code_dir: Path | None = None, env: Mapping[str, str] | None = None) -> RuntimeServer:
        server: RuntimeServer = spawn_server(runtime, code_dir, env)
        server.wait_healthy()
        return server

    return start


@pytest.fixture
def run_runner(go_build: GoBuilder) -> RunnerFactory:
    """Factory that runs the one-shot runner with SLESS_EVENT and returns its result.

    ``event`` may be a dict (JSON-encoded), a raw string (sent as is, e.g. bad
    JSON) or None (SLESS_EVENT unset).
    """

    def run(
        runtime: str,
        event: dict[str, Any] | str | None,
        code_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        require_runtime(runtime)
        code = Path(code_dir) if code_dir is not None else default_code_dir(runtime)
        extra = dict(env or {})
        if event is not None:
            extra["SLESS_EVENT"] = event if isinstance(event, str) else json.dumps(event)
        full_env = base_env(code, extra)
        cmd = runner_command(runtime, code, full_env, go_build)
        return subprocess.run(
            cmd,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    return run


@pytest.fixture
def load_failure(go_build: GoBuilder, spawn_server: ServerFactory) -> LoadFailure:
    """Factory asserting that a handler cannot be loaded; returns the error output."""

    def check(runtime: str, code_dir: Path | None = None, env: Mapping[str, str] | None = None) -> str:
        require_runtime(runtime)
        if runtime == "go1.23":
            code = Path(code_dir) if code_dir is not None else default_code_dir(runtime)
            _, proc = go_build.try_build(code, base_env(code, env))
            if proc is not None and proc.returncode != 0:
                output = (proc.stderr + proc.stdout).strip()
                assert output, "the failed build printed nothing"
                return output
        server = spawn_server(runtime, code_dir, env)
        try:
            returncode = server.proc.wait(timeout=STARTUP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail("the server kept running although its handler cannot be loaded")
        assert returncode != 0, "the server exited 0 although its handler cannot be loaded"
        stderr = server.stderr.strip()
        assert stderr, "the server printed nothing on stderr"
        return stderr

    return check


@pytest.fixture
def spawn() -> Iterator[Procs]:
    """The processes a test starts (it appends them), killed after it."""
    procs: Procs = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait(10)
