"""The standalone backend's process supervisor against the real Python runtime.

Every test starts real runtime servers (runtimes/python3.11/server.py) on
loopback ports through the supervisor and talks HTTP to them, and every test
ends by checking that no child process of ours is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from sless_api.backends.standalone.builder import python_interpreter, toolchain_paths
from sless_api.backends.standalone.host import supervisor as supervisor_module
from sless_api.backends.standalone.host.sandbox import JailSpec, Limits, Sandbox
from sless_api.backends.standalone.host.supervisor import NotDeployed, ProcessSpec, StartFailed, Supervisor
from tests.support.poll import holds_async, until_async
from tests.support.supervised import POLL, child_pids, get, run_scenario

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "runtimes" / "python3.11" / "server.py"

pytestmark = pytest.mark.skipif(not SERVER.is_file(), reason="runtimes/python3.11/server.py not written yet")

HANDLER = """\
import os
import time


def handle(event):
    query = event.get("_query") or {}
    if "sleep" in query:
        time.sleep(float(query["sleep"]))
    if "spam" in query:
        print("x" * int(query["spam"]), flush=True)
    return {"version": os.environ["FN_VERSION"], "pid": os.getpid()}
"""

BROKEN_HANDLER = """\
import no_such_module_for_sless_tests


def handle(event):
    return "unreachable"
"""

SLOW_IMPORT_HANDLER = """\
import time

time.sleep(60)


def handle(event):
    return "late"
