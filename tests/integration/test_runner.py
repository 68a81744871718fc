"""One-shot runs through the real runtime runners (python3.11, nodejs20, go1.23).

Functions are the shared runtime test functions (tests/runtimes/functions/) built
by the real Builder, plus a few small ones written here for faults the shared
function does not have (a stuck event loop, a leftover child, huge output).
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sless_api.backends.standalone.builder import BuildArtifact, Builder, BuildRequest, toolchain_paths
from sless_api.backends.standalone.host.sandbox import Limits, Sandbox, tenant_uid
from sless_api.backends.standalone.runner import MAX_OUTPUT_CHARS, TRUNCATION_MARK, run_once

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FUNCTIONS = REPO / "tests" / "runtimes" / "functions"
RUNTIMES = ("python3.11", "nodejs20", "go1.23")
ENTRY_FILES = {"python3.11": "runner.py", "nodejs20": "runner.js", "go1.23": "build.sh"}
TOOLS = {"nodejs20": "node", "go1.23": "go"}
DEFAULT_ENTRY = {"python3.11": "handler.handle", "nodejs20": "handler.handle", "go1.23": "Handle"}


def _require(runtime: str) -> None:
    if not (REPO / "runtimes" / runtime / ENTRY_FILES[runtime]).is_file():
        pytest.skip(f"runtimes/{runtime}/{ENTRY_FILES[runtime]} not written yet")
    if not (FUNCTIONS / runtime).is_dir():
        pytest.skip(f"shared test function for {runtime} not written yet")
    tool = TOOLS.get(runtime)
    if tool and shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory) -> Builder:
    return Builder(tmp_path_factory.mktemp("runner-cache"))


@pytest.fixture(scope="module")
def artifacts(builder: Builder) -> dict[str, BuildArtifact]:
    """Lazily built shared test functions, one per runtime (a Go build takes a while)."""
    return {}


@pytest.fixture(params=RUNTIMES)
def art(request: pytest.FixtureRequest, builder: Builder, artifacts: dict[str, BuildArtifact]) -> BuildArtifact:
    runtime: str = request.param
    _require(runtime)
    if runtime not in artifacts:
        code = FUNCTIONS / runtime
        artifacts[runtime] = builder.build(BuildRequest(runtime, code, DEFAULT_ENTRY[runtime], f"shared-{runtime}"))
    return artifacts[runtime]


def build_code(builder: Builder, root: Path, runtime: str, files: dict[str, str]) -> BuildArtifact:
    _require(runtime)
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    return builder.build(BuildRequest(runtime, root, DEFAULT_ENTRY[runtime], f"custom-{root.name}"))


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


# -- every runtime ---------------------------------------------------------------------------------


def test_success_output_is_the_json_result(art: BuildArtifact) -> None:
    result = run_once(art, {"case": "echo", "n": 7, "nested": {"a": [1, 2]}}, 30)
    assert result.ok, result.output
    assert result.exit_code == 0 and not result.timed_out
    event = json.loads(result.output)
    assert event["n"] == 7 and event["nested"] == {"a": [1, 2]}
    assert run_once(art, {"case": "text"}, 30).output == '"hello"'


def test_failure_output_is_the_error(art: BuildArtifact) -> None:
    result = run_once(art, {"case": "error"}, 30)
    assert not result.ok
    assert result.exit_code == 1
    assert "boom" in result.output
    crash = run_once(art, {"case": "crash"}, 30)
    assert not crash.ok and crash.exit_code != 0 and crash.output


def test_handler_timeout_is_reported_by_the_runner(art: BuildArtifact) -> None:
    started = time.monotonic()
    result = run_once(art, {"case": "slow", "seconds": 60}, 1)
    assert time.monotonic() - started < 30
    assert not result.ok and result.timed_out
    assert result.exit_code == 124
    assert "timed out" in result.output


def test_function_env_is_passed_but_contract_wins(art: BuildArtifact) -> None:
    env = {"GREETING": "hi there", "SLESS_CODE_DIR": "/nonexistent"}
    result = run_once(art, {"case": "env", "name": "GREETING"}, 30, env=env)
    assert result.ok, result.output
    assert json.loads(result.output) == {"value": "hi there"}


def test_platform_secrets_do_not_reach_the_function(art: BuildArtifact, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLESS_JWT_SECRET", "platform-secret")
    result = run_once(art, {"case": "env", "name": "SLESS_JWT_SECRET"}, 30)
    assert result.ok, result.output
    assert json.loads(result.output) == {"value": None}


# -- the backstop and the output limits -------------------------------------------------------------


def test_runner_that_cannot_stop_is_killed(builder: Builder, tmp_path: Path) -> None:
    # A synchronous loop blocks Node's event loop, so its own timer can never fire.
    art = build_code(builder, tmp_path / "spin", "nodejs20", {"handler.js": "exports.handle = () => { for (;;) {} };"})
    started = time.monotonic()
    result = run_once(art, {}, 1)
    elapsed = time.monotonic() - started
    assert 5.5 <= elapsed < 60, elapsed
    assert not result.ok and result.timed_out
    assert result.exit_code == -9
    assert "killed" in result.output


def test_leftover_processes_die_with_the_run(builder: Builder, tmp_path: Path) -> None:
    # The child inherits stdout/stderr: without the group kill the pipes would stay open.
    handler = """
        import subprocess

        def handle(event):
            child = subprocess.Popen(["sleep", "300"])
            return {"pid": child.pid}
    """
    art = build_code(builder, tmp_path / "leak", "python3.11", {"handler.py": handler})
    started = time.monotonic()
    result = run_once(art, {}, 30)
    assert time.monotonic() - started < 20
    assert result.ok, result.output
    pid = json.loads(result.output)["pid"]
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_long_traceback_keeps_its_end(builder: Builder, tmp_path: Path) -> None:
    handler = """
        def handle(event):
            raise ValueError("x" * 5000 + " END-OF-MESSAGE")
    """
    art = build_code(builder, tmp_path / "tb", "python3.11", {"handler.py": handler})
    result = run_once(art, {}, 30)
    assert not result.ok
    assert len(result.output) <= MAX_OUTPUT_CHARS
    assert result.output.startswith(TRUNCATION_MARK)
    assert "END-OF-MESSAGE" in result.output


def test_long_result_keeps_its_start(builder: Builder, tmp_path: Path) -> None:
    art = build_code(builder, tmp_path / "big", "python3.11", {"handler.py": "def handle(e):\n    return 'y' * 5000\n"})
    result = run_once(art, {}, 30)
    assert result.ok
    assert len(result.output) <= MAX_OUTPUT_CHARS
    assert result.output.startswith('"yyyy')
    assert result.output.endswith(TRUNCATION_MARK)


def test_huge_output_is_bounded(builder: Builder, tmp_path: Path) -> None:
    handler = """
        import sys

        def handle(event):
            chunk = "z" * 1_000_000 + "\\n"
            for _ in range(40):
                sys.stderr.write(chunk)
            raise RuntimeError("after 40 MB of noise")
    """
    art = build_code(builder, tmp_path / "noise", "python3.11", {"handler.py": handler})
    result = run_once(art, {}, 60)
    assert not result.ok
    assert len(result.output) <= MAX_OUTPUT_CHARS
    assert "after 40 MB of noise" in result.output


def test_python_functions_do_not_see_host_site_packages(builder: Builder, tmp_path: Path) -> None:
    # The host interpreter's site-packages hold whatever this machine installed; a function
    # importing one of those would work here and fail in its image. pip is a probe that is
    # always there (the builder runs it).
    art = build_code(builder, tmp_path / "iso", "python3.11", {"handler.py": "def handle(e):\n    import pip\n"})
    result = run_once(art, {}, 30)
    assert not result.ok
    assert "No module named 'pip'" in result.output


def test_event_too_large_for_the_environment(builder: Builder, tmp_path: Path) -> None:
    art = build_code(builder, tmp_path / "e2big", "python3.11", {"handler.py": "def handle(e):\n    return 1\n"})
    result = run_once(art, {"blob": "b" * 300_000}, 30)
    assert not result.ok
    assert result.exit_code is None
    assert "cannot start the runner" in result.output


# -- sandboxed runs ---------------------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="per-tenant uids and cgroups need root")


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    """One sandbox for the module, closed at the end (its cgroups go with it)."""
    made = Sandbox.detect("bwrap", toolchain=toolchain_paths())
    yield made
    made.close()


def _jailed(sandbox: Sandbox, art: BuildArtifact, memory_mb: int, cpu_sec: int | None = None) -> dict[str, Any]:
    limits = Limits.for_function(memory_mb, art.runtime, cpu_sec=cpu_sec)
    return {"sandbox": sandbox, "jail": art.jail("runner-tenant", limits)}


@needs_root
def test_sandboxed_run_is_its_tenants_uid_and_leaves_nothing(
    builder: Builder, tmp_path: Path, sandbox: Sandbox
) -> None:
    handler = """
        import os, subprocess

        def handle(event):
            subprocess.Popen(["sleep", "331"], start_new_session=True)
            return {"uid": os.getuid(), "pid": os.getpid()}
    """
    art = build_code(builder, tmp_path / "who", "python3.11", {"handler.py": handler})
    result = run_once(art, {}, 30, **_jailed(sandbox, art, 128))
    assert result.ok, result.output
    assert json.loads(result.output) == {"uid": tenant_uid("runner-tenant"), "pid": 2}
    assert not any(b"sleep\x00331" in _cmdline(pid) for pid in _pids())


@needs_root
def test_sandboxed_run_over_its_memory_says_so(builder: Builder, tmp_path: Path, sandbox: Sandbox) -> None:
    handler = """
        def handle(event):
            return len([b"x" * (1 << 20) for _ in range(400)])
    """
    art = build_code(builder, tmp_path / "hog", "python3.11", {"handler.py": handler})
    result = run_once(art, {}, 30, **_jailed(sandbox, art, 64))
    assert not result.ok
    assert "memory limit of 64 MB" in result.output, result.output


@needs_root
def test_sandboxed_run_over_its_cpu_time_says_so(builder: Builder, tmp_path: Path, sandbox: Sandbox) -> None:
    handler = """
        def handle(event):
            while True:
                pass
    """
    art = build_code(builder, tmp_path / "spin-cpu", "python3.11", {"handler.py": handler})
    started = time.monotonic()
    result = run_once(art, {}, 60, **_jailed(sandbox, art, 128, cpu_sec=1))
    assert time.monotonic() - started < 20
    assert not result.ok
    assert "1 s of CPU time" in result.output, result.output


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
