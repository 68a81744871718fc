"""A function's ``scale`` on `sless up`: up to ``max`` processes under concurrent calls, back to ``min`` after
``idle_sec``, ``max_concurrency`` per process, and redeploys of several processes without a failed call.

Each answer names its process by an id drawn when the process imported the handler, and by its port (a sandboxed
process sees its own PID namespace, where pids repeat)."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import pytest
import requests

from tests.support.platform import SlessProcess, Tenant
from tests.support.poll import holds, until

pytestmark = pytest.mark.e2e


def handler(version: int = 1) -> dict[str, str | bytes]:
    return {"handler.py": (
        "import os\nimport time\nimport uuid\n\nPROCESS = uuid.uuid4().hex\n\n\n"
        "def handle(event):\n"
        "    time.sleep(float((event.get('_query') or {}).get('sleep', '0')))\n"
        f"    return {{'process': PROCESS, 'port': os.environ['PORT'], 'version': {version}}}\n"
    )}


def at_once(url: str, calls: int, sleep: str) -> list[dict[str, Any]]:
    """CALLS concurrent calls that each take SLEEP seconds in the handler; every one must answer 200."""
    with concurrent.futures.ThreadPoolExecutor(calls) as pool:
        answers = list(pool.map(lambda _: requests.get(url, params={"sleep": sleep}, timeout=60), range(calls)))
    assert [a.status_code for a in answers] == [200] * calls, [a.text[:200] for a in answers]
    return [a.json() for a in answers]


def processes_of(answers: list[dict[str, Any]], version: int) -> int:
    """How many processes answered for VERSION."""
    return len({a["process"] for a in answers if a["version"] == version})


def supervisor_log(sless: SlessProcess, tenant: Tenant, name: str) -> str:
    path = sless.data_dir / "logs" / f"{tenant.ns}.{name}.log"
    return path.read_text(errors="replace") if path.is_file() else ""


def test_a_scaled_function_runs_up_to_max_processes_then_scales_in(sless: SlessProcess, tenant: Tenant) -> None:
    tenant.deploy("wide", "python3.11", handler(), scale={"max": 3, "target": 1, "idle_sec": 5})
    url = tenant.fn_url("wide")
    three = at_once(url, 3, "1.5")
    assert len({a["process"] for a in three}) == 3 and len({a["port"] for a in three}) == 3, three
    five = at_once(url, 5, "1.5")
    assert len({a["process"] for a in five}) <= 3, "never more than max processes"
    log = supervisor_log(sless, tenant, "wide")
    started = log.count("healthy after")
    assert started == 3, log[-2000:]

    # min 0: after idle_sec without calls every process stops (each drained: exit code 0), none fails
    until("every process of the scaled function to stop",
          lambda: supervisor_log(sless, tenant, "wide").count("stopped (exit code 0)") == started, 30, 0.2)
    assert "exited unexpectedly" not in supervisor_log(sless, tenant, "wide")
    assert requests.get(url, timeout=60).status_code == 200


def test_min_processes_stay_warm_after_idle_sec(sless: SlessProcess, tenant: Tenant) -> None:
    tenant.deploy("warm", "python3.11", handler(), scale={"min": 1, "max": 3, "target": 1, "idle_sec": 5})
    at_once(tenant.fn_url("warm"), 3, "1.5")
    until("the two extra processes to stop",
          lambda: supervisor_log(sless, tenant, "warm").count("stopped (exit code 0)") == 2, 30, 0.2)
    log = supervisor_log(sless, tenant, "warm")
    assert log.count("healthy after") == 3 and log.count("not needed for") == 2, log[-2000:]
    holds("one process stays warm", lambda: supervisor_log(sless, tenant, "warm").count("stopped") == 2, 2.0,
          why="the reaper looks every second and the last call ended over 5 s ago; 2 s is two of its rounds")


def test_max_concurrency_is_per_process_of_a_scaled_function(tenant: Tenant) -> None:
    """target 10 alone would put both calls in one process; max_concurrency 1 per process takes two, and a
    third call waits for a freed one (max 2: the function takes 2 calls at once)."""
    tenant.deploy("narrow", "python3.11", handler(), max_concurrency=1, scale={"max": 2, "target": 10})
    # each call outlasts a second process's cold start, even on a loaded machine (at 1.5 s the second call could
    # find the first process free again before the second was up, and take it)
    two = at_once(tenant.fn_url("narrow"), 2, "6")
    assert len({a["process"] for a in two}) == 2, two
    three = at_once(tenant.fn_url("narrow"), 3, "1")
    assert len({a["process"] for a in three}) <= 2, three


def test_a_function_without_scale_stays_one_process(tenant: Tenant) -> None:
    tenant.deploy("single", "python3.11", handler())
    answers = at_once(tenant.fn_url("single"), 4, "1")
    assert len({a["process"] for a in answers}) == 1, answers


def test_redeploy_of_a_scaled_function_under_load_fails_no_call(tenant: Tenant) -> None:
    tenant.deploy("rolling-wide", "python3.11", handler(1), scale={"max": 3, "target": 1, "idle_sec": 5})
    url = tenant.fn_url("rolling-wide")
    stop = threading.Event()
    seen: list[dict[str, Any]] = []
    failures: list[str] = []

    def hammer() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                try:
                    resp = session.get(url, params={"sleep": "0.05"}, timeout=30)
                except requests.RequestException as exc:
                    failures.append(repr(exc))
                    continue
                if resp.status_code != 200:
                    failures.append(f"{resp.status_code} {resp.text[:200]}")
                else:
                    seen.append(resp.json())

    workers = [threading.Thread(target=hammer) for _ in range(6)]
    for w in workers:
        w.start()
    try:
        until("version 1 in several processes", lambda: len({a["process"] for a in seen}) >= 3, 60, 0.05)
        for n in (2, 3):
            tenant.upload("rolling-wide", handler(n))
            until(f"version {n} serving", lambda: bool(seen) and seen[-1]["version"] == n, 120, 0.05)  # noqa: B023
            until(f"version {n} in several processes", lambda: processes_of(seen, n) >= 2, 60, 0.05)  # noqa: B023
        holds("no call failed through the redeploys and after them", lambda: failures == [], for_sec=0.5,
              why="6 callers call back to back (a call takes ~50 ms), so a call hurt by the last switch (an old "
              "process going away) fails within the next few dozen calls; 0.5 s is many times that")
    finally:
        stop.set()
        for w in workers:
            w.join(60)
    assert failures == [], failures[:5]
    assert seen[-1]["version"] == 3
    assert len({a["process"] for a in seen if a["version"] == 1}) <= 3