"""

T = TypeVar("T")


# ---------------------------------------------------------------------- helpers


def write_function(root: Path, name: str, source: str) -> Path:
    code = root / name
    code.mkdir(parents=True, exist_ok=True)
    (code / "handler.py").write_text(source)
    return code


@pytest.fixture
def code(tmp_path: Path) -> Path:
    """A tiny function answering with its version and pid, optionally sleeping or printing."""
    return write_function(tmp_path, "fn", HANDLER)


def spec(code_dir: Path, version: str) -> ProcessSpec:
    """The Python runtime serving ``code_dir``; the version is visible in every response."""
    env = {
        "SLESS_CODE_DIR": str(code_dir),
        "FN_VERSION": version,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    return ProcessSpec(argv=[sys.executable, str(SERVER)], env=env, cwd=code_dir, version=version)


def is_child(pid: int) -> bool:
    return pid in child_pids()


def log_text(tmp_path: Path, key: str = "fn") -> str:
    return (tmp_path / "logs" / f"{key}.log").read_text(errors="replace")


def stopped_cleanly(tmp_path: Path, pid: int, key: str = "fn") -> bool:
    """The supervisor logged that ``pid`` exited with 0 after being asked to stop (SIGTERM, drained)."""
    return f"pid {pid} stopped (exit code 0)" in log_text(tmp_path, key)


def starts(tmp_path: Path, key: str = "fn") -> int:
    return log_text(tmp_path, key).count("starting version")


def direct_start_seconds(code_dir: Path) -> float:
    """Baseline: the runtime started by a bare Popen and polled by a tight blocking loop."""
    port = supervisor_module.free_port()
    env = {**spec(code_dir, "base").env, "PORT": str(port), "SLESS_HOST": "127.0.0.1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while True:
            assert proc.poll() is None, "runtime exited during the baseline start"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                    conn.sendall(b"GET /_/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    if conn.recv(64).split()[1:2] == [b"200"]:
                        return time.perf_counter() - t0
            except OSError:
                pass
            time.sleep(0.001)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ---------------------------------------------------------------------- tests


def test_unknown_key_is_not_deployed(tmp_path: Path) -> None:
    async def scenario(sup: Supervisor) -> None:
        with pytest.raises(NotDeployed):
            await sup.endpoint("nothing")
        with pytest.raises(NotDeployed):
            sup.status("nothing")
        await sup.remove("nothing")  # forgetting what is not there is fine

    run_scenario(tmp_path, scenario)


def test_lazy_cold_start_then_reuse(tmp_path: Path, code: Path) -> None:
    async def scenario(sup: Supervisor) -> list[float]:
        await sup.deploy("fn", spec(code, "v1"))
        status = sup.status("fn")
        assert status["state"] == "stopped" and status["pid"] is None, "deploy() must not start lazily"

        t0 = time.perf_counter()
        url = await sup.endpoint("fn")
        cold = [time.perf_counter() - t0]
        async with aiohttp.ClientSession() as session:
            first = await get(session, url)
            t1 = time.perf_counter()
            again = await sup.endpoint("fn")
            warm = time.perf_counter() - t1
            second = await get(session, again)
        assert again == url
        assert first == second == {"version": "v1", "pid": sup.status("fn")["pid"]}
        status = sup.status("fn")
        assert status["state"] == "running" and status["restarts"] == 0 and status["last_error"] is None
        assert starts(tmp_path) == 1

        # More cold starts, for the measurement only.
        for i in range(4):
            await sup.deploy(f"m{i}", spec(code, "v1"))
            t0 = time.perf_counter()
            await sup.endpoint(f"m{i}")
            cold.append(time.perf_counter() - t0)
        print(f"\nwarm endpoint(): {warm * 1e6:.0f} us")
        return cold

    cold = run_scenario(tmp_path, scenario)
    baseline = [direct_start_seconds(code) for _ in range(3)]
    print(
        f"cold start through Supervisor.endpoint(): median {statistics.median(cold) * 1000:.0f} ms "
        f"(all: {', '.join(f'{c * 1000:.0f}' for c in cold)} ms); "
        f"bare Popen + 1 ms health poll: median {statistics.median(baseline) * 1000:.0f} ms"
    )


def test_concurrent_first_calls_share_one_process(tmp_path: Path, code: Path) -> None:
    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, "v1"))
        async with aiohttp.ClientSession() as session:

            async def call() -> dict[str, Any]:
                async with sup.lease("fn") as url:
                    return await get(session, url)

            results = await asyncio.gather(*(call() for _ in range(20)))
        assert len({r["pid"] for r in results}) == 1
        assert starts(tmp_path) == 1

    run_scenario(tmp_path, scenario)


def test_crash_is_restarted_on_next_call_then_backs_off(tmp_path: Path, code: Path) -> None:
    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, "v1"))
        async with aiohttp.ClientSession() as session:
            first = await get(session, await sup.endpoint("fn"))
            os.kill(first["pid"], signal.SIGKILL)
            await until_async("the crash to be accounted for", lambda: sup.status("fn")["failures"] == 1, 20, POLL)
            status = sup.status("fn")
            assert status["state"] == "crashed"
            assert "exited unexpectedly with code -9" in status["last_error"]

            second = await get(session, await sup.endpoint("fn"))
            assert second["pid"] != first["pid"] and second["version"] == "v1"
            assert sup.status("fn")["restarts"] == 1

            # A second crash soon after: the next start waits, and calls fail fast meanwhile.
            os.kill(second["pid"], signal.SIGKILL)
            await until_async("the second crash", lambda: sup.status("fn")["state"] != "running", 20, POLL)
            t0 = time.perf_counter()
            with pytest.raises(StartFailed) as failed:
                await sup.endpoint("fn")
            assert time.perf_counter() - t0 < 5.0, "a call during backoff must fail fast, not hang"
            assert "not restarting" in str(failed.value)
            assert "exited unexpectedly with code -9" in str(failed.value)
            status = sup.status("fn")
            assert status["state"] == "backoff" and status["retry_in_sec"] > 0

            await asyncio.sleep(status["retry_in_sec"] + 0.05)  # the clock rule itself: the backoff runs out
            third = await get(session, await sup.endpoint("fn"))
            assert third["pid"] not in (first["pid"], second["pid"])
            assert sup.status("fn")["restarts"] == 2

    run_scenario(tmp_path, scenario, backoff_base_sec=0.5)


def test_import_error_fails_start_with_its_text_then_backs_off(tmp_path: Path, code: Path) -> None:
    broken = write_function(tmp_path, "broken", BROKEN_HANDLER)

    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(broken, "v1"))
        with pytest.raises(StartFailed) as first:
            await sup.endpoint("fn")
        assert "no_such_module_for_sless_tests" in str(first.value)
        assert "during start-up" in str(first.value)

        t0 = time.perf_counter()
        with pytest.raises(StartFailed) as second:
            await sup.endpoint("fn")
        assert time.perf_counter() - t0 < 5.0
        assert "not restarting" in str(second.value)
        assert "no_such_module_for_sless_tests" in str(second.value)
        assert starts(tmp_path) == 1, "no new process may be started during backoff"
        status = sup.status("fn")
        assert status["state"] == "backoff" and status["failures"] == 1 and status["pid"] is None

        await asyncio.sleep(status["retry_in_sec"] + 0.05)  # the clock rule itself: the backoff runs out
        with pytest.raises(StartFailed, match="no_such_module_for_sless_tests"):
            await sup.endpoint("fn")
        assert starts(tmp_path) == 2
        status = sup.status("fn")
        assert status["failures"] == 2 and status["restarts"] == 1
        assert status["retry_in_sec"] > 0.6, "the delay doubles (0.5 s, then 1 s)"

        # A fixed version starts at once: a new version does not inherit the backoff.
        await sup.deploy("fn", spec(code, "v2"))
        async with aiohttp.ClientSession() as session:
            assert (await get(session, await sup.endpoint("fn")))["version"] == "v2"
        assert sup.status("fn")["failures"] == 0

    run_scenario(tmp_path, scenario, backoff_base_sec=0.5)


def test_start_timeout_kills_the_process(tmp_path: Path) -> None:
    hanging = write_function(tmp_path, "hanging", SLOW_IMPORT_HANDLER)

    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(hanging, "v1"))
        before = child_pids()
        with pytest.raises(StartFailed, match="not healthy within 1s"):
            await sup.endpoint("fn")
        assert child_pids() <= before, "the process that never became healthy must be killed"

    run_scenario(tmp_path, scenario, start_timeout_sec=1.0)


def test_idle_process_is_stopped_and_started_again(tmp_path: Path, code: Path) -> None:
    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, "v1"))
        async with aiohttp.ClientSession() as session:
            async with sup.lease("fn") as url:
                # A leased call lasting longer than the idle timeout is not cut.
                slow = await get(session, url, sleep="1.5")
            pid = slow["pid"]
            await until_async("the idle reaper", lambda: sup.status("fn")["state"] == "stopped", 20, POLL)
            await until_async("the idle process to exit", lambda: stopped_cleanly(tmp_path, pid), 20, POLL)
            assert not is_child(pid)
            status = sup.status("fn")
            assert status["failures"] == 0 and status["last_error"] is None, "scale to zero is no failure"

            again = await get(session, await sup.endpoint("fn"))
            assert again["pid"] != pid and again["version"] == "v1"

    run_scenario(tmp_path, scenario, idle_timeout_sec=0.5)


def test_a_spec_idle_sec_is_its_own_idle_timeout(tmp_path: Path, code: Path) -> None:
    """A function's ``scale.idle_sec`` (ProcessSpec.idle_sec) replaces the supervisor's idle timeout."""

    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", dataclasses.replace(spec(code, "v1"), idle_sec=0.5))
        async with aiohttp.ClientSession() as session:
            pid = (await get(session, await sup.endpoint("fn")))["pid"]
        await until_async("the spec's idle timeout", lambda: sup.status("fn")["state"] == "stopped", 20, POLL)
        await until_async("the idle process to exit", lambda: stopped_cleanly(tmp_path, pid), 20, POLL)

    run_scenario(tmp_path, scenario, idle_timeout_sec=300)


def test_a_spec_kept_warm_starts_at_deploy_outlives_idleness_and_comes_back_after_a_crash(
        tmp_path: Path, code: Path) -> None:
    """``keep_warm`` (a function's ``scale.min`` >= 1): running without a call, never reaped, restarted."""

    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", dataclasses.replace(spec(code, "v1"), keep_warm=True))
        await until_async("the warm start", lambda: sup.status("fn")["state"] == "running", 20, POLL)
        pid = sup.status("fn")["pid"]
        await holds_async("the warm process", lambda: sup.status("fn")["pid"] == pid, 1.5,
                          "the reaper looks every 0.1 s and stops processes idle 0.4 s; 1.5 s is over 3 times that")
        os.kill(pid, signal.SIGKILL)
        await until_async("a warm process again", lambda: sup.status("fn")["pid"] not in (None, pid), 20, POLL)
        async with aiohttp.ClientSession() as session:
            assert (await get(session, await sup.endpoint("fn")))["pid"] == sup.status("fn")["pid"]

    run_scenario(tmp_path, scenario, idle_timeout_sec=0.4)


def test_redeploy_under_load_has_zero_failed_requests(tmp_path: Path, code: Path) -> None:
    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, "v1"), eager=True)
        first_pid = sup.status("fn")["pid"]
        stop = asyncio.Event()
        seen: list[str] = []
        failures: list[str] = []

        async with aiohttp.ClientSession() as session:

            async def worker() -> None:
                for _ in range(5000):
                    if stop.is_set():
                        return
                    try:
                        async with sup.lease("fn") as url:
                            body = await get(session, url)
                        seen.append(body["version"])
                    except Exception as exc:
                        failures.append(repr(exc))

            # the scenario: each version serves load for a while (0.5 s) before the next deploy
            workers = [asyncio.create_task(worker()) for _ in range(4)]
            await asyncio.sleep(0.5)
            await sup.deploy("fn", spec(code, "v2"))
            second_pid = sup.status("fn")["pid"]
            await asyncio.sleep(0.5)
            await sup.deploy("fn", spec(code, "v3"))
            await asyncio.sleep(0.5)
            stop.set()
            await asyncio.gather(*workers)

            assert failures == []
            assert set(seen) == {"v1", "v2", "v3"}, f"versions seen: {sorted(set(seen))}"
            assert len(seen) >= 30, f"only {len(seen)} requests: no real load"
            after = await get(session, await sup.endpoint("fn"))
            assert after["version"] == "v3"
            status = sup.status("fn")
            assert status["version"] == status["running_version"] == "v3"
            assert status["restarts"] == 0 and status["failures"] == 0

        # The replaced processes drained and exited on their own (SIGTERM, exit code 0).
        await until_async("the old processes to exit",
                          lambda: stopped_cleanly(tmp_path, first_pid) and stopped_cleanly(tmp_path, second_pid),
                          20, POLL)
        assert not is_child(first_pid) and not is_child(second_pid)
        print(f"\nredeploy under load: {len(seen)} requests, 0 failures")

    run_scenario(tmp_path, scenario)


