"""A function's life on real pods, driven through the API: jobs, cron, http on/off, a failed build, streams.

The operator and the API run as host processes (as in test_realnode_operator) against the real
node: the build Job, the runner Jobs, the CronJob's Jobs and the Deployment's pods really run,
so results come from the runner's termination message, the cron firing from the CronJob
controller, scale-to-zero from the kubelet removing pods, and the build error from kaniko's log.
One python function is built once for the module; the failed build is a function of its own.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests

from sless_operator import manifests
from tests.support.kube_operator import Operator, strip_finalizers
from tests.support.platform import Tenant, invocation_record
from tests.support.poll import holds
from tests.support.realnode import RealNode
from tests.support.realnode_operator import api_server, apply_crds, build_logs, build_namespace, operator_env, s3_server
from tests.support.streams import exchange, open_stream, read_until, ws_url

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1800)]

HANDLER = ('def handle(event):\n'
           '    if "say" in event:\n'
           '        print("said", event["say"])\n'
           '    if event.get("type") == "cron":\n'
           '        print("fired by", event["trigger"])\n'
           '    return {"hello": event.get("name", "world"), "type": event.get("type")}\n')  # fmt: skip


@dataclass
class Deployed:
    """The module's tenant with the python function ``hello`` built, Ready, behind http trigger ``web``."""

    real_node: RealNode
    tenant: Tenant
    op: Operator
    build_ns: str


