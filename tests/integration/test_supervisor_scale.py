"""Several processes of one key (a function's ``scale`` with ``max`` > 1) against the real Python runtime.

Calls are held inside the handler until the test releases them (a file appears), so how many processes run and
which call each one holds is decided by the supervisor alone, not by timing. Every test ends by checking that no
child process of ours is left behind (``run_scenario``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from sless_api.backends.standalone.host.pool import Scale
from sless_api.backends.standalone.host.supervisor import Busy, ProcessSpec, Supervisor
from tests.support.poll import holds_async, until_async
from tests.support.supervised import POLL, child_pids, get, run_scenario

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "runtimes" / "python3.11" / "server.py"

pytestmark = pytest.mark.skipif(not SERVER.is_file(), reason="runtimes/python3.11/server.py not written yet")

#: ``?hold=NAME`` writes ``in-NAME`` (its pid) into GATE_DIR and returns once ``release`` exists there (at most
#: 60 s, so a failed test never leaves a handler behind); ``?sleep=S`` sleeps. Every answer names its process.
HANDLER = """\
import os
import time
from pathlib import Path


def handle(event):
    query = event.get("_query") or {}
    if "hold" in query:
        gate = Path(os.environ["GATE_DIR"])
        (gate / ("in-" + query["hold"])).write_text(str(os.getpid()))
        deadline = time.monotonic() + 60
        while not (gate / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    if "sleep" in query:
        time.sleep(float(query["sleep"]))
    return {"version": os.environ["FN_VERSION"], "pid": os.getpid(), "port": int(os.environ["PORT"])}
"""

#: The reaper looks every 0.1 s (a quarter of the supervisor's idle timeout); a spec's idle_sec is 0.5 s.
IDLE_SEC = 0.5
OPTIONS: dict[str, Any] = {"idle_timeout_sec": 0.4}


@pytest.fixture
def code(tmp_path: Path) -> Path:
    folder = tmp_path / "fn"
    folder.mkdir()
    (folder / "handler.py").write_text(HANDLER)
    return folder


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    folder = tmp_path / "gate"
    folder.mkdir()
    return folder


def spec(code: Path, gate: Path, version: str = "v1", scale: Scale | None = None, **more: Any) -> ProcessSpec:
    env = {"SLESS_CODE_DIR": str(code), "FN_VERSION": version, "GATE_DIR": str(gate),
           "PYTHONDONTWRITEBYTECODE": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return ProcessSpec(argv=[sys.executable, str(SERVER)], env=env, cwd=code, version=version, scale=scale,
                       idle_sec=IDLE_SEC if scale is not None else None, **more)


def held(gate: Path) -> dict[str, int]:
    """The held calls that reached their handler: name -> the pid holding it."""
    return {p.name[3:]: int(p.read_text()) for p in gate.glob("in-*") if p.read_text()}


def processes(sup: Supervisor) -> int:
    return int(sup.status("fn")["processes"])


def log_text(tmp_path: Path) -> str:
    return (tmp_path / "logs" / "fn.log").read_text(errors="replace")


async def stopped_cleanly(tmp_path: Path, pids: set[int]) -> None:
    """Wait until the supervisor logged each of PIDS exiting with 0 after being asked to stop (drained)."""
    lines = {f"pid {pid} stopped (exit code 0)" for pid in pids}
    await until_async(f"pids {sorted(pids)} to exit cleanly",
                      lambda: all(line in log_text(tmp_path) for line in lines), 30, POLL)
    assert not pids & child_pids()


async def hold_calls(sup: Supervisor, session: aiohttp.ClientSession, gate: Path,
                     names: list[str]) -> list[asyncio.Task[dict[str, Any]]]:
    """Start one leased call per name and wait until each runs in its handler."""

    async def call(name: str) -> dict[str, Any]:
        async with sup.lease("fn") as url:
            return await get(session, url, hold=name)

    tasks = [asyncio.create_task(call(name)) for name in names]
    await until_async(f"{len(names)} calls held in their handlers", lambda: set(names) <= held(gate).keys(), 60, POLL)
    return tasks


def test_held_calls_start_up_to_max_processes_one_call_each(tmp_path: Path, code: Path, gate: Path) -> None:
    """target 1, max 3: three held calls run in three processes (own pid, own port), one each; a fourth call
    starts no fourth process and goes to one of them."""

    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, gate, scale=Scale(max=3, target=1)))
        async with aiohttp.ClientSession() as session:
            first = await hold_calls(sup, session, gate, ["a", "b", "c"])
            pids = held(gate)
            assert len(set(pids.values())) == 3, f"one process per held call: {pids}"
            assert processes(sup) == 3 and sup.status("fn")["inflight"] == 3
            fourth = await hold_calls(sup, session, gate, ["d"])
            assert held(gate)["d"] in set(pids.values())
            await holds_async("at most max processes", lambda: processes(sup) == 3 and sup.status("fn")["state"]
                              == "running", 1.0, "a fourth process would be healthy within 0.3 s of the call")
            (gate / "release").touch()
            answers = await asyncio.gather(*first, *fourth)
        assert len({a["pid"] for a in answers}) == 3 and len({a["port"] for a in answers}) == 3
        assert Counter(Counter(a["pid"] for a in answers).values()) == Counter({1: 2, 2: 1})
        assert log_text(tmp_path).count("starting version") == 3

    run_scenario(tmp_path, scenario, **OPTIONS)


def test_extra_processes_stop_after_idle_sec_down_to_zero(tmp_path: Path, code: Path, gate: Path) -> None:
    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, gate, scale=Scale(min=0, max=3, target=1)))
        async with aiohttp.ClientSession() as session:
            calls = await hold_calls(sup, session, gate, ["a", "b", "c"])
            (gate / "release").touch()
            answers = await asyncio.gather(*calls)
        await until_async("every process gone", lambda: sup.status("fn")["state"] == "stopped", 20, POLL)
        assert processes(sup) == 0 and sup.status("fn")["failures"] == 0
        await stopped_cleanly(tmp_path, {a["pid"] for a in answers})

    run_scenario(tmp_path, scenario, **OPTIONS)


def test_extra_processes_stop_after_idle_sec_down_to_min(tmp_path: Path, code: Path, gate: Path) -> None:
    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, gate, scale=Scale(min=1, max=3, target=1), keep_warm=True))
        await until_async("the warm process", lambda: processes(sup) == 1, 20, POLL)
        async with aiohttp.ClientSession() as session:
            calls = await hold_calls(sup, session, gate, ["a", "b", "c"])
            assert processes(sup) == 3
            (gate / "release").touch()
            await asyncio.gather(*calls)
            await until_async("back to min", lambda: processes(sup) == 1, 20, POLL)
            await holds_async("min stays warm", lambda: processes(sup) == 1, 1.5,
                              "the reaper looks every 0.1 s and retires after 0.5 s idle; 1.5 s is 3 times that")
            assert (await get(session, await sup.endpoint("fn")))["version"] == "v1"

    run_scenario(tmp_path, scenario, **OPTIONS)


def test_no_failed_call_across_scale_up_and_scale_down(tmp_path: Path, code: Path) -> None:
    """A burst from 6 callers scales out to max (never beyond), then one caller's steady calls let the extra
    processes idle out while it keeps calling: every call answers 200."""

    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, tmp_path, scale=Scale(max=3, target=1)))
        most, failures, pids = 0, list[str](), set[int]()

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, processes(sup))
                await asyncio.sleep(POLL)

        async with aiohttp.ClientSession() as session:

            async def call(sleep: str) -> None:
                try:
                    async with sup.lease("fn") as url:
                        pids.add((await get(session, url, sleep=sleep))["pid"])
                except Exception as exc:  # every failure is the finding
                    failures.append(repr(exc))

            async def caller(count: int) -> None:
                for _ in range(count):
                    await call("0.05")

            watcher = asyncio.create_task(watch())
            await asyncio.gather(*(caller(25) for _ in range(6)))  # 150 calls, 6 at once
            assert most == 3 and len(pids) == 3, f"the burst ran {most} processes, {len(pids)} answered"
            # Then 50 calls one at a time: one process is needed, and the others stop meanwhile.
            await caller(50)
            await until_async("the extra processes to leave", lambda: processes(sup) == 1, 20, POLL)
            watcher.cancel()
        assert failures == [], failures
        assert most == 3, f"{most} processes at once with max 3"
        assert log_text(tmp_path).count("not needed for") == 2

    run_scenario(tmp_path, scenario, **OPTIONS)


def test_a_function_without_scale_runs_one_process_under_concurrent_calls(
        tmp_path: Path, code: Path, gate: Path) -> None:
    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, gate))
        async with aiohttp.ClientSession() as session:
            calls = await hold_calls(sup, session, gate, [str(i) for i in range(6)])
            assert len(set(held(gate).values())) == 1 and processes(sup) == 1
            (gate / "release").touch()
            answers = await asyncio.gather(*calls)
        assert len({a["pid"] for a in answers}) == 1
        assert log_text(tmp_path).count("starting version") == 1

    run_scenario(tmp_path, scenario, **OPTIONS)


def test_max_concurrency_is_per_process(tmp_path: Path, code: Path, gate: Path) -> None:
    """limit 1 below target 10: a full process asks for another; at max, a call waits for a freed process (here
    past ``full_wait_sec``: Busy), and a freed one takes the next call."""

    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, gate, scale=Scale(max=2, target=10, limit=1)))
        async with aiohttp.ClientSession() as session:
            calls = await hold_calls(sup, session, gate, ["a", "b"])
            assert len(set(held(gate).values())) == 2 and processes(sup) == 2
            with pytest.raises(Busy, match="limit of 1 calls in flight"):
                async with sup.lease("fn"):
                    pass
            waiting = asyncio.create_task(hold_calls(sup, session, gate, ["c"]))
            await until_async("a call waiting for a freed process", lambda: sup._slots["fn"].waiting == 1, 20, POLL)
            (gate / "release").touch()
            answers = await asyncio.gather(*calls, *(await waiting))
        assert answers[2]["pid"] in {answers[0]["pid"], answers[1]["pid"]}

    run_scenario(tmp_path, scenario, full_wait_sec=0.5, **OPTIONS)


def test_a_crashed_process_leaves_the_others_serving(tmp_path: Path, code: Path, gate: Path) -> None:
    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, gate, scale=Scale(max=3, target=1)))
        async with aiohttp.ClientSession() as session:
            calls = await hold_calls(sup, session, gate, ["a", "b", "c"])
            victim = held(gate)["a"]
            os.kill(victim, signal.SIGKILL)
            await until_async("the crash accounted for", lambda: sup.status("fn")["failures"] == 1, 20, POLL)
            assert processes(sup) == 2 and sup.status("fn")["state"] == "running"
            (gate / "release").touch()
            answers = await asyncio.gather(*calls, return_exceptions=True)
            assert sum(isinstance(a, BaseException) for a in answers) == 1, "only the killed process's call fails"
            after = [await get(session, url) for url in [await sup.endpoint("fn") for _ in range(3)]]
        assert victim not in {a["pid"] for a in after}

    run_scenario(tmp_path, scenario, **OPTIONS)


def test_redeploy_of_several_processes_drops_no_call(tmp_path: Path, code: Path, gate: Path) -> None:
    """Three v1 processes hold a call each while v2 is deployed: the held calls finish on v1, then their
    processes stop cleanly; 6 callers calling throughout see v1 then v2 and no failure."""

    async def scenario(sup: Supervisor) -> None:
        scale = Scale(max=3, target=1)
        await sup.deploy("fn", spec(code, gate, scale=scale))
        stop, failures, seen = asyncio.Event(), list[str](), list[str]()
        async with aiohttp.ClientSession() as session:
            calls = await hold_calls(sup, session, gate, ["a", "b", "c"])
            old = set(held(gate).values())
            assert len(old) == 3

            async def caller() -> None:
                for _ in range(2000):
                    if stop.is_set():
                        return
                    try:
                        async with sup.lease("fn") as url:
                            seen.append((await get(session, url, sleep="0.01"))["version"])
                    except Exception as exc:  # every failure is the finding
                        failures.append(repr(exc))

            callers = [asyncio.create_task(caller()) for _ in range(6)]
            await until_async("v1 serving the callers", lambda: seen.count("v1") >= 20, 30, POLL)
            await sup.deploy("fn", dataclasses.replace(spec(code, gate, "v2", scale=scale)))
            assert sup.status("fn")["running_version"] == "v2"
            await until_async("v2 serving the callers", lambda: seen.count("v2") >= 50, 30, POLL)
            stop.set()
            await asyncio.gather(*callers)
            (gate / "release").touch()
            answers = await asyncio.gather(*calls)
        assert failures == [], failures
        assert {a["version"] for a in answers} == {"v1"} and {a["pid"] for a in answers} == old
        assert seen.index("v2") > 0 and "v1" not in seen[seen.index("v2") + 12:], "v1 took calls after the switch"
        await stopped_cleanly(tmp_path, old)
        assert sup.status("fn")["processes"] <= 3

    run_scenario(tmp_path, scenario, **OPTIONS)


def test_a_call_refused_by_its_process_moves_to_another(tmp_path: Path, code: Path, gate: Path) -> None:
    """``Lease.elsewhere``: the proxy's call whose process refused the connection (it died, its exit not yet
    accounted for) is held by another serving process instead, and gets there; none other: None (the proxy then
    tries the same address again, as a key of one process always does)."""

    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("fn", spec(code, gate, scale=Scale(min=2, max=2, target=1)))
        async with aiohttp.ClientSession() as session:
            (gate / "release").touch()
            await until_async("both processes serving", lambda: processes(sup) == 2, 30, POLL)
            lease = sup.lease("fn")
            first = await lease.__aenter__()
            moved = lease.elsewhere([first])
            assert moved is not None and moved != first
            assert sup.status("fn")["inflight"] == 1  # the hold moved, it was not doubled
            assert (await get(session, moved))["port"] != int(first.rsplit(":", 1)[1])
            assert lease.elsewhere([first, moved]) is None  # no third process
            await lease.__aexit__(None, None, None)
            assert sup.status("fn")["inflight"] == 0
        await sup.deploy("single", spec(code, gate))
        single = sup.lease("single")
        only = await single.__aenter__()
        assert single.elsewhere([only]) is None
        await single.__aexit__(None, None, None)

    run_scenario(tmp_path, scenario, **OPTIONS)