def test_slow_in_flight_requests_survive_redeploy(tmp_path: Path, code: Path) -> None:
    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, "v1"), eager=True)
        old_pid = sup.status("fn")["pid"]
        async with aiohttp.ClientSession() as session:

            async def leased() -> dict[str, Any]:
                async with sup.lease("fn") as url:
                    return await get(session, url, sleep="1")

            # Not leased: only the runtime's own SIGTERM drain protects this one.
            bare_url = await sup.endpoint("fn")
            calls = [asyncio.create_task(leased()), asyncio.create_task(get(session, bare_url, sleep="3"))]
            await asyncio.sleep(0.4)  # the scenario: both calls inside their 1 s and 3 s handler sleeps when it deploys
            await sup.deploy("fn", spec(code, "v2"))
            fresh = await get(session, await sup.endpoint("fn"))
            assert fresh["version"] == "v2" and fresh["pid"] != old_pid

            leased_result, bare_result = await asyncio.gather(*calls)
            assert leased_result == bare_result == {"version": "v1", "pid": old_pid}
        await until_async("the old process to exit", lambda: stopped_cleanly(tmp_path, old_pid), 20, POLL)
        assert not is_child(old_pid)

    run_scenario(tmp_path, scenario)


def test_leased_url_stays_reachable_across_redeploy(tmp_path: Path, code: Path) -> None:
    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, "v1"), eager=True)
        old_pid = sup.status("fn")["pid"]
        async with sup.lease("fn") as url:
            await sup.deploy("fn", spec(code, "v2"))
            await asyncio.sleep(0.5)  # ample time for a SIGTERM to close the old listener
            async with aiohttp.ClientSession() as fresh:  # a new connection, not a pooled one
                body = await get(fresh, url)
            assert body == {"version": "v1", "pid": old_pid}
            assert is_child(old_pid)
        await until_async("the old process to exit after the lease",
                          lambda: stopped_cleanly(tmp_path, old_pid), 20, POLL)

    run_scenario(tmp_path, scenario)