@pytest.fixture(scope="module")
def deployed(real_node: RealNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    work = tmp_path_factory.mktemp("functions")
    bed = real_node.bed
    apply_crds(real_node)
    with s3_server(real_node, work) as s3, api_server(real_node, s3, work) as url:
        tenant = Tenant(url, f"realnode-{secrets.token_hex(4)}")
        tenant.api("POST", "/ensure", expect=(200, 201))
        build_ns = build_namespace(real_node)
        op = Operator(bed, tenant.ns, build_ns, work, extra_env=operator_env(real_node, s3)).start()
        try:
            start = time.monotonic()
            try:
                tenant.api("POST", "/functions", json={"name": "hello", "runtime": "python3.11"}, expect=201)
                tenant.upload("hello", {"handler.py": HANDLER})
                tenant.api("POST", "/triggers", json={"name": "web", "type": "http", "function": "hello"}, expect=201)
                tenant.wait_phase("hello", ("Ready",), 600)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{build_logs(real_node, build_ns)}\n{op.log_tail()}") from None
            print(f"hello Ready through the API in {time.monotonic() - start:.1f}s")
            yield Deployed(real_node, tenant, op, build_ns)
        finally:
            op.stop()
            strip_finalizers(bed, tenant.ns)
            bed.kubectl("delete", "namespace", tenant.ns, build_ns, "--wait=false", check=False)


def _invoke(d: Deployed, last: list[str]) -> requests.Response | None:
    try:
        resp = requests.post(d.tenant.fn_url("hello"), json={"name": "web"}, timeout=30)
    except requests.RequestException as exc:
        last[:] = [repr(exc)]
        return None
    last[:] = [f"{resp.status_code} {resp.text[:300]}"]
    return resp


def _function_pods(d: Deployed, function: str = "hello") -> list[dict[str, Any]]:
    selector = f"sless.dev/function={function},sless.dev/component={manifests.COMPONENT_FUNCTION}"
    return list((d.real_node.bed.get("pods", "-n", d.tenant.ns, "-l", selector) or {}).get("items", []))


def test_a_function_job_runs_in_a_pod_and_its_result_comes_back_through_the_api(deployed: Deployed) -> None:
    d = deployed
    start = time.monotonic()
    d.tenant.api("POST", "/jobs", json={"name": "once", "function": "hello", "run_id": 1,
                                        "event": {"name": "a job", "say": "by a job"}}, expect=201)  # fmt: skip
    record = d.tenant.wait_job("once", wait=300)
    print(f"FunctionJob run: created -> Succeeded in {time.monotonic() - start:.1f}s")
    assert record["phase"] == "Succeeded", f"{record}\n{d.op.log_tail()}"
    assert json.loads(record["message"]) == {"hello": "a job", "type": None}
    pods = d.real_node.bed.get("pods", "-n", d.tenant.ns, "-l", "sless.dev/job=once")["items"]
    assert [p["status"]["phase"] for p in pods] == ["Succeeded"]
    assert pods[0]["spec"]["nodeName"] == d.real_node.bed.info["real_node"]["node"]
    # the run is an invocation record with what it printed, kept after its pod (and the pod's log) is gone
    run = invocation_record(d.tenant, "hello", "once-run-1")
    assert (run["trigger"], run["path"], run["status"]) == ("job", "/jobs/once", 200), run
    assert _run_lines(d, run) == [("log", "said by a job")]
    d.real_node.bed.kubectl("delete", "pod", "-n", d.tenant.ns, pods[0]["metadata"]["name"], "--wait=true",
                            "--timeout=120s", timeout=150)  # fmt: skip
    assert _run_lines(d, run) == [("log", "said by a job")]


def _run_lines(d: Deployed, record: dict[str, Any]) -> list[tuple[str, str]]:
    resp = d.tenant.api("GET", f"/functions/hello/invocations/{record['id']}/logs", expect=200)
    return [(line["stream"], line["text"]) for line in resp.json()["lines"]]


def test_a_cron_trigger_fires_and_the_firing_is_recorded(deployed: Deployed) -> None:
    d = deployed
    bed = d.real_node.bed
    d.tenant.api("POST", "/triggers", json={"name": "minutely", "type": "cron", "function": "hello",
                                            "schedule": "* * * * *"}, expect=201)  # fmt: skip
    try:

        def fired() -> dict[str, Any] | None:
            trigger = d.tenant.api("GET", "/triggers/minutely", expect=200).json()
            return dict(trigger) if trigger.get("last_fired_at") else None

        trigger = bed.wait("the cron trigger fired (within its minute)", fired, timeout=150, interval=1)

        def last_run() -> dict[str, Any] | None:
            status = (bed.get("triggers.sless.dev", "minutely", "-n", d.tenant.ns) or {}).get("status", {})
            cond = next((c for c in status.get("conditions", []) if c["type"] == "LastRun"), {})
            return cond if cond.get("status") in ("True", "False") else None

        cond = bed.wait("the firing's outcome recorded", last_run, timeout=180, interval=1)
        assert cond["status"] == "True", f"{cond}\n{d.op.log_tail()}"
        job, result = cond["message"].split(": ", 1)
        assert json.loads(result) == {"hello": "world", "type": "cron"}
        run = bed.get("job", job, "-n", d.tenant.ns)
        assert run is not None and run["metadata"]["ownerReferences"][0]["kind"] == "CronJob"
        assert trigger["last_fired_at"]
        # the firing is an invocation record under its Job's name, with what it printed
        record = invocation_record(d.tenant, "hello", job)
        assert (record["trigger"], record["path"], record["status"]) == ("cron", "/triggers/minutely", 200), record
        assert _run_lines(d, record) == [("log", "fired by minutely")]
    finally:
        d.tenant.api("DELETE", "/triggers/minutely", expect=(200, 202, 204))


def test_a_disabled_http_trigger_scales_the_function_to_zero_and_enabled_it_serves_again(
    deployed: Deployed,
) -> None:
    d = deployed
    bed = d.real_node.bed
    last: list[str] = []
    assert bed.wait("/fn answers", lambda: (r := _invoke(d, last)) is not None and r.status_code == 200 and r,
                    timeout=120).json() == {"hello": "web", "type": None}, last  # fmt: skip

    d.tenant.api("PATCH", "/triggers/web", json={"enabled": False}, expect=200)
    start = time.monotonic()
    bed.wait("no function pod left", lambda: not _function_pods(d), timeout=120)
    print(f"disabled -> no pod in {time.monotonic() - start:.1f}s")
    assert bed.get("deployment", "hello", "-n", d.tenant.ns)["spec"]["replicas"] == 0
    resp = _invoke(d, last)
    assert resp is not None and resp.status_code == 404, last

    d.tenant.api("PATCH", "/triggers/web", json={"enabled": True}, expect=200)
    start = time.monotonic()
    served = bed.wait("/fn answers again", lambda: (r := _invoke(d, last)) is not None and r.status_code == 200
                      and r, timeout=180, interval=0.5)  # fmt: skip
    print(f"enabled -> first 200 in {time.monotonic() - start:.1f}s")
    assert served.json() == {"hello": "web", "type": None}
    assert [p["status"]["phase"] for p in _function_pods(d)] == ["Running"]


def test_a_failed_build_shows_the_kaniko_log_tail_in_the_function(deployed: Deployed) -> None:
    """A requirements.txt pip cannot parse fails kaniko's RUN step; GET /functions says why."""
    d = deployed
    d.tenant.api("POST", "/functions", json={"name": "broken", "runtime": "python3.11"}, expect=201)
    d.tenant.upload("broken", {"handler.py": HANDLER, "requirements.txt": "requests ==!= 2 [not a version\n"})
    start = time.monotonic()
    record = d.tenant.wait_phase("broken", ("Failed",), 600)
    print(f"failed build reported in {time.monotonic() - start:.1f}s")
    message = record["message"]
    assert "requirements.txt" in message or "Invalid requirement" in message, message
    assert "pip install" in message or "error" in message.lower(), message
    jobs = d.real_node.bed.get("jobs", "-n", d.build_ns, "-l", "sless.dev/function=broken")["items"]
    assert jobs and all(any(c["type"] == "Failed" for c in j["status"].get("conditions", [])) for j in jobs)
    assert d.tenant.api("GET", "/functions/hello", expect=200).json()["phase"] == "Ready"  # others unharmed


# Held at a gate that a second call opens: the pod runs one process, so a chunk read before `/open` left while
# the handler was still running.
STREAMER = """import threading

gate = threading.Event()


def handle(event):
    if event["_path"] == "/ping":
        return "pong"
    if event["_path"] == "/open":
        gate.set()
        return {"opened": True}

    def events():
        yield "data: one\\n\\n"
        gate.wait(60)
        yield "data: two\\n\\n"

    return {"statusCode": 200, "headers": {"Content-Type": "text/event-stream"}, "body": events()}


def websocket(ws, event):
    for message in ws:
        ws.send(message.upper() if isinstance(message, str) else message)
"""


def test_a_stream_and_a_websocket_pass_through_fn_to_a_pod(deployed: Deployed) -> None:
    """Streaming and WebSocket on Kubernetes: the API's `/fn` relays them to the function's Service."""
    d = deployed
    d.tenant.deploy("streamer", "python3.11", {"handler.py": STREAMER}, wait=300)
    last: list[str] = []

    def pong() -> bool:
        try:
            resp = requests.get(d.tenant.fn_url("streamer", "/ping"), timeout=30)
        except requests.RequestException as exc:
            last[:] = [repr(exc)]
            return False
        last[:] = [f"{resp.status_code} {resp.text[:300]}"]
        return resp.status_code == 200 and resp.text == "pong"

    d.real_node.bed.wait("/fn reaches the streamer", pong, timeout=120, interval=0.5)

    conn, resp = open_stream(d.tenant.fn_url("streamer", "/sse"))
    try:
        assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
        assert resp.getheader("Transfer-Encoding") == "chunked"
        assert read_until(resp, b"\n\n") == b"data: one\n\n"  # the handler is held at its gate meanwhile
        assert requests.get(d.tenant.fn_url("streamer", "/open"), timeout=30).json() == {"opened": True}
        assert resp.read() == b"data: two\n\n"
    finally:
        conn.close()

    answers, code = exchange(ws_url(d.tenant, "streamer"), ["hello", b"\x00\x01"])
    assert answers == ["HELLO", b"\x00\x01"] and code == 1000, (answers, code)


ROLLING = 'def handle(event):\n    return {"version": %d}\n'


def test_code_changes_roll_out_without_a_failed_call(deployed: Deployed) -> None:
    """Zero downtime: while calls keep coming through `/fn`, three code-only changes roll out, and every call is
    answered 200 by the old code or the new (an old pod still takes connections while it leaves the Service)."""
    d = deployed
    bed = d.real_node.bed
    d.tenant.deploy("rolling", "python3.11", {"handler.py": ROLLING % 1}, wait=300)
    url = d.tenant.fn_url("rolling")
    answers: list[tuple[int, str]] = []
    stop = threading.Event()

    def call_until_stopped() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                try:
                    resp = session.get(url, timeout=30)
                    answers.append((resp.status_code, resp.text[:200]))
                except requests.RequestException as exc:
                    answers.append((0, repr(exc)))
                time.sleep(0.01)

    def version_of(text: str) -> int | None:
        try:
            return int(json.loads(text)["version"])
        except (ValueError, KeyError, TypeError):
            return None

    bed.wait("/fn serves version 1", lambda: version_of(requests.get(url, timeout=30).text) == 1,
             timeout=120, interval=0.5)  # fmt: skip
    callers = [threading.Thread(target=call_until_stopped, daemon=True) for _ in range(2)]
    for caller in callers:
        caller.start()
    try:
        for version in (2, 3, 4):
            d.tenant.upload("rolling", {"handler.py": ROLLING % version})
            bed.wait(f"version {version} served",
                     lambda: any(version_of(text) == version for _, text in answers[-20:]),  # noqa: B023
                     timeout=180, interval=0.2)  # fmt: skip

            def one_pod_left() -> bool:
                pods = _function_pods(d, "rolling")
                return len(pods) == 1 and not pods[0]["metadata"].get("deletionTimestamp")

            bed.wait("the old pod gone", one_pod_left, timeout=120, interval=0.5)
        holds("no call failed through the rollouts and after them",
              lambda: all(code == 200 for code, _ in list(answers)), for_sec=2,
              why="the old pod is gone; a call hurt by it (a stale endpoint, a reused connection it closed) fails "
              "within the next calls (each caller calls every few ms) or once kube-proxy applies the endpoint "
              "change, about a second; 2 s covers that")
    finally:
        stop.set()
        for caller in callers:
            caller.join(timeout=60)
    failed = [answer for answer in answers if answer[0] != 200]
    print(f"{len(answers)} calls during three rollouts, {len(failed)} failed")
    assert len(answers) > 100 and not failed, failed[:10]


def test_a_calls_output_outlives_its_pod(deployed: Deployed) -> None:
    """What a call printed is kept with its record (the runtime's X-Sless-Output), so `.../invocations/{id}/logs`
    shows it after the pod that served the call is deleted (its log gone with it), as after a scale to zero."""
    d = deployed
    bed = d.real_node.bed
    request_id = f"outlives-{secrets.token_hex(4)}"
    resp = requests.post(d.tenant.fn_url("hello"), json={"say": "kept"}, headers={"X-Request-Id": request_id},
                         timeout=60)
    assert resp.status_code == 200 and "x-sless-output" not in resp.headers, resp.text
    path = f"/functions/hello/invocations/{request_id}/logs"
    expected = [("stdout", "said kept")]

    def lines() -> list[tuple[str, str]] | None:
        resp = d.tenant.api("GET", path)
        if resp.status_code == 404:  # the record is written a moment after the answer
            return None
        got = [(line["stream"], line["text"]) for line in resp.json()["lines"]]
        return got or None

    assert bed.wait("the call's record with its output", lines, timeout=60, interval=0.2) == expected
    pods = [pod["metadata"]["name"] for pod in _function_pods(d)]
    assert pods
    bed.kubectl("delete", "pod", "-n", d.tenant.ns, *pods, "--wait=true", "--timeout=120s", timeout=150)

    def replaced() -> bool:
        names = [pod["metadata"]["name"] for pod in _function_pods(d)]
        return bool(names) and not set(names) & set(pods)

    bed.wait("the deleted pods replaced", replaced, timeout=180, interval=0.5)
    assert lines() == expected
    bed.wait("/fn serves hello again", lambda: (r := _invoke(d, [])) is not None and r.status_code == 200,
             timeout=180, interval=0.5)
