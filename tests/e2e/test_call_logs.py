"""One call's output and timing on `sless up`: GET .../invocations/{id}/logs, cold/warm and phases_ms."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.platform import Tenant, running_sless
from tests.support.platform import invocation_record as record

pytestmark = pytest.mark.e2e

CHATTY = """\
import sys, time

def handle(event):
    mark = event["_query"].get("m", "")
    print("out", mark)
    print("err", mark, file=sys.stderr)
    print(f"@sless:victim forged {mark}")
    time.sleep(float(event["_query"].get("s", "0")))
    if event["_query"].get("big"):
        for n in range(2000):
            print(f"{n:05d} " + "x" * 60)
    print("done", mark, end="")
    return {"mark": mark}
"""

CHATTY_NODE = """\
exports.handle = async (event) => {
  const mark = event._query.m || '';
  console.log('out', mark);
  await new Promise((resolve) => setTimeout(resolve, 300));
  console.error('err', mark);
  return { mark };
};
"""


def call(tenant: Tenant, name: str, request_id: str, **query: str) -> requests.Response:
    resp = requests.get(tenant.fn_url(name), params=query, headers={"X-Request-Id": request_id}, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp


def logs(tenant: Tenant, name: str, ident: int | str, expect: int = 200) -> Any:
    return tenant.api("GET", f"/functions/{name}/invocations/{ident}/logs", expect=expect).json()


def streams(got: dict[str, Any]) -> tuple[list[str], list[str]]:
    """stdout's and stderr's texts: each stream keeps its order (two pipes: not their order between them)."""
    lines = got["lines"]
    return ([line["text"] for line in lines if line["stream"] == "stdout"],
            [line["text"] for line in lines if line["stream"] == "stderr"])


@pytest.fixture
def chatty(tenant: Tenant) -> Tenant:
    tenant.deploy("chatty", "python3.11", {"handler.py": CHATTY})
    return tenant


def test_a_calls_lines_are_its_own(chatty: Tenant) -> None:
    call(chatty, "chatty", "call-a", m="A")
    call(chatty, "chatty", "call-b", m="B")
    got = logs(chatty, "chatty", record(chatty, "chatty", "call-a")["id"])
    assert got["truncated"] is False
    assert streams(got) == (["out A", "@sless:victim forged A", "done A"], ["err A"])
    assert all(abs(line["ts"] - time.time()) < 120 for line in got["lines"])
    other = logs(chatty, "chatty", record(chatty, "chatty", "call-b")["id"])
    assert streams(other) == (["out B", "@sless:victim forged B", "done B"], ["err B"])


def test_concurrent_calls_keep_their_lines_apart(chatty: Tenant) -> None:
    ids = [f"par-{n}" for n in range(6)]
    with ThreadPoolExecutor(len(ids)) as pool:
        list(pool.map(lambda i: call(chatty, "chatty", i, m=i, s="0.3"), ids))
    for ident in ids:
        got = logs(chatty, "chatty", record(chatty, "chatty", ident)["id"])
        assert streams(got) == ([f"out {ident}", f"@sless:victim forged {ident}", f"done {ident}"], [f"err {ident}"])


def test_a_calls_output_is_capped_and_says_so(chatty: Tenant) -> None:
    call(chatty, "chatty", "big-1", m="big", big="1")
    got = logs(chatty, "chatty", record(chatty, "chatty", "big-1")["id"])
    assert got["truncated"] is True
    kept = sum(len(line["text"].encode()) for line in got["lines"])
    assert 60 * 1024 < kept <= 64 * 1024
    assert got["lines"][0]["text"] == "out big" and got["lines"][-1]["text"].endswith("x" * 60)


def test_cold_then_warm_with_phases(tenant: Tenant) -> None:
    tenant.deploy("phased", "python3.11", {"handler.py": CHATTY})
    first = call(tenant, "phased", "phase-1", s="0.2")
    second = call(tenant, "phased", "phase-2", s="0.2")
    for resp in (first, second):
        assert "X-Sless-Handler-Ms" not in resp.headers  # the runtime's report to the platform only
    cold, warm = record(tenant, "phased", "phase-1"), record(tenant, "phased", "phase-2")
    assert cold["cold"] is True and warm["cold"] is False
    assert cold["phases_ms"]["start"] > 0 and warm["phases_ms"]["start"] == 0
    for rec in (cold, warm):
        phases = rec["phases_ms"]
        assert 200 <= phases["handler"] < rec["duration_ms"]
        assert 0 <= phases["queue"] < rec["duration_ms"]
        assert phases["queue"] + phases["start"] + phases["handler"] <= rec["duration_ms"] + 1


def test_a_node_function_through_the_platform(tenant: Tenant) -> None:
    tenant.deploy("noisy", "nodejs20", {"handler.js": CHATTY_NODE})
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda n: call(tenant, "noisy", f"node-{n}", m=str(n)), range(4)))
    for n in range(4):
        got = logs(tenant, "noisy", record(tenant, "noisy", f"node-{n}")["id"])
        assert streams(got) == ([f"out {n}"], [f"err {n}"])


def test_a_failed_calls_traceback_names_no_platform_folder(tenant: Tenant) -> None:
    """The call's log is its tenant's: the traceback says where in the code, not the data dir or install dir."""
    tenant.deploy("broken", "python3.11", {"handler.py": "def handle(event):\n    raise ValueError('nope')\n"})
    resp = requests.get(tenant.fn_url("broken"), headers={"X-Request-Id": "broken-1"}, timeout=60)
    assert resp.status_code == 500, resp.text
    lines = logs(tenant, "broken", record(tenant, "broken", "broken-1")["id"])["lines"]
    text = "\n".join(line["text"] for line in lines)
    assert 'File "./handler.py", line 2, in handle' in text, text
    assert 'File "/' not in text and "ValueError: nope" in text, text


def test_a_call_without_output_has_no_lines(chatty: Tenant) -> None:
    chatty.deploy("quiet", "python3.11", {"handler.py": "def handle(event):\n    return 1\n"})
    call(chatty, "quiet", "quiet-1")
    assert logs(chatty, "quiet", record(chatty, "quiet", "quiet-1")["id"]) == {"lines": [], "truncated": False}


def test_another_functions_or_tenants_id_is_not_found(chatty: Tenant, other_tenant: Tenant) -> None:
    call(chatty, "chatty", "mine-1", m="secret-output")
    ident = record(chatty, "chatty", "mine-1")["id"]
    chatty.deploy("sibling", "python3.11", {"handler.py": CHATTY})
    assert "secret-output" not in str(logs(chatty, "sibling", ident, expect=404))
    other_tenant.deploy("chatty", "python3.11", {"handler.py": CHATTY})
    assert "secret-output" not in str(logs(other_tenant, "chatty", ident, expect=404))
    resp = requests.get(f"{chatty.url}/v1/namespaces/{chatty.ns}/functions/chatty/invocations/{ident}/logs",
                        headers={"Authorization": f"Bearer {other_tenant.token}"}, timeout=10)
    assert resp.status_code == 403 and "secret-output" not in resp.text
    assert requests.get(f"{chatty.url}/v1/namespaces/{chatty.ns}/functions/chatty/invocations/{ident}/logs",
                        timeout=10).status_code == 401


@pytest.mark.parametrize("ident", ["-1", "_x", "x" * 129])
def test_a_malformed_id_is_refused(chatty: Tenant, ident: str) -> None:
    body = logs(chatty, "chatty", ident, expect=400)
    assert body["error"] and "Traceback" not in str(body)


def test_a_calls_request_id_finds_it_too(chatty: Tenant, other_tenant: Tenant) -> None:
    call(chatty, "chatty", "by-request-id", m="R")
    record(chatty, "chatty", "by-request-id")
    assert streams(logs(chatty, "chatty", "by-request-id")) == (["out R", "@sless:victim forged R", "done R"],
                                                                ["err R"])
    other_tenant.deploy("chatty", "python3.11", {"handler.py": CHATTY})
    assert "out R" not in str(logs(other_tenant, "chatty", "by-request-id", expect=404))


@pytest.mark.parametrize("ident", ["987654321", "abc", "0", "1.5", "99999999999999999999", "1e3"])
def test_unknown_ids_are_not_found(chatty: Tenant, ident: str) -> None:
    assert logs(chatty, "chatty", ident, expect=404)["error"]


def test_unknown_functions_are_not_found(chatty: Tenant) -> None:
    assert logs(chatty, "nope", 1, expect=404)["error"]
    assert chatty.api("GET", "/functions/Bad_Name/invocations/1/logs").status_code in (400, 404)


JOB = """\
import sys
def handle(event):
    print("job out", event.get("n"))
    print("job err", event.get("n"), file=sys.stderr)
    if event.get("fail"):
        raise ValueError("asked to fail")
    return {"n": event.get("n")}
