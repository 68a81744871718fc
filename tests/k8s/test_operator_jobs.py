"""FunctionJobs against the test bed: run ids, re-runs, result and error capture.

kwok runs no containers, so what a run "printed" is set by a kwok Stage: the termination
message (as a real kubelet stores from /dev/termination-log, or the log's tail on failure), or
the pod log that kwok serves (``Testbed.set_pod_logs``) for the fallback to the log API.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.support.kube_operator import Sless

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def run_labels(job: str, run_id: int) -> dict[str, str]:
    return {"sless.dev/job": job, "sless.dev/run-id": str(run_id)}


def jobs_of(sless: Sless, name: str) -> list[str]:
    return sorted(j["metadata"]["name"] for j in sless.labelled("jobs", f"sless.dev/job={name}"))


@pytest.fixture
def built(sless: Sless) -> Sless:
    sless.function("calc")
    sless.wait_phase("Function", "calc", "Ready")
    return sless


def test_run_id_zero_records_then_runs_and_reruns(built: Sless, pod_outcome: Callable[..., str]) -> None:
    sless = built
    pod_outcome(labels=run_labels("sum", 1), namespace=sless.ns, succeed=True, message='{"sum": 3}')
    pod_outcome(labels=run_labels("sum", 2), namespace=sless.ns, succeed=True, message='{"sum": 30}')
    sless.apply("FunctionJob", "sum", {"function": "calc", "runId": 0, "event": {"a": 1, "b": 2}})
    body = sless.wait_phase("FunctionJob", "sum", "Recorded")
    assert body["status"]["runId"] == 0
    assert jobs_of(sless, "sum") == []

    sless.patch_spec("FunctionJob", "sum", runId=1)
    body = sless.wait_phase("FunctionJob", "sum", "Succeeded")
    assert (body["status"]["message"], body["status"]["runId"]) == ('{"sum": 3}', 1)
    assert body["status"]["completionTime"]
    assert jobs_of(sless, "sum") == ["sum-run-1"]
    job = sless.get("job", "sum-run-1")
    assert job is not None and job["metadata"]["ownerReferences"][0]["kind"] == "FunctionJob"
    pod = job["spec"]["template"]
    assert pod["metadata"]["labels"]["sless.dev/run-id"] == "1"
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["SLESS_EVENT"] == '{"a": 1, "b": 2}'

    sless.patch_spec("FunctionJob", "sum", runId=2, event={"a": 10, "b": 20})
    body = sless.op.wait("run 2 succeeded", lambda: (b := sless.get("FunctionJob", "sum")) and
                         b["status"].get("runId") == 2 and b["status"].get("phase") == "Succeeded" and b)  # fmt: skip
    assert body["status"]["message"] == '{"sum": 30}'
    sless.op.wait("run 1 deleted", lambda: jobs_of(sless, "sum") == ["sum-run-2"])


def test_failure_capture_keeps_the_end_of_a_long_traceback(built: Sless, pod_outcome: Callable[..., str]) -> None:
    sless = built
    frames = "".join(f'  File "handler.py", line {i}, in step{i}\n' for i in range(200))
    traceback = f"Traceback (most recent call last):\n{frames}ZeroDivisionError: division by zero"
    assert len(traceback) > 3000
    pod_outcome(labels=run_labels("div", 1), namespace=sless.ns, succeed=False, message=traceback)
    sless.apply("FunctionJob", "div", {"function": "calc", "runId": 1, "event": {}})
    body = sless.wait_phase("FunctionJob", "div", "Failed", timeout=120)
    message = body["status"]["message"]
    assert message.endswith("ZeroDivisionError: division by zero")
    assert len(message) <= 2000
    cond = next(c for c in body["status"]["conditions"] if c["type"] == "Complete")
    assert (cond["status"], cond["reason"]) == ("False", "BackoffLimitExceeded")
    pods = sless.labelled("pods", "sless.dev/job=div,sless.dev/run-id=1")
    assert len(pods) == 1  # SLESS_JOB_RETRIES=0 in these tests: one attempt


def test_result_falls_back_to_the_pod_log(built: Sless, pod_outcome: Callable[..., str]) -> None:
    sless = built
    # no termination message; the pod stays Running for a few seconds, long enough to set its log
    pod_outcome(labels=run_labels("logged", 1), namespace=sless.ns, succeed=True, message="", delay_ms=4000)
    sless.apply("FunctionJob", "logged", {"function": "calc", "runId": 1, "event": {}})

    def running_pod() -> str | None:
        pods = sless.labelled("pods", "sless.dev/job=logged,sless.dev/run-id=1")
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return str(running[0]["metadata"]["name"]) if running else None

    pod = sless.op.wait("run pod Running", running_pod)
    sless.bed.set_pod_logs(sless.ns, pod, ['{"answer": 42}'])
    body = sless.wait_phase("FunctionJob", "logged", "Succeeded", timeout=60)
    assert body["status"]["message"] == '{"answer": 42}'


def test_waits_for_its_function_to_be_built(sless: Sless) -> None:
    sless.apply("FunctionJob", "early", {"function": "later", "runId": 1, "event": {}})
    body = sless.wait_phase("FunctionJob", "early", "Pending")
    assert "waiting for function later" in body["status"]["message"]
    sless.function("later")
    sless.wait_phase("Function", "later", "Ready")
    result: dict[str, Any] = sless.wait_phase("FunctionJob", "early", "Succeeded", timeout=60)
    assert result["status"]["runId"] == 1