def test_failed_redeploy_keeps_the_old_version_serving(tmp_path: Path, code: Path) -> None:
    broken = write_function(tmp_path, "broken", BROKEN_HANDLER)

    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, "v1"), eager=True)
        old_pid = sup.status("fn")["pid"]
        with pytest.raises(StartFailed, match="no_such_module_for_sless_tests"):
            await sup.deploy("fn", spec(broken, "v2"))
        async with aiohttp.ClientSession() as session:
            assert await get(session, await sup.endpoint("fn")) == {"version": "v1", "pid": old_pid}
        status = sup.status("fn")
        assert status["state"] == "running" and status["running_version"] == "v1"
        assert status["version"] == "v2" and "no_such_module_for_sless_tests" in status["last_error"]

    run_scenario(tmp_path, scenario)


def test_runtimes_die_with_a_killed_platform_process(tmp_path: Path, code: Path) -> None:
    platform = f"""
import asyncio, os, sys
from pathlib import Path
from sless_api.backends.standalone.host.supervisor import ProcessSpec, Supervisor

async def main():
    sup = Supervisor(log_dir=Path({str(tmp_path / "logs")!r}))
    await sup.deploy("fn", ProcessSpec({[sys.executable, str(SERVER)]!r}, {spec(code, "v1").env!r},
                                       Path({str(code)!r}), "v1"), eager=True)
    print(sup.status("fn")["pid"], flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""
    proc = subprocess.Popen([sys.executable, "-c", platform], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        runtime_pid = int(proc.stdout.readline())
        assert Path(f"/proc/{runtime_pid}").exists()
    finally:
        proc.kill()  # no chance to clean up: only the kernel's parent-death signal is left
        proc.wait(timeout=30)

    def gone() -> bool:
        try:
            stat = Path(f"/proc/{runtime_pid}/stat").read_text()
        except OSError:
            return True
        return stat[stat.rindex(")") + 2] == "Z"  # exited; only the reaping is left to init

    asyncio.run(until_async("the orphaned runtime to exit", gone, 20, POLL))


def test_remove_stops_and_forgets(tmp_path: Path, code: Path) -> None:
    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, "v1"), eager=True)
        pid = sup.status("fn")["pid"]
        assert is_child(pid)
        await sup.remove("fn")
        assert not is_child(pid)
        with pytest.raises(NotDeployed):
            await sup.endpoint("fn")
        with pytest.raises(NotDeployed):
            sup.status("fn")

    run_scenario(tmp_path, scenario)


def test_close_stops_everything_including_starts_in_progress(tmp_path: Path, code: Path) -> None:
    async def scenario(sup: Supervisor) -> None:
        for key in ("a", "b", "c"):
            await sup.deploy(key, spec(code, key), eager=True)
        pids = [sup.status(key)["pid"] for key in ("a", "b", "c")]
        await sup.deploy("d", spec(code, "d"))
        async with aiohttp.ClientSession() as session:
            in_flight = asyncio.create_task(get(session, await sup.endpoint("a"), sleep="1"))
            await asyncio.sleep(0.3)  # the scenario: the call is inside its 1 s handler sleep when close() comes
            starting = asyncio.create_task(sup.endpoint("d"))
            await asyncio.sleep(0)
            t0 = time.perf_counter()
            await sup.close()
            print(f"\nclose() of 4 processes: {(time.perf_counter() - t0) * 1000:.0f} ms")
            assert (await in_flight)["version"] == "a", "close() drains in-flight requests"
        with pytest.raises(NotDeployed):
            await starting
        assert not any(is_child(pid) for pid in pids)
        with pytest.raises(NotDeployed):
            await sup.endpoint("a")

    run_scenario(tmp_path, scenario)


@contextlib.contextmanager
def first_port_taken(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, list[int]]]:
    """The supervisor's first port is one another program holds; yields it and the ports handed out.

    Reproduces the race deterministically: the port is taken between the probe and the bind.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        real_free_port = supervisor_module.free_port
        handed_out: list[int] = []

        def first_one_taken(exclude: set[int] | frozenset[int] = frozenset()) -> int:
            port = taken if not handed_out else real_free_port(exclude)
            handed_out.append(port)
            return port

        monkeypatch.setattr(supervisor_module, "free_port", first_one_taken)
        yield taken, handed_out