"""


@pytest.mark.parametrize("fail", [False, True])
def test_a_jobs_printed_lines_are_kept_with_its_record(tenant: Tenant, fail: bool) -> None:
    """What a job run prints is kept under its invocation record, as a call's lines are (it was lost)."""
    name = f"printer-{int(fail)}"
    tenant.deploy(name, "python3.11", {"handler.py": JOB}, http=False)
    tenant.api("POST", "/jobs", json={"name": name, "function": name, "event": {"n": 7, "fail": fail}}, expect=201)
    assert tenant.wait_job(name)["phase"] == ("Failed" if fail else "Succeeded")
    job_runs = [r for r in record_list(tenant, name) if r["trigger"] == "job"]
    assert len(job_runs) == 1 and job_runs[0]["version"] == 1, job_runs  # it named no version
    body = logs(tenant, name, job_runs[0]["id"])
    texts = [(line["stream"], line["text"]) for line in body["lines"]]
    assert ("stdout", "job out 7") in texts and ("stderr", "job err 7") in texts, texts
    if fail:
        assert any(stream == "stderr" and "asked to fail" in text for stream, text in texts), texts


def record_list(tenant: Tenant, name: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 30
    while True:
        items = list(tenant.api("GET", f"/functions/{name}/invocations", expect=200).json()["items"])
        if items or time.monotonic() > deadline:
            return items
        time.sleep(0.1)


STREAMER = """\
def handle(event):
    print("before the head")

    def parts():
        yield "part one\\n"
        print("after the head")
        yield "part two\\n"
    return parts()
"""


def test_a_calls_and_a_jobs_lines_outlive_a_restart(tmp_path: Path) -> None:
    """The lines a call wrote before its answer (X-Sless-Output) and a job's are kept with their records: after
    `sless up` restarts, its memory holds nothing of them and they are still there. A stream's lines after its
    head are in the process's output only: shown while `sless up` runs, not after (the contract's bound)."""
    with running_sless(tmp_path / "data") as sp:
        tenant = Tenant(sp.url, "durable-logs")
        tenant.deploy("chatty", "python3.11", {"handler.py": CHATTY})
        tenant.deploy("streamer", "python3.11", {"handler.py": STREAMER})
        tenant.deploy("printer", "python3.11", {"handler.py": JOB}, http=False)
        call(tenant, "chatty", "durable-1", m="kept")
        assert requests.get(tenant.fn_url("streamer"), headers={"X-Request-Id": "durable-2"},
                            timeout=60).text == "part one\npart two\n"
        tenant.api("POST", "/jobs", json={"name": "once", "function": "printer", "event": {"n": 3}}, expect=201)
        assert tenant.wait_job("once")["phase"] == "Succeeded"
        before = {name: record_list(tenant, name) for name in ("chatty", "streamer", "printer")}
        assert all(before.values()), before
        assert streams(logs(tenant, "streamer", "durable-2"))[0] == ["before the head", "after the head"]
    with running_sless(tmp_path / "data") as sp:
        tenant = Tenant(sp.url, "durable-logs")
        got = logs(tenant, "chatty", before["chatty"][0]["id"])
        assert streams(got) == (["out kept", "@sless:victim forged kept", "done kept"], ["err kept"])
        assert all(abs(line["ts"] - time.time()) < 600 for line in got["lines"])
        assert logs(tenant, "chatty", "durable-1") == got  # by request id too
        assert streams(logs(tenant, "streamer", "durable-2"))[0] == ["before the head"]
        job = logs(tenant, "printer", before["printer"][0]["id"])
        assert [(x["stream"], x["text"]) for x in job["lines"]] == [("stdout", "job out 3"), ("stderr", "job err 3")]
