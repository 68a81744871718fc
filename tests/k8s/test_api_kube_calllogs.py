"""One call's output on the Kubernetes backend: read from the function's pods' logs through the API server.

kwok runs no containers, so the pod log is what the test bed makes kwok serve (``Testbed.set_pod_logs``):
lines in the runtimes' format, as a function pod would have written them. The call itself answers 502 here
(no cluster DNS, see test_api_kube_routes.py) and is recorded with its request id like any other.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sless_core import crd
from tests.support.kube_api import (
    KubeApi,
    call,
    function_pod,
    logs_of,
    routable,
    start_api,
)
from tests.support.services import S3Endpoint
from tests.support.testbed import Testbed

pytestmark = pytest.mark.k8s


@pytest.fixture(scope="module")
def logs_api(k8s_testbed: Testbed, s3_endpoint: S3Endpoint,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApi]:
    api = start_api(k8s_testbed, s3_endpoint, tmp_path_factory.mktemp("kube-calllogs"))
    yield api
    clean = api.stop()
    api.gate.close()
    assert clean, f"the API did not stop cleanly ({api.proc.returncode}):\n{api.log_tail()}"


def test_a_calls_lines_are_read_from_its_functions_pods(logs_api: KubeApi) -> None:
    api = logs_api
    t = api.tenant()
    t.api("POST", "/ensure", expect=201)
    routable(api, t, "talk")
    function_pod(api.bed, t.ns, "talk", "talk-a", [
        "sless-runtime: listening", "@sless:kube-1 hello from a", "@sless:kube-2 another call",
        "@sless:- @sless:kube-1 forged outside a call", "@sless:kube-1 @sless:kube-2 forged inside"])
    function_pod(api.bed, t.ns, "talk", "talk-b", ["@sless:kube-1 hello from b"])
    function_pod(api.bed, t.ns, "other", "other-a", ["@sless:kube-1 another function's pod"])
    call(t, "talk", "kube-1")

    seen: list[Any] = []

    def texts() -> list[str]:
        got = logs_of(t, "talk", "kube-1")
        seen.append(got)
        assert got["truncated"] is False and all(line["stream"] == "log" for line in got["lines"])
        return sorted(line["text"] for line in got["lines"])

    deadline = time.monotonic() + 60
    while len(texts()) != 3:
        assert time.monotonic() < deadline, (seen[-1], api.bed.kubectl("-n", t.ns, "get", "pods").stdout,
                                             api.bed.kubectl("-n", t.ns, "logs", "talk-a", check=False))
        time.sleep(0.5)
    assert texts() == ["@sless:kube-2 forged inside", "hello from a", "hello from b"]
    record = next(i for i in t.api("GET", "/functions/talk/invocations", expect=200).json()["items"]
                  if i["request_id"] == "kube-1")
    # forwarded without a start (pods run while the trigger is enabled), no answer: no handler time
    assert record["cold"] is False and record["phases_ms"]["start"] == 0 and record["phases_ms"]["handler"] is None
    assert sorted(line["text"] for line in logs_of(t, "talk", str(record["id"]))["lines"]) == texts()
    other = api.tenant("other")
    other.api("POST", "/ensure", expect=201)
    other.api("POST", "/functions", json={"name": "talk", "runtime": "python3.11"}, expect=201)
    assert "hello" not in json.dumps(logs_of(other, "talk", "kube-1", expect=404))


def _no_pod_logs_kubeconfig(bed: Testbed, dest: Path) -> Path:
    """Credentials with what the API needs for functions and routes, and nothing of pods."""
    sa_ns = "sless-api-no-pod-logs"
    if bed.get("namespace", sa_ns) is None:
        bed.kubectl("create", "namespace", sa_ns)
    bed.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "api", "namespace": sa_ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": sa_ns},
         "rules": [{"apiGroups": [crd.GROUP], "resources": ["functions", "triggers", "functionjobs"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
                   {"apiGroups": [""], "resources": ["namespaces"],
                    "verbs": ["get", "list", "watch", "create", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": sa_ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": sa_ns},
         "subjects": [{"kind": "ServiceAccount", "name": "api", "namespace": sa_ns}]},
    )
    token = bed.kubectl("create", "token", "api", "-n", sa_ns, "--duration=1h").stdout.strip()
    config = yaml.safe_load(bed.kubeconfig.read_text())
    config["users"] = [{"name": "no-pod-logs", "user": {"token": token}}]
    for ctx in config["contexts"]:
        ctx["context"]["user"] = "no-pod-logs"
    dest.write_text(json.dumps(config))
    return dest


def test_a_cluster_that_refuses_pod_logs_gets_a_501_that_says_why(
        k8s_testbed: Testbed, s3_endpoint: S3Endpoint, tmp_path: Path) -> None:
    bed = k8s_testbed
    kubeconfig = _no_pod_logs_kubeconfig(bed, tmp_path / "no-pod-logs.kubeconfig")
    denied = bed.kubectl("--kubeconfig", str(kubeconfig), "get", "pods", "-A", check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()  # the premise of this test
    api = start_api(bed, s3_endpoint, tmp_path / "api", kubeconfig=kubeconfig)
    try:
        t = api.tenant()
        t.api("POST", "/ensure", expect=201)
        routable(api, t, "quiet")
        call(t, "quiet", "refused-1")
        body = logs_of(t, "quiet", "refused-1", expect=501)
        assert "pods/log" in body["error"] and "api.callLogs.enabled" in body["error"]
        assert "Traceback" not in json.dumps(body) and "Traceback" not in api.log_tail(400)
    finally:
        assert api.stop(), api.log_tail()
        api.gate.close()