def test_port_taken_meanwhile_is_retried(tmp_path: Path, code: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with first_port_taken(monkeypatch) as (taken, handed_out):

        async def scenario(sup: Supervisor) -> None:
            await sup.deploy("fn", spec(code, "v1"))
            url = await sup.endpoint("fn")
            assert url != f"http://127.0.0.1:{taken}"
            async with aiohttp.ClientSession() as session:
                assert (await get(session, url))["version"] == "v1"
            assert handed_out[0] == taken and len(handed_out) == 2
            assert "in use" in log_text(tmp_path).lower()
            assert sup.status("fn")["failures"] == 0, "a lost port race is not a failure of the function"

        run_scenario(tmp_path, scenario)


def test_output_goes_to_a_size_capped_log(tmp_path: Path, code: Path) -> None:
    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, "v1"))
        async with aiohttp.ClientSession() as session:
            url = await sup.endpoint("fn")
            for _ in range(6):
                await get(session, url, spam="1500")
        logs = tmp_path / "logs"
        await until_async("log rotation", lambda: (logs / "fn.log.1").exists(), 20, POLL)
        assert (logs / "fn.log").stat().st_size <= 4000 + 1600
        assert "x" * 1500 in (logs / "fn.log").read_text() + (logs / "fn.log.1").read_text()

    run_scenario(tmp_path, scenario, log_max_bytes=4000)


