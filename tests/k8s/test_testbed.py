"""The test bed itself: a real control plane whose workloads behave as the operator expects.

kwok plays the kubelet: pods get scheduled, become Ready, Job pods succeed, and, when a test
asks, fail. These tests pin those behaviours so an operator test failing later points at the
operator, not at the bed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.testbed import FAIL_LABEL, Testbed

pytestmark = pytest.mark.k8s

IMAGE = "registry.invalid/sless/nothing:1"  # never pulled: kwok runs no containers


def _condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for cond in (obj or {}).get("status", {}).get("conditions", []):
        if cond.get("type") == kind:
            return dict(cond)
    return None


def _job(name: str, labels: dict[str, str] | None = None, backoff_limit: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {
                "metadata": {"labels": {"app": name, **(labels or {})}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": IMAGE}]},
            },
        },
    }


def _job_finished(bed: Testbed, ns: str, name: str) -> tuple[str, dict[str, Any]] | None:
    job = bed.get("job", name, "-n", ns)
    for kind in ("Complete", "Failed"):
        cond = _condition(job, kind)
        if cond and cond.get("status") == "True":
            return kind, cond
    return None


def _job_pods(bed: Testbed, ns: str, name: str) -> list[dict[str, Any]]:
    return list(bed.get("pods", "-n", ns, "-l", f"job-name={name}")["items"])


def test_version_is_pinned_minor(k8s_testbed: Testbed) -> None:
    version = json.loads(k8s_testbed.kubectl("get", "--raw", "/version").stdout)
    assert version["gitVersion"].startswith("v1.34."), version
    assert (version["major"], version["minor"]) == ("1", "34")


def test_node_is_ready(k8s_testbed: Testbed) -> None:
    nodes = k8s_testbed.get("nodes")["items"]
    ready = [n["metadata"]["name"] for n in nodes if (_condition(n, "Ready") or {}).get("status") == "True"]
    assert ready, f"no Ready node among {[n['metadata']['name'] for n in nodes]}"


def test_deployment_of_two_becomes_available(k8s_testbed: Testbed) -> None:
    bed = k8s_testbed
    with bed.namespace("deploy") as ns:
        bed.kubectl("-n", ns, "create", "deployment", "web", f"--image={IMAGE}", "--replicas=2")

        def available() -> bool:
            dep = bed.get("deployment", "web", "-n", ns)
            cond = _condition(dep, "Available")
            return bool(cond and cond["status"] == "True" and dep["status"].get("readyReplicas") == 2)

        bed.wait("deployment web Available with 2 ready replicas", available, timeout=120)
        pods = bed.get("pods", "-n", ns, "-l", "app=web")["items"]
        assert len(pods) == 2
        assert all(p["status"]["phase"] == "Running" and p["status"].get("podIP") for p in pods)


def test_job_completes(k8s_testbed: Testbed) -> None:
    bed = k8s_testbed
    with bed.namespace("job-ok") as ns:
        bed.kubectl("-n", ns, "apply", "-f", "-", stdin=json.dumps(_job("ok")))
        kind, _ = bed.wait("job ok finished", lambda: _job_finished(bed, ns, "ok"), timeout=120)
        assert kind == "Complete"
        [pod] = _job_pods(bed, ns, "ok")
        assert pod["status"]["phase"] == "Succeeded"
        assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


def test_job_pod_with_kwok_fail_label_fails_the_job(k8s_testbed: Testbed) -> None:
    bed = k8s_testbed
    with bed.namespace("job-label") as ns:
        bed.kubectl("-n", ns, "apply", "-f", "-", stdin=json.dumps(_job("bad", labels={FAIL_LABEL: "true"})))
        kind, cond = bed.wait("job bad finished", lambda: _job_finished(bed, ns, "bad"), timeout=120)
        assert kind == "Failed", cond
        assert cond["reason"] == "BackoffLimitExceeded"
        [pod] = _job_pods(bed, ns, "bad")
        assert pod["status"]["phase"] == "Failed"
        assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1

        # the logs of a failed pod stay readable, as the operator needs for a failed build
        bed.set_pod_logs(ns, pod["metadata"]["name"], ["error: missing requirements.txt"])
        logs = lambda: bed.kubectl("-n", ns, "logs", "job/bad", check=False).stdout  # noqa: E731
        assert bed.wait("failed pod's logs", lambda: "missing requirements" in logs(), timeout=30)


def test_failing_stage_fails_unlabelled_job_pods_only_in_its_namespace(k8s_testbed: Testbed) -> None:
    bed = k8s_testbed
    with bed.namespace("job-fail") as ns, bed.namespace("job-other") as other:
        with bed.failing_job_pods(ns, exit_code=7, reason="BuildFailed", message="no such base image"):
            job = _job("build", backoff_limit=1)
            bed.kubectl("-n", ns, "apply", "-f", "-", stdin=json.dumps(job))
            bed.kubectl("-n", other, "apply", "-f", "-", stdin=json.dumps(job))
            kind, cond = bed.wait("job build finished", lambda: _job_finished(bed, ns, "build"), timeout=120)
            other_kind, _ = bed.wait("other job finished", lambda: _job_finished(bed, other, "build"), timeout=120)
        assert (kind, cond["reason"]) == ("Failed", "BackoffLimitExceeded")
        assert other_kind == "Complete"
        pods = _job_pods(bed, ns, "build")
        assert len(pods) == 2  # backoffLimit 1: one retry, as a real kubelet failure would cause
        for pod in pods:
            terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
            assert pod["status"]["phase"] == "Failed"
            assert (terminated["exitCode"], terminated["reason"], terminated["message"]) == (
                7, "BuildFailed", "no such base image")  # fmt: skip


def test_kubectl_logs_returns_default_then_chosen_text(k8s_testbed: Testbed) -> None:
    bed = k8s_testbed
    with bed.namespace("logs") as ns:
        bed.kubectl("-n", ns, "run", "p", f"--image={IMAGE}", "--restart=Never")
        bed.wait(
            "pod p Running",
            lambda: (bed.get("pod", "p", "-n", ns) or {}).get("status", {}).get("phase") == "Running",
        )
        default = bed.kubectl("-n", ns, "logs", "p")
        assert "kwok runs no containers" in default.stdout

        bed.set_pod_logs(ns, "p", ["step 1/2: fetch", "step 2/2: compile error: x.py:3"])

        def chosen() -> str | None:
            out = bed.kubectl("-n", ns, "logs", "p", check=False).stdout
            return out if "compile error" in out else None

        out = bed.wait("kubectl logs returns the chosen lines", chosen, timeout=30)
        assert out == "step 1/2: fetch\nstep 2/2: compile error: x.py:3\n"
