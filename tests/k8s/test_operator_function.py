"""Function reconciliation against a real apiserver, controller-manager and kwok node.

What is real: the apiserver (admission incl. Pod Security ``restricted``, CRD validation,
status subresource), the Job, Deployment and ReplicaSet controllers, garbage collection,
the scheduler, and pods going Running/Ready/Succeeded/Failed (kwok). What is not: containers
(kaniko never builds anything; a build "succeeds" or "fails" as the kwok stage says).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sless_core import crd
from sless_core.models import ENV_MAX_TOTAL_BYTES, ENV_MAX_VALUE, FunctionSpec
from sless_operator import manifests
from sless_operator.config import OperatorConfig
from sless_operator.manifests import FunctionRef, Owner

if TYPE_CHECKING:
    from tests.support.kube_operator import Sless

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

CODE_A = "a1" * 32
CODE_B = "b2" * 32
CODE_C = "c3" * 32


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), {})


def env_of(dep: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_function_without_code_waits_for_it(sless: Sless) -> None:
    sless.function("nocode", code_hash=None)
    body = sless.wait_phase("Function", "nocode", "Pending")
    status = body["status"]
    assert status["message"] == "waiting for code"
    assert condition(status, "Built")["reason"] == "NoCode"
    assert condition(status, "Ready")["status"] == "False"
    assert sless.build_jobs("nocode") == []
    assert sless.get("deployment", "nocode") is None


def test_build_then_ready_with_every_child_and_status(sless: Sless) -> None:
    sless.function("hello", envVars={"ZED": "z", "ALPHA": "a"}, memoryMb=256)
    body = sless.wait_phase("Function", "hello", "Ready")
    status = body["status"]
    image = f"registry.test.invalid/sless/{sless.ns}/hello:{CODE_A[:16]}"
    assert status["image"] == image and status["codeHash"] == CODE_A and status["message"] == ""
    for kind in ("Built", "Ready"):
        cond = condition(status, kind)
        assert cond["status"] == "True", cond
        assert cond["observedGeneration"] == body["metadata"]["generation"]
    assert status["lastBuiltAt"]
    assert body["metadata"]["finalizers"] == ["sless.dev/finalizer"]

    [build] = sless.build_jobs("hello")
    assert build["metadata"]["name"] == status["buildJob"]
    assert build["spec"]["activeDeadlineSeconds"] == OperatorConfig().build_deadline_sec
    pod = build["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    # kaniko builds into a tarball as an init step; the push step (no tenant code) is the pod's container
    [kaniko] = [c for c in pod["initContainers"] if c["name"] == "kaniko"]
    assert f"--destination={image}" in kaniko["args"] and "--no-push" in kaniko["args"]
    assert kaniko["resources"]["limits"]["memory"] == "2Gi"  # 2048Mi, as the apiserver normalises it
    assert [c["name"] for c in pod["containers"]] == ["push-image"]

    dep = sless.get("deployment", "hello")
    assert dep is not None
    assert dep["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == image
    names = [e["name"] for e in container["env"]]
    assert names == sorted(names) and {"ALPHA", "ZED", "SLESS_ENTRYPOINT", "PORT"} <= set(names)
    assert container["resources"]["limits"]["memory"] == "256Mi"
    assert container["readinessProbe"]["httpGet"]["path"] == "/_/health"
    svc = sless.get("service", "hello")
    assert svc is not None and svc["spec"]["ports"][0]["port"] == 8080
    assert svc["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    pods = sless.labelled("pods", "sless.dev/function=hello,sless.dev/component=function")
    assert len(pods) == 1 and pods[0]["status"]["phase"] == "Running"


def test_tenant_namespace_is_isolated_and_restricted(sless: Sless) -> None:
    sless.function("iso")
    sless.wait_phase("Function", "iso", "Ready")
    ns = sless.bed.get("namespace", sless.ns)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert sless.get("resourcequota", "sless-quota") is not None
    assert sless.get("limitrange", "sless-limits") is not None
    deny = sless.get("networkpolicy", "sless-default-deny")
    assert deny is not None and deny["spec"]["policyTypes"] == ["Ingress", "Egress"]
    allow = sless.get("networkpolicy", "sless-allow-platform")
    assert allow is not None and allow["spec"]["ingress"][0]["ports"][0]["port"] == 8080
    assert sless.get("networkpolicy", "sless-allow-dns") is not None
    # the apiserver enforces "restricted": a root pod is refused, so our function pod passing proves compliance
    root_pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root", "namespace": sless.ns},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
    refused = sless.bed.kubectl("apply", "-f", "-", stdin=json.dumps(root_pod), check=False)
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr


def test_env_and_memory_change_updates_the_deployment_without_rebuilding(sless: Sless) -> None:
    sless.function("upd", envVars={"A": "1"})
    sless.wait_phase("Function", "upd", "Ready")
    before = sless.get("deployment", "upd")
    assert before is not None
    sless.patch_spec("Function", "upd", envVars={"A": "2", "B": "3"}, memoryMb=512, timeoutSec=45)

    def updated() -> dict[str, Any] | None:
        dep = sless.get("deployment", "upd")
        return dep if dep and env_of(dep).get("A") == "2" else None

    dep = sless.op.wait("Deployment env updated", updated)
    assert env_of(dep)["B"] == "3" and env_of(dep)["SLESS_TIMEOUT_SEC"] == "45"
    assert dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] == "512Mi"
    body = sless.wait_phase("Function", "upd", "Ready")
    assert body["metadata"]["generation"] == 2 and condition(body["status"], "Ready")["observedGeneration"] == 2
    assert len(sless.build_jobs("upd")) == 1  # no rebuild
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == body["status"]["image"]


def test_unchanged_spec_causes_no_rollout(sless: Sless) -> None:
    sless.function("calm", envVars={"B": "2", "A": "1"})
    sless.wait_phase("Function", "calm", "Ready")
    generation = sless.get("deployment", "calm")["metadata"]["generation"]  # type: ignore[index]

    def handled() -> str:  # the digest of the last handled essence (spec, labels, annotations)
        meta = (sless.get("Function", "calm") or {}).get("metadata", {})
        return str(meta.get("annotations", {}).get("sless.dev/last-handled-configuration", ""))

    before = handled()
    assert len(before) < 100  # a digest, not a copy of the spec
    sless.bed.kubectl("-n", sless.ns, "annotate", "functions.sless.dev", "calm", "touched=1")  # a non-spec change
    sless.op.wait("annotation handled", lambda: handled() not in ("", before))
    assert sless.get("deployment", "calm")["metadata"]["generation"] == generation  # type: ignore[index]


def test_code_change_builds_a_fresh_image(sless: Sless) -> None:
    sless.function("code")
    first = sless.wait_phase("Function", "code", "Ready")["status"]["image"]
    sless.patch_spec("Function", "code", codeHash=CODE_B, contextKey=f"contexts/{sless.ns}/code/b.tar.gz")
    body = sless.wait_phase("Function", "code", "Ready")
    assert body["status"]["image"].endswith(f":{CODE_B[:16]}") and body["status"]["image"] != first
    assert body["status"]["codeHash"] == CODE_B
    assert len(sless.build_jobs("code")) == 2
    dep = sless.get("deployment", "code")
    assert dep is not None and dep["spec"]["template"]["spec"]["containers"][0]["image"] == body["status"]["image"]


def test_build_failure_reports_the_log_tail_then_new_code_recovers(
    sless: Sless, pod_outcome: Callable[..., str]
) -> None:
    log = "INFO step 3/5: RUN pip install -r requirements.txt\nERROR: No matching distribution found for nosuchpkg"
    pod_outcome(labels={"sless.dev/function": "broken", "sless.dev/code-hash": CODE_A[:16]},
                namespace=sless.op.build_namespace, succeed=False, message=log)  # fmt: skip
    sless.function("broken")
    body = sless.wait_phase("Function", "broken", "Failed", timeout=120)
    status = body["status"]
    assert "No matching distribution found for nosuchpkg" in status["message"], status
    assert "BackoffLimitExceeded" in status["message"]
    built = condition(status, "Built")
    assert (built["status"], built["reason"]) == ("False", "BuildFailed")
    assert condition(status, "Ready")["status"] == "False"
    [job] = sless.build_jobs("broken")
    retries = int(sless.op.env["SLESS_BUILD_RETRIES"])
    assert job["status"].get("failed") == retries + 1  # retried by the Job controller
    assert sless.get("deployment", "broken") is None

    sless.patch_spec("Function", "broken", codeHash=CODE_B, contextKey=f"contexts/{sless.ns}/broken/b.tar.gz")
    body = sless.wait_phase("Function", "broken", "Ready", timeout=120)
    assert condition(body["status"], "Built")["status"] == "True"


def test_invalid_spec_fails_permanently(sless: Sless) -> None:
    sless.function("bad", envVars={"SLESS_EVENT": "x"})  # the CRD allows it; the platform's rules do not
    body = sless.wait_phase("Function", "bad", "Failed")
    assert "reserved by the platform" in body["status"]["message"]
    assert sless.build_jobs("bad") == []
    sless.op.wait("permanent failure logged", lambda: "failed permanently" in sless.op.log_tail(400))


def test_a_function_edited_past_a_size_bound_is_refused_with_a_status_that_names_it(sless: Sless,
                                                                                      tmp_path: Path) -> None:
    """The CRD's schema bounds each value (the API server refuses a longer one outright); the total the platform
    allows is the codec's: a Function edited beyond it fails with a status naming the bound, builds nothing, and
    serves on once edited back."""
    sless.function("sized")
    sless.wait_phase("Function", "sized", "Ready")
    refused = sless.bed.kubectl("-n", sless.ns, "patch", "functions.sless.dev", "sized", "--type=merge", "-p",
                                json.dumps({"spec": {"envVars": {"HUGE": "x" * (ENV_MAX_VALUE + 1)}}}),
                                check=False)  # fmt: skip
    assert refused.returncode != 0 and "spec.envVars.HUGE" in refused.stderr, refused.stderr
    within_each = {f"V{i:02d}": "y" * ENV_MAX_VALUE for i in range(ENV_MAX_TOTAL_BYTES // ENV_MAX_VALUE + 1)}
    patch = tmp_path / "patch.json"  # a file: one command-line argument may not be that long
    patch.write_text(json.dumps({"spec": {"envVars": within_each}}))
    sless.bed.kubectl("-n", sless.ns, "patch", "functions.sless.dev", "sized", "--type=merge",
                      "--patch-file", str(patch))  # every value within the schema, their sum beyond the platform's
    body = sless.wait_phase("Function", "sized", "Failed")
    assert f"at most {ENV_MAX_TOTAL_BYTES} bytes in all" in body["status"]["message"], body["status"]
    deployment = sless.get("deployment", "sized")
    assert deployment is not None
    env = {e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0].get("env", [])}
    assert not env & set(within_each)  # the refused spec reached no pod
    sless.bed.kubectl("-n", sless.ns, "patch", "functions.sless.dev", "sized", "--type=json",
                      "-p", json.dumps([{"op": "remove", "path": "/spec/envVars"}]))  # fmt: skip
    sless.wait_phase("Function", "sized", "Ready")


def test_delete_removes_every_child(sless: Sless) -> None:
    sless.function("gone")
    sless.wait_phase("Function", "gone", "Ready")
    sless.apply("Trigger", "gone-tick", {"type": "cron", "function": "gone", "schedule": "*/5 * * * *"})
    sless.op.wait("CronJob", lambda: sless.get("cronjob", "gone-tick-cron"))
    assert sless.build_jobs("gone")
    sless.delete("Function", "gone")
    sless.wait_gone("Function", "gone")
    sless.wait_gone("deployment", "gone")  # garbage collection (owner reference)
    sless.wait_gone("service", "gone")
    sless.op.wait("build Job deleted", lambda: not sless.build_jobs("gone"))  # finalizer: another namespace
    sless.wait_gone("cronjob", "gone-tick-cron")  # finalizer: owned by the Trigger
    sless.op.wait("pods gone", lambda: not sless.labelled("pods", "sless.dev/function=gone"))


def test_precreated_children_are_adopted_not_duplicated(sless: Sless) -> None:
    # what a crash between "create child" and "record it" leaves behind: children without an owner
    fake_owner = Owner(crd.API_VERSION, "Function", "adopt", "00000000-0000-0000-0000-000000000000")
    spec = FunctionSpec.from_user({"name": "adopt", "runtime": "python3.11", "env_vars": {"OLD": "1"}}, 3600)
    ref = FunctionRef(sless.ns, "adopt", spec, CODE_A, "ctx", fake_owner)
    stale = manifests.deployment(OperatorConfig(), ref, "registry.test.invalid/stale:1", 1)
    del stale["metadata"]["ownerReferences"]
    svc = manifests.service(ref)
    del svc["metadata"]["ownerReferences"]
    sless.bed.apply(stale, svc)
    sless.function("adopt", envVars={"NEW": "1"})
    body = sless.wait_phase("Function", "adopt", "Ready")
    uid = body["metadata"]["uid"]
    deps = sless.labelled("deployments", "sless.dev/function=adopt")
    assert len(deps) == 1
    dep = deps[0]
    assert [r["uid"] for r in dep["metadata"]["ownerReferences"]] == [uid]
    assert "NEW" in env_of(dep) and "OLD" not in env_of(dep)
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == body["status"]["image"]
    services = sless.labelled("services", "sless.dev/function=adopt")
    assert len(services) == 1 and services[0]["metadata"]["ownerReferences"][0]["uid"] == uid


def test_child_held_by_another_owner_is_reported(sless: Sless) -> None:
    cm = sless.bed.kubectl("-n", sless.ns, "create", "configmap", "holder", "-o", "json")
    holder = json.loads(cm.stdout)
    dep = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "taken", "namespace": sless.ns, "ownerReferences": [{
               "apiVersion": "v1", "kind": "ConfigMap", "name": "holder", "uid": holder["metadata"]["uid"],
               "controller": True}]},
           "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "taken"}}, "template": {
               "metadata": {"labels": {"app": "taken"}},
               "spec": {"containers": [{"name": "c", "image": "x"}]}}}}  # fmt: skip
    sless.bed.apply(dep)
    sless.function("taken")
    body = sless.wait_phase("Function", "taken", "Failed")
    assert "belongs to ConfigMap holder" in body["status"]["message"]
    live = sless.get("deployment", "taken")
    assert live is not None and live["metadata"]["ownerReferences"][0]["kind"] == "ConfigMap"  # left alone