# ---------------------------------------------------------------------- sandboxed processes

MEMORY_HOG = """\
import os


def handle(event):
    query = event.get("_query") or {}
    hog = [b"x" * (1 << 20) for _ in range(int(query.get("mb", "0")))]
    return {"pid": os.getpid(), "uid": os.getuid(), "held": len(hog)}
"""


def sandboxed_spec(sandbox: Sandbox, code_dir: Path, version: str, memory_mb: int = 128) -> ProcessSpec:
    """``spec`` run inside a bwrap sandbox of tenant "t1" (the base interpreter: the venv is not mounted)."""
    plain = spec(code_dir, version)
    argv = [str(python_interpreter()), "-S", str(SERVER)]
    jail = JailSpec(tenant="t1", limits=Limits.for_function(memory_mb, "python3.11"), ro_binds=(code_dir,))
    return ProcessSpec(argv=argv, env=plain.env, cwd=code_dir, version=version, sandbox=sandbox, jail=jail)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    """One sandbox for the module, closed at the end (its cgroups and port rules go with it)."""
    made = Sandbox.detect("bwrap", toolchain=toolchain_paths())
    yield made
    made.close()


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="per-tenant uids and cgroups need root")


@needs_root
def test_sandboxed_process_has_its_own_pid_namespace_and_uid_and_drains_on_sigterm(
    tmp_path: Path, code: Path, sandbox: Sandbox
) -> None:
    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", sandboxed_spec(sandbox, code, "v1"))
        async with aiohttp.ClientSession() as session:
            async with sup.lease("fn") as url:
                first = await get(session, url)
            assert first["pid"] < 10  # numbered inside its own PID namespace
            old_pid = sup.status("fn")["pid"]
            await sup.deploy("fn", sandboxed_spec(sandbox, code, "v2"))
            async with sup.lease("fn") as url:
                assert (await get(session, url))["version"] == "v2"
        # SIGTERM reached the runtime inside the sandbox (bwrap does not forward it): a clean drain.
        await until_async("the old sandbox drained", lambda: stopped_cleanly(tmp_path, old_pid), 20, POLL)

    run_scenario(tmp_path, scenario)


