"""Asynchronous calls on `sless up`: 202 and a status URL, the result kept, retries then a dead letter, a restart
survived (SIGKILL), and other tenants kept out."""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.async_calls import ECHO, FAILING, FAST_RETRIES, wait_call
from tests.support.platform import SlessProcess, Tenant, running_sless, start_sless
from tests.support.poll import until

pytestmark = pytest.mark.e2e

SLOW = "import time\ndef handle(event):\n    time.sleep(1.5)\n    return {'n': event.get('n')}\n"


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlessProcess]:
    with running_sless(Path(tmp_path_factory.mktemp("async")), FAST_RETRIES) as sp:
        yield sp


@pytest.fixture(scope="module")
def owner(platform: SlessProcess) -> Tenant:
    tenant = Tenant(platform.url, "async-owner")
    tenant.deploy("echo", "python3.11", {"handler.py": ECHO})
    tenant.deploy("broken", "python3.11", {"handler.py": FAILING})
    return tenant


def submit(tenant: Tenant, function: str, body: dict[str, Any], header: tuple[str, str] = ("Prefer", "respond-async"),
           path: str = "") -> requests.Response:
    return requests.post(tenant.fn_url(function, path), json=body, headers=dict([header]), timeout=30)


def wait_records(tenant: Tenant, function: str, match: Callable[[dict[str, Any]], bool], count: int = 1) -> bool:
    """Whether COUNT invocation records matching MATCH show up (they are written a moment after the call)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        records = tenant.api("GET", f"/functions/{function}/invocations?limit=500", expect=200).json()["items"]
        if len([r for r in records if match(r)]) >= count:
            return True
        time.sleep(0.2)
    return False


def test_an_async_call_answers_202_and_keeps_its_result(owner: Tenant) -> None:
    accepted = submit(owner, "echo", {"x": 41}, path="/sub?q=1")
    assert accepted.status_code == 202, accepted.text
    body = accepted.json()
    assert accepted.headers["Location"] == body["status_url"] == f"/v1/namespaces/{owner.ns}/calls/{body['id']}"
    assert accepted.headers["Preference-Applied"] == "respond-async"
    assert body["request_id"] == accepted.headers["X-Request-Id"]
    call = wait_call(owner, body["id"])
    assert (call["state"], call["attempts"], call["error"]) == ("succeeded", 1, None)
    result = call["result"]
    assert result["status"] == 200 and not result["truncated"]
    assert json.loads(result["body"]) == {"got": 41, "path": "/sub", "rid": body["request_id"]}
    assert wait_records(owner, "echo", lambda r: r["trigger"] == "async" and r["request_id"] == body["request_id"])


def test_the_x_sless_async_header_works_too_and_plain_calls_stay_synchronous(owner: Tenant) -> None:
    accepted = submit(owner, "echo", {"x": 1}, header=("X-Sless-Async", "1"))
    assert accepted.status_code == 202 and "Preference-Applied" not in accepted.headers
    assert wait_call(owner, accepted.json()["id"])["state"] == "succeeded"
    plain = submit(owner, "echo", {"x": 2}, header=("Prefer", "return=minimal"))
    assert plain.status_code == 200 and plain.json()["got"] == 2


def test_failing_calls_are_retried_then_dead_lettered(owner: Tenant) -> None:
    accepted = submit(owner, "broken", {}).json()
    call_id = accepted["id"]
    call = wait_call(owner, call_id)
    assert (call["state"], call["attempts"]) == ("dead", 3)  # the first attempt and SLESS_ASYNC_MAX_RETRIES=2
    assert call["error"].startswith("after 3 attempt(s)") and call["result"]["status"] == 500
    dead = owner.api("GET", "/calls?state=dead&function=broken", expect=200).json()["items"]
    assert call_id in [c["id"] for c in dead]
    assert wait_records(owner, "broken", lambda r: r["trigger"] == "async" and r["status"] == 500, count=3)
    records = owner.api("GET", "/functions/broken/invocations", expect=200).json()["items"]
    tries = sorted(r["attempt"] for r in records if r["request_id"] == accepted["request_id"])
    assert tries == [1, 2, 3]  # each try's record says which it was


def test_calls_are_listed_newest_first_and_paged(owner: Tenant) -> None:
    ids = [submit(owner, "echo", {"x": n}).json()["id"] for n in range(3)]
    first = owner.api("GET", "/calls?function=echo&limit=2", expect=200).json()
    assert [c["id"] for c in first["items"]] == ids[::-1][:2] and first["next_cursor"] == ids[1]
    rest = owner.api("GET", f"/calls?function=echo&limit=2&cursor={first['next_cursor']}", expect=200).json()
    assert rest["items"][0]["id"] == ids[0]


def test_other_tenants_and_bad_ids_get_nothing(owner: Tenant, platform: SlessProcess) -> None:
    call_id = submit(owner, "echo", {"x": 5}).json()["id"]
    intruder = Tenant(platform.url, "async-intruder")
    assert requests.get(f"{platform.url}/v1/namespaces/{owner.ns}/calls/{call_id}", timeout=10,
                        headers={"Authorization": f"Bearer {intruder.token}"}).status_code == 403
    intruder.api("GET", f"/calls/{call_id}", expect=404)
    assert requests.get(f"{platform.url}/v1/namespaces/{owner.ns}/calls/{call_id}", timeout=10).status_code == 401
    for bad in ("nope", "0" * 31, "0" * 33, "G" * 32, "0" * 31 + "%00"):
        owner.api("GET", f"/calls/{bad}", expect=(400, 404))
    owner.api("GET", "/calls?state=lost", expect=400)
    owner.api("GET", "/calls?cursor=../../etc", expect=400)
    owner.api("GET", "/calls?function=Bad_Name", expect=400)
    owner.api("GET", "/calls?limit=0", expect=400)


def test_a_token_trigger_checks_the_token_before_storing_anything(owner: Tenant) -> None:
    owner.api("PATCH", "/triggers/echo", json={"auth": "token"}, expect=200)
    try:
        before = len(owner.api("GET", "/calls?limit=500", expect=200).json()["items"])
        refused = requests.post(owner.fn_url("echo"), json={}, headers={"Prefer": "respond-async"}, timeout=10)
        assert refused.status_code == 401
        assert len(owner.api("GET", "/calls?limit=500", expect=200).json()["items"]) == before
        allowed = requests.post(owner.fn_url("echo"), json={"x": 9}, timeout=10, headers={
            "Prefer": "respond-async", "Authorization": f"Bearer {owner.token}"})
        assert allowed.status_code == 202
        assert wait_call(owner, allowed.json()["id"])["state"] == "succeeded"
    finally:
        owner.api("PATCH", "/triggers/echo", json={"auth": "public"}, expect=200)


def test_an_oversized_async_body_is_refused(owner: Tenant, platform: SlessProcess) -> None:
    resp = requests.post(owner.fn_url("echo"), data=b"x" * (7 * 1024 * 1024), timeout=60,
                         headers={"Prefer": "respond-async", "Content-Type": "application/octet-stream"})
    assert resp.status_code == 413


def test_the_wait_in_the_async_queue_is_the_calls_queue_phase(tmp_path: Path) -> None:
    """One worker, three slow calls: the third waits for two others (~3 s) before it runs, and its record says so."""
    with running_sless(tmp_path / "queued", {**FAST_RETRIES, "SLESS_ASYNC_WORKERS": "1"}) as sp:
        tenant = Tenant(sp.url, "async-queue")
        tenant.deploy("slow", "python3.11", {"handler.py": SLOW})
        ids = [submit(tenant, "slow", {"n": n}, path=f"/{n}").json()["id"] for n in range(3)]
        assert [wait_call(tenant, i)["state"] for i in ids] == ["succeeded"] * 3
        assert wait_records(tenant, "slow", lambda r: r["trigger"] == "async", count=3)
        records = {r["path"]: r for r in tenant.api("GET", "/functions/slow/invocations", expect=200).json()["items"]}
    first, last = records["/0"]["phases_ms"], records["/2"]["phases_ms"]
    assert first["queue"] < 1000 and last["queue"] >= 2500, (first, last)
    assert last["handler"] >= 1400 and records["/2"]["duration_ms"] < last["queue"]  # the attempt alone


def test_queued_and_running_calls_survive_a_sigkill(tmp_path: Path) -> None:
    data = tmp_path / "crash"
    env = {**FAST_RETRIES, "SLESS_ASYNC_WORKERS": "1"}
    sp = start_sless(data, env)
    try:
        tenant = Tenant(sp.url, "async-crash")
        tenant.deploy("slow", "python3.11", {"handler.py": SLOW})
        ids = [submit(tenant, "slow", {"n": n}).json()["id"] for n in range(3)]
        # one is running (in its 1.5 s handler), the others wait for the only worker
        until("a call running", lambda: any(tenant.api("GET", f"/calls/{i}", expect=200).json()["state"] == "running"
                                            for i in ids), 30, 0.05)
        sp.stop(signal.SIGKILL)
    except BaseException:
        sp.stop(signal.SIGKILL)
        raise
    with running_sless(data, env) as again:
        tenant = Tenant(again.url, "async-crash")
        calls = [wait_call(tenant, call_id, timeout=90) for call_id in ids]
    assert [c["state"] for c in calls] == ["succeeded"] * 3, calls
    assert [json.loads(c["result"]["body"]) for c in calls] == [{"n": n} for n in range(3)]


def test_a_call_cut_by_a_stop_is_given_back_at_once(tmp_path: Path) -> None:
    """A graceful stop waits a while for running async calls, then cuts them and gives each back to the store:
    queued and due now (another replica takes it at once, not when its 960 s lease ends), its cut attempt not
    counted against its retries. Read from the store itself once the process has exited."""
    data = tmp_path / "stop"
    sp = start_sless(data, {**FAST_RETRIES, "SLESS_ASYNC_WORKERS": "1"})
    try:
        tenant = Tenant(sp.url, "async-stop")
        tenant.deploy("sleepy", "python3.11", {"handler.py": "import time\ndef handle(event):\n    time.sleep(120)\n"})
        call_id = submit(tenant, "sleepy", {}).json()["id"]
        until("the call running", lambda: tenant.api("GET", f"/calls/{call_id}", expect=200).json()["state"]
              == "running", 30, 0.05)
    finally:
        code = sp.stop(signal.SIGTERM, timeout=60)  # the runner's drain (10 s) then the cut, far below the sleep
    assert code in (0, -signal.SIGTERM), code
    with sqlite3.connect(data / "invocations.db") as db:
        row = db.execute("SELECT state, lease_owner, lease_until, attempts, next_attempt_at FROM async_calls "
                         "WHERE id = ?", (call_id,)).fetchone()
    state, lease_owner, lease_until, attempts, due = row
    assert (state, lease_owner, lease_until, attempts) == ("queued", "", 0, 0), row
    assert due <= time.time()
