"""API -> custom resources -> the real operator -> status back through the API.

Everything is real except what kwok simulates: the build Job and the function's pods "run" on a
fake node (no container starts, so the image is never really built and the Service never
answers; a routable function therefore answers 502 here, as in test_api_kube_routes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from sless_core import crd
from sless_core.traffic import other_version_name
from tests.support.kube_api import HELLO, KubeApi, cr, invoke, seconds_until, status_is, upload_raw, wait_api, zip_hash
from tests.support.kube_operator import Operator, operator_for
from tests.support.platform import Tenant, invocation_record
from tests.support.poll import holds
from tests.support.testbed import Testbed

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


@pytest.fixture
def served(kube_api: KubeApi, tmp_path: Path) -> Iterator[tuple[Tenant, Operator]]:
    """A tenant whose namespace the API created, served by its own operator process."""
    bed: Testbed = kube_api.bed
    t = kube_api.tenant("op")
    t.api("POST", "/ensure", expect=201)
    with operator_for(bed, t.ns, tmp_path, kube_api.s3.env()) as op:
        yield t, op


def test_function_lifecycle_with_the_operator(kube_api: KubeApi, served: tuple[Tenant, Operator]) -> None:
    t, op = served
    bed = kube_api.bed
    t.api("POST", "/functions", json={"name": "hello", "runtime": "python3.11"}, expect=201)
    pending = wait_api(op, "operator saw the function", t, "/functions/hello",
                       lambda b: b["phase"] == "Pending" and b["message"] == "waiting for code")
    assert pending["image"] is None

    data, digest = zip_hash(HELLO)
    started = time.monotonic()
    assert upload_raw(t, "hello", data).status_code == 202
    ready = wait_api(op, "Ready after upload", t, "/functions/hello", lambda b: b["phase"] == "Ready")
    print(f"upload -> Ready through the operator: {time.monotonic() - started:.1f}s")
    # no requirements.txt: nothing to build, the runtime's image runs the code it fetches at start
    assert ready["code_hash"] == digest and ready["image"] == "runtimes.test.invalid/sless/python3.11:latest"
    assert ready["last_built_at"]  # when this code became ready to run (no image was built for it)
    assert (bed.get("jobs", "-n", op.build_namespace) or {}).get("items", []) == []
    assert bed.get("deployment", "hello", "-n", t.ns) is not None
    assert bed.get("service", "hello", "-n", t.ns) is not None

    t.api("POST", "/triggers", json={"name": "hello", "type": "http", "function": "hello"}, expect=201)
    seconds_until("route appears", status_is(t, "hello", 502))

    # new code: Building (not the old Ready) until the operator has built and rolled it out
    data2, digest2 = zip_hash({"handler.py": "def handle(event):\n    return 'v2'\n"})
    after = upload_raw(t, "hello", data2).json()
    assert (after["code_hash"], after["phase"]) == (digest2, "Building")
    assert invoke(t, "hello").status_code == 502  # the old version keeps serving meanwhile
    ready2 = wait_api(op, "Ready with new code", t, "/functions/hello",
                      lambda b: b["phase"] == "Ready" and b["code_hash"] == digest2)
    template = bed.get("deployment", "hello", "-n", t.ns)["spec"]["template"]
    assert template["metadata"]["labels"]["sless.dev/code-hash"] == digest2[:16]
    assert ready2["image"] == ready["image"]

    t.api("DELETE", "/functions/hello", expect=204)
    op.wait("function and children gone", lambda: cr(bed, crd.FUNCTION_PLURAL, t.ns, "hello") is None
            and bed.get("deployment", "hello", "-n", t.ns) is None, timeout=60)
    seconds_until("route gone", status_is(t, "hello", 404))
    assert cr(bed, crd.TRIGGER_PLURAL, t.ns, "hello") is None


def test_jobs_run_and_rerun_with_the_operator(kube_api: KubeApi, served: tuple[Tenant, Operator]) -> None:
    t, op = served
    t.api("POST", "/functions", json={"name": "worker", "runtime": "python3.11"}, expect=201)
    upload_raw(t, "worker", zip_hash(HELLO)[0])
    wait_api(op, "worker Ready", t, "/functions/worker", lambda b: b["phase"] == "Ready")

    t.api("POST", "/jobs", json={"name": "once", "function": "worker", "event": {"n": 1}}, expect=201)
    done = wait_api(op, "job finished", t, "/jobs/once", lambda b: b["phase"] in ("Succeeded", "Failed"))
    assert done["phase"] == "Succeeded", done
    assert done["started_at"] and done["completed_at"]
    dup = t.api("POST", "/jobs", json={"name": "once", "function": "worker"}, expect=409).json()
    assert dup["existing"]["phase"] == "Succeeded"

    rerun = t.api("PATCH", "/jobs/once", json={"run_id": 2}, expect=200).json()
    assert (rerun["run_id"], rerun["phase"]) == (2, "Pending")
    again = wait_api(op, "second run finished", t, "/jobs/once",
                     lambda b: b["run_id"] == 2 and b["phase"] in ("Succeeded", "Failed"))
    assert again["phase"] == "Succeeded", again

    recorded = t.api("POST", "/jobs", json={"name": "later", "function": "worker", "run_id": 0}, expect=201).json()
    assert recorded["phase"] == "Recorded"
    holds("a run_id 0 Job stays Recorded",
          lambda: t.api("GET", "/jobs/later", expect=200).json()["phase"] == "Recorded", for_sec=2,
          why="the operator sees a new Job from its watch and starts a run in its first reconcile (the "
          "runs above went Pending and ran within a second or so); run_id 0 must not, and 2 s covers that reconcile")


def test_a_jobs_run_with_what_its_pod_printed_is_an_invocation_record(
    kube_api: KubeApi, served: tuple[Tenant, Operator], pod_outcome: Callable[..., str],
) -> None:
    """The operator reads a finished run's pod log into the FunctionJob's status; the API stores it as the run's
    record (trigger ``job``, the function's version), and its lines are still there once the pod is gone."""
    t, op = served
    bed = kube_api.bed
    t.api("POST", "/functions", json={"name": "printer", "runtime": "python3.11"}, expect=201)
    upload_raw(t, "printer", zip_hash(HELLO)[0])
    wait_api(op, "printer Ready", t, "/functions/printer", lambda b: b["phase"] == "Ready")
    labels = {crd.LABEL_JOB: "report", crd.LABEL_RUN: "1"}
    pod_outcome(labels=labels, namespace=t.ns, succeed=True, message='{"ok": true}', delay_ms=4000)
    t.api("POST", "/jobs", json={"name": "report", "function": "printer", "event": {"n": 1}}, expect=201)

    def running_pod() -> str | None:
        pods = bed.get("pods", "-n", t.ns, "-l", f"{crd.LABEL_JOB}=report") or {}
        running = [p for p in pods.get("items", []) if p["status"].get("phase") == "Running"]
        return str(running[0]["metadata"]["name"]) if running else None

    pod = op.wait("the run's pod Running", running_pod)
    bed.set_pod_logs(t.ns, pod, ["first line", "second\tline ünï"])  # kwok serves it as the pod's log
    done = wait_api(op, "job finished", t, "/jobs/report", lambda b: b["phase"] in ("Succeeded", "Failed"))
    assert done["phase"] == "Succeeded", done

    record = invocation_record(t, "printer", "report-run-1")
    assert (record["trigger"], record["method"], record["path"], record["status"]) == ("job", "RUN", "/jobs/report",
                                                                                       200)
    assert record["version"] == 1 and record["error"] is None  # the function's first version ran it
    path = f"/functions/printer/invocations/{record['id']}/logs"
    expected = [("log", "first line"), ("log", "second\tline ünï")]

    def lines() -> list[tuple[str, str]]:
        return [(line["stream"], line["text"]) for line in t.api("GET", path, expect=200).json()["lines"]]

    assert lines() == expected
    bed.kubectl("delete", "pod", "-n", t.ns, pod, "--wait=true", "--timeout=60s", timeout=90)
    assert lines() == expected  # kept with the record: the pod and its log are gone
    holds("the run is recorded once", lambda: [i["request_id"] for i in t.api(
        "GET", "/functions/printer/invocations?limit=100", expect=200).json()["items"]] == ["report-run-1"],
          for_sec=2, why="the operator writes the FunctionJob's status again as the Job goes; each write is a "
          "watch event in the API, and 2 s covers those that follow a run's end")


def test_versions_and_rollback_with_the_operator(kube_api: KubeApi, served: tuple[Tenant, Operator]) -> None:
    """Each Ready deploy is a version in the Function's status; a rollback writes an earlier one's code and
    configuration back and the operator rolls it out (fetched code: no build), as a new version."""
    t, op = served
    bed = kube_api.bed
    t.api("POST", "/functions", json={"name": "ver", "runtime": "python3.11", "env_vars": {"A": "1"}}, expect=201)
    data1, digest1 = zip_hash(HELLO)
    upload_raw(t, "ver", data1)
    wait_api(op, "v1 Ready", t, "/functions/ver", lambda b: b["phase"] == "Ready" and b["code_hash"] == digest1)
    data2, digest2 = zip_hash({"handler.py": "def handle(event):\n    return 'v2'\n"})
    upload_raw(t, "ver", data2)
    wait_api(op, "v2 Ready", t, "/functions/ver", lambda b: b["phase"] == "Ready" and b["code_hash"] == digest2)
    listed = wait_api(op, "two versions", t, "/functions/ver/versions", lambda b: len(b["items"]) == 2)
    assert [(v["version"], v["code_hash"], v["current"]) for v in listed["items"]] == [
        (2, digest2, True), (1, digest1, False)]
    assert listed["items"][1]["env_vars"] == {"A": "1"}

    started = t.api("POST", "/functions/ver/rollback", json={"version": 1}, expect=202).json()
    assert started["code_hash"] == digest1 and "version 1" in started["message"]
    wait_api(op, "v1 Ready again", t, "/functions/ver", lambda b: b["phase"] == "Ready" and b["code_hash"] == digest1)
    template = bed.get("deployment", "ver", "-n", t.ns)["spec"]["template"]
    assert template["metadata"]["labels"]["sless.dev/code-hash"] == digest1[:16]
    assert (bed.get("jobs", "-n", op.build_namespace) or {}).get("items", []) == []
    after = wait_api(op, "three versions", t, "/functions/ver/versions", lambda b: len(b["items"]) == 3)
    assert [(v["version"], v["code_hash"]) for v in after["items"]] == [(3, digest1), (2, digest2), (1, digest1)]

    # refused: the current one, one never deployed, a malformed body; nothing changes
    assert "is the one deployed" in t.api("POST", "/functions/ver/rollback", json={"version": 3},
                                          expect=409).json()["error"]  # fmt: skip
    t.api("POST", "/functions/ver/rollback", json={"version": 99}, expect=404)
    t.api("POST", "/functions/ver/rollback", json={"version": "x"}, expect=400)
    # default: the previous version (2); its archive gone from the store: refused with the reason
    spec = cr(bed, crd.FUNCTION_PLURAL, t.ns, "ver")["status"]["versions"][1]["spec"]  # type: ignore[index]
    kube_api.store().delete_prefix(spec["codeKey"])
    gone = t.api("POST", "/functions/ver/rollback", expect=404).json()
    assert "no longer stored" in gone["error"]
    assert cr(bed, crd.FUNCTION_PLURAL, t.ns, "ver")["spec"]["codeHash"] == digest1  # type: ignore[index]


def test_traffic_split_with_the_operator(kube_api: KubeApi, served: tuple[Tenant, Operator]) -> None:
    """A split runs its other version as a second Deployment + Service (code hash pinned, no build), the router
    shares calls by weight once it is ready (each record names its version), and dropping it removes both."""
    t, op = served
    bed = kube_api.bed
    t.api("POST", "/functions", json={"name": "canary", "runtime": "python3.11"}, expect=201)
    data1, digest1 = zip_hash(HELLO)
    upload_raw(t, "canary", data1)
    wait_api(op, "v1 Ready", t, "/functions/canary", lambda b: b["phase"] == "Ready" and b["code_hash"] == digest1)
    data2, digest2 = zip_hash({"handler.py": "def handle(event):\n    return 'v2'\n"})
    upload_raw(t, "canary", data2)
    wait_api(op, "v2 Ready", t, "/functions/canary", lambda b: b["phase"] == "Ready" and b["code_hash"] == digest2)
    wait_api(op, "two versions", t, "/functions/canary/versions", lambda b: len(b["items"]) == 2)
    t.api("POST", "/triggers", json={"name": "canary", "type": "http", "function": "canary"}, expect=201)

    traffic = "/functions/canary/traffic"
    assert "current version 2" in t.api("PUT", traffic, json={"split": [{"version": 1, "weight": 100}]},
                                        expect=409).json()["error"]  # fmt: skip
    t.api("PUT", traffic, json={"split": [{"version": 2, "weight": 50}, {"version": 9, "weight": 50}]}, expect=404)
    t.api("PUT", traffic, json={"split": [{"version": 2, "weight": 50}, {"version": 1, "weight": 40}]}, expect=400)
    half = [{"version": 2, "weight": 50}, {"version": 1, "weight": 50}]
    assert t.api("PUT", traffic, json={"split": half}, expect=200).json() == {"split": half}
    assert t.api("GET", traffic, expect=200).json() == {"split": half}
    assert cr(bed, crd.FUNCTION_PLURAL, t.ns, "canary")["spec"]["traffic"] == half  # type: ignore[index]

    def split_status() -> object:
        return (cr(bed, crd.FUNCTION_PLURAL, t.ns, "canary") or {}).get("status", {}).get("split")

    op.wait("the other version ready", lambda: split_status() == {"version": 1, "ready": True}, 120)
    other_name = other_version_name("canary")
    other = bed.get("deployment", other_name, "-n", t.ns)
    labels = other["spec"]["template"]["metadata"]["labels"]
    assert labels["sless.dev/code-hash"] == digest1[:16] and labels["sless.dev/function"] == other_name
    assert other["metadata"]["labels"]["sless.dev/split-of"] == "canary"
    assert other["metadata"]["ownerReferences"][0]["name"] == "canary"
    own = bed.get("deployment", "canary", "-n", t.ns)["spec"]["template"]["metadata"]["labels"]
    assert own["sless.dev/code-hash"] == digest2[:16]
    service = bed.get("service", other_name, "-n", t.ns)
    assert service["spec"]["selector"] == {"sless.dev/function": other_name, "sless.dev/component": "function"}
    assert bed.get("service", "canary", "-n", t.ns)["spec"]["selector"]["sless.dev/function"] == "canary"
    assert (bed.get("jobs", "-n", op.build_namespace) or {}).get("items", []) == []  # fetched code: no build

    # kwok's pods never answer: each call is a 502, recorded with the version the router sent it to
    def versions_of(tag: str, count: int) -> list[int | None]:
        ids = [f"{tag}-{i}" for i in range(count)]
        for rid in ids:
            assert requests.get(t.fn_url("canary"), headers={"X-Request-Id": rid}, timeout=30).status_code == 502
        return [invocation_record(t, "canary", rid)["version"] for rid in ids]

    seconds_until("calls reach both versions", lambda: set(versions_of(f"probe{time.monotonic_ns()}", 2)) == {1, 2}, 60)
    assert sorted(versions_of("even", 10)) == [1] * 5 + [2] * 5

    # dropped: the second Deployment and Service go, every call to the current version
    t.api("DELETE", traffic, expect=204)
    assert t.api("GET", traffic, expect=200).json() == {"split": None}
    op.wait("the other version removed", lambda: bed.get("deployment", other_name, "-n", t.ns) is None
            and bed.get("service", other_name, "-n", t.ns) is None and split_status() is None, 60)
    seconds_until("calls reach the current version only",
                  lambda: set(versions_of(f"after{time.monotonic_ns()}", 4)) == {2}, 30)

    # a deploy drops a split
    t.api("PUT", traffic, json={"split": half}, expect=200)
    t.api("PUT", "/functions/canary", json={"timeout_sec": 20}, expect=200)
    assert "traffic" not in cr(bed, crd.FUNCTION_PLURAL, t.ns, "canary")["spec"]  # type: ignore[index]