@needs_root
def test_sandboxed_port_taken_on_the_host_is_retried(tmp_path: Path, code: Path, sandbox: Sandbox,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """In its own network namespace the runtime binds its port there, and pasta binds the same port on the
    host's loopback: pasta losing that race is a lost port race too, retried on another port."""
    if sandbox.pasta is None:
        pytest.skip("functions share the host's network here (no pasta)")
    with first_port_taken(monkeypatch) as (taken, handed_out):

        async def scenario(sup: Supervisor) -> None:
            await sup.deploy("fn", sandboxed_spec(sandbox, code, "v1"))
            async with aiohttp.ClientSession() as session, sup.lease("fn") as url:
                assert url != f"http://127.0.0.1:{taken}"
                assert (await get(session, url))["version"] == "v1"
            assert handed_out[0] == taken and len(handed_out) == 2
            assert "failed to bind" in log_text(tmp_path).lower()
            assert sup.status("fn")["failures"] == 0, "a lost port race is not a failure of the function"

        run_scenario(tmp_path, scenario)


@needs_root
def test_sandboxed_memory_limit_fails_the_call_with_a_clear_error(tmp_path: Path, sandbox: Sandbox) -> None:
    hog = write_function(tmp_path, "hog", MEMORY_HOG)

    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", sandboxed_spec(sandbox, hog, "v1", memory_mb=64))
        async with aiohttp.ClientSession() as session:
            async with sup.lease("fn") as url:
                assert (await get(session, url, mb="8"))["held"] == 8
            with pytest.raises(supervisor_module.LimitExceeded, match="memory limit of 64 MB"):
                async with sup.lease("fn") as url:
                    await get(session, url, mb="400")
            await until_async("the crash is recorded", lambda: sup.status("fn")["failures"] == 1, 20, POLL)
            assert "memory limit of 64 MB" in (sup.status("fn")["last_error"] or "")
            async with sup.lease("fn") as url:  # restarted on the next call
                assert (await get(session, url, mb="1"))["held"] == 1

    run_scenario(tmp_path, scenario)


def test_stopped_process_is_detected_by_its_health_probe_and_replaced(tmp_path: Path, code: Path) -> None:
    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, "v1"))
        async with aiohttp.ClientSession() as session:
            async with sup.lease("fn") as url:
                first = await get(session, url)
            os.kill(first["pid"], signal.SIGSTOP)
            await until_async("the probe gives up", lambda: sup.status("fn")["failures"] == 1, 10, POLL)
            assert "health probes" in (sup.status("fn")["last_error"] or "")
            async with sup.lease("fn") as url:
                assert (await get(session, url))["pid"] != first["pid"]

    run_scenario(tmp_path, scenario, health_interval_sec=0.2, health_timeout_sec=0.5, health_failures=2)
