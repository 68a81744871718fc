"""The operator's pure parts: manifests, configuration, child summaries, status and adoption rules.

Everything here runs without a cluster; tests/k8s/test_operator*.py drive the same code
through a real apiserver.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import secrets
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sless_core import contract, crd
from sless_core.buildcontext import make_build_context
from sless_core.crcodec import InvalidResource
from sless_core.envconfig import ConfigError
from sless_core.models import SecretRef
from sless_operator import capture, contextfetch, manifests, tenancy
from sless_operator.children import merged_owner_refs, needs_update
from sless_operator.config import OperatorConfig
from sless_operator.manifests import FunctionRef, Owner
from sless_operator.observe import (
    deployment_summary,
    desired_replicas,
    job_summary,
    trigger_summary,
)
from sless_operator.status import StatusBuilder, keep_head, keep_tail
from tests.support.operator_refs import HASH, NS, fn_ref
from tests.support.services import S3Endpoint

OTHER_HASH = "cd" * 32
CONFIG = OperatorConfig(registry="registry.test/sless", build_namespace="sless-build", s3_endpoint="http://minio:9000")


def container(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]
    template = spec["jobTemplate"]["spec"]["template"] if obj["kind"] == "CronJob" else spec["template"]
    return dict(template["spec"]["containers"][0])


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]
    template = spec["jobTemplate"]["spec"]["template"] if obj["kind"] == "CronJob" else spec["template"]
    return dict(template["spec"])


def kaniko(job: dict[str, Any]) -> dict[str, Any]:
    """The build Job's kaniko step (an init container: the push step runs after it)."""
    [c] = [c for c in pod_spec(job)["initContainers"] if c["name"] == manifests.BUILD_CONTAINER]
    return dict(c)


def assert_restricted(pod: dict[str, Any]) -> None:
    """The Pod Security 'restricted' rules that apply to what we generate."""
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    for volume in pod.get("volumes", []):
        assert set(volume) <= {"name", "emptyDir", "secret", "configMap", "projected"}, volume
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert "add" not in sc["capabilities"]
        assert not sc.get("privileged")


# -- names --------------------------------------------------------------------------------------


def test_new_code_always_gets_a_new_image_tag_and_build_job() -> None:
    assert manifests.image_ref(CONFIG, NS, "hello", HASH) == f"registry.test/sless/{NS}/hello:{HASH[:16]}"
    assert manifests.image_ref(CONFIG, NS, "hello", OTHER_HASH) != manifests.image_ref(CONFIG, NS, "hello", HASH)
    a = manifests.build_job_name(NS, "hello", HASH)
    assert a == manifests.build_job_name(NS, "hello", HASH)  # deterministic: a retry finds it
    assert a != manifests.build_job_name(NS, "hello", OTHER_HASH)
    assert a != manifests.build_job_name("sless-fedcba9876543210", "hello", HASH)  # shared build namespace
    # the same code uploaded again (a new build context) is a new build: a Failed function builds again
    assert manifests.build_job_name(NS, "hello", HASH, "contexts/a.tar.gz") != manifests.build_job_name(
        NS, "hello", HASH, "contexts/b.tar.gz")
    assert a.startswith("hello-build-")


def test_child_names_fit_kubernetes_limits_for_the_longest_user_names() -> None:
    longest = "f" * 40  # sless_core.naming.NAME_MAX
    assert len(manifests.build_job_name(NS, longest, HASH)) <= 63
    assert len(manifests.run_job_name(longest, 2**31 - 1)) <= 63
    assert len(manifests.cron_job_name(longest)) <= 52  # CronJob names leave 11 for the Jobs' suffix


# -- build Job ------------------------------------------------------------------------------------


def test_build_job_runs_kaniko_on_the_fetched_context_with_bounds() -> None:
    job = manifests.build_job(CONFIG, fn_ref())
    assert job["metadata"]["name"] == manifests.build_job_name(NS, "hello", HASH, fn_ref().context_key)
    assert job["metadata"]["namespace"] == "sless-build"
    assert "ownerReferences" not in job["metadata"]  # no owner reference across namespaces
    labels = job["metadata"]["labels"]
    assert labels[crd.LABEL_NAMESPACE] == NS and labels[crd.LABEL_FUNCTION] == "hello"
    assert labels[crd.LABEL_COMPONENT] == "build" and labels[crd.LABEL_MANAGED] == crd.MANAGED_BY
    assert job["spec"]["template"]["metadata"]["labels"] == labels  # pods found by our labels
    assert job["spec"]["activeDeadlineSeconds"] == CONFIG.build_deadline_sec
    assert job["spec"]["backoffLimit"] == CONFIG.build_retries
    pod = pod_spec(job)
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never"
    c = kaniko(job)
    assert c["name"] == "kaniko" and c["image"] == CONFIG.kaniko_image
    assert [i["name"] for i in pod["initContainers"]] == ["fetch-context", "kaniko"]
    assert [c["name"] for c in pod["containers"]] == ["push-image"]
    assert "--context=dir:///workspace/context" in c["args"]
    assert "--no-push" in c["args"] and "--tar-path=/workspace/image.tar" in c["args"]
    assert not any("s3://" in a for a in c["args"])
    assert f"--destination=registry.test/sless/{NS}/hello:{HASH[:16]}" in c["args"]
    assert c["resources"]["limits"] == {"cpu": "1", "memory": "2048Mi"}
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert "--insecure" not in c["args"]
    assert c["volumeMounts"] == [{"name": "context", "mountPath": "/workspace"}]
    assert pod["volumes"] == [{"name": "context", "emptyDir": {"sizeLimit": manifests.BUILD_WORKSPACE_SIZE}}]


def test_only_the_init_container_holds_the_s3_credentials() -> None:
    job = manifests.build_job(CONFIG, fn_ref())
    pod = pod_spec(job)
    fetch, kaniko = pod["initContainers"]
    push = container(job)
    assert "envFrom" not in kaniko and not kaniko.get("env")
    assert "envFrom" not in push and not push.get("env")
    assert fetch["name"] == "fetch-context" and fetch["image"] == CONFIG.build_fetch_image
    assert fetch["command"] == ["python", "-m", "sless_operator.contextfetch"]
    assert fetch["envFrom"] == [{"secretRef": {"name": CONFIG.build_s3_secret}}]
    assert "env" not in fetch
    args = fetch["args"]
    assert f"--bucket={CONFIG.s3_bucket}" in args and f"--key=contexts/{NS}/hello/1.tar.gz" in args
    assert "--dest=/workspace/context" in args and "--endpoint=http://minio:9000" in args
    assert f"--region={CONFIG.s3_region}" in args
    assert not any(a.startswith("--sha256") for a in args)  # unknown: not checked
    assert fetch["volumeMounts"] == [{"name": "context", "mountPath": "/workspace"}]
    # the fetcher needs no privilege at all (the build namespace is only "baseline" for kaniko)
    sc = fetch["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert fetch["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # no Secret anywhere but the init container's envFrom
    for step in (kaniko, push):
        text = json.dumps(step)
        assert CONFIG.build_s3_secret not in text and "AWS_" not in text


def test_build_job_checks_the_context_digest_when_the_function_states_it() -> None:
    ref = FunctionRef(NS, "hello", fn_ref().spec, HASH, f"contexts/{NS}/hello/1.tar.gz",
                      Owner(crd.API_VERSION, "Function", "hello", "uid-1"), context_sha256="ef" * 32)  # fmt: skip
    fetch = pod_spec(manifests.build_job(CONFIG, ref))["initContainers"][0]
    assert f"--sha256={'ef' * 32}" in fetch["args"]
    aws = OperatorConfig()  # no endpoint: the client's default (AWS)
    fetch = pod_spec(manifests.build_job(aws, fn_ref()))["initContainers"][0]
    assert not any(a.startswith("--endpoint") for a in fetch["args"])


def test_build_job_options_insecure_registry_push_secret_no_cache() -> None:
    config = OperatorConfig(registry_insecure=True, build_registry_secret="push", build_cache=False)
    job = manifests.build_job(config, fn_ref())
    c = kaniko(job)
    assert "--insecure" in c["args"] and "--skip-tls-verify" in c["args"]
    assert "--insecure" in container(job)["args"]  # the push step too
    assert not any(a.startswith("--cache") for a in c["args"])
    # the push credential is the push step's alone (tests/unit/test_build_push.py checks every step)
    assert c["volumeMounts"] == [{"name": "context", "mountPath": "/workspace"}]
    volumes = {v["name"]: v for v in pod_spec(job)["volumes"]}
    assert volumes["push-config"]["secret"]["secretName"] == "push"


def test_build_job_appends_the_configured_extra_kaniko_flags() -> None:
    config = OperatorConfig.from_env({"SLESS_KANIKO_EXTRA_ARGS": " --registry-map=index.docker.io=10.0.0.5:5000 "
                                                                 "--snapshot-mode=redo"})
    args = kaniko(manifests.build_job(config, fn_ref()))["args"]
    assert args[-2:] == ["--registry-map=index.docker.io=10.0.0.5:5000", "--snapshot-mode=redo"]
    assert sum(a.startswith("--destination=") for a in args) == 1
    default = kaniko(manifests.build_job(OperatorConfig(), fn_ref()))["args"]
    assert not any(a.startswith(("--registry-map", "--snapshot-mode")) for a in default)


def test_function_ref_refuses_a_context_key_outside_the_functions_own_prefix() -> None:
    body = {"apiVersion": crd.API_VERSION, "kind": "Function",
            "metadata": {"name": "hello", "namespace": NS, "uid": "u"},
            "spec": {"runtime": "python3.11", "codeHash": HASH, "contextKey": ""}}  # fmt: skip
    for key in (f"contexts/{NS}/hello/1.tar.gz", f"contexts/{NS}/hello/1700000000-abcdef012345.tar.gz"):
        body["spec"]["contextKey"] = key
        assert FunctionRef.of(body).context_key == key
    for key in ("contexts/sless-fedcba9876543210/hello/1.tar.gz", f"contexts/{NS}/other/1.tar.gz",
                f"contexts/{NS}/hello/../../x/1.tar.gz", f"contexts/{NS}/hello/", f"contexts/{NS}/hello/.hidden",
                f"functions/{NS}/hello/1.zip", f"contexts/{NS}/hello/a\\b"):  # fmt: skip
        body["spec"]["contextKey"] = key
        with pytest.raises(InvalidResource, match="its own build context"):
            FunctionRef.of(body)
    body["spec"].update(contextKey=f"contexts/{NS}/hello/1.tar.gz", contextSha256="ab" * 32)
    assert FunctionRef.of(body).context_sha256 == "ab" * 32


def test_a_failed_init_container_is_the_one_that_explains_a_build_failure() -> None:
    def state(code: int, message: str) -> dict[str, Any]:
        return {"state": {"terminated": {"exitCode": code, "message": message}}}

    pod = {
        "status": {
            "phase": "Failed",
            "initContainerStatuses": [{"name": "fetch-context", **state(1, "sha256 mismatch")}],
            "containerStatuses": [{"name": "kaniko", "state": {"waiting": {"reason": "PodInitializing"}}}],
        }
    }
    assert capture.failed_init_container(pod, ("fetch-context",)) == "fetch-context"
    assert capture.terminated_state(pod, "fetch-context")["message"] == "sha256 mismatch"
    fine = {
        "status": {
            "initContainerStatuses": [{"name": "fetch-context", **state(0, "")}],
            "containerStatuses": [{"name": "kaniko", **state(1, "RUN pip install failed")}],
        }
    }
    assert capture.failed_init_container(fine, ("fetch-context",)) is None
    assert capture.terminated_state(fine, "kaniko")["message"] == "RUN pip install failed"


# -- Deployment and Service -------------------------------------------------------------------------


def test_deployment_env_is_sorted_and_carries_the_runtime_contract() -> None:
    ref = fn_ref(env_vars={"ZED": "z", "ALPHA": "a"}, secrets=[SecretRef("db", "password", "DB_PASSWORD")])
    dep = manifests.deployment(CONFIG, ref, "img:1", replicas=2)
    env = container(dep)["env"]
    names = [e["name"] for e in env]
    assert names == sorted(names)
    values = {e["name"]: e.get("value") for e in env}
    assert values["ALPHA"] == "a" and values["ZED"] == "z"
    assert values["PORT"] == "8080" and values["SLESS_ENTRYPOINT"] == "handler.handle"
    assert values["SLESS_TIMEOUT_SEC"] == "30" and values["SLESS_FUNCTION"] == "hello"
    secret = next(e for e in env if e["name"] == "DB_PASSWORD")
    assert secret["valueFrom"] == {"secretKeyRef": {"name": "sless-secret-db", "key": "password"}}
    assert "value" not in secret  # never the plain value


def test_deployment_same_spec_same_hash_env_order_irrelevant() -> None:
    a = manifests.deployment(CONFIG, fn_ref(env_vars={"A": "1", "B": "2"}), "img:1", 1)
    b = manifests.deployment(CONFIG, fn_ref(env_vars={"B": "2", "A": "1"}), "img:1", 3)
    c = manifests.deployment(CONFIG, fn_ref(env_vars={"A": "1", "B": "3"}), "img:1", 1)
    key = manifests.SPEC_HASH
    assert a["metadata"]["annotations"][key] == b["metadata"]["annotations"][key]  # replicas excluded
    assert a["metadata"]["annotations"][key] != c["metadata"]["annotations"][key]


def test_deployment_pod_is_restricted_probed_and_sized() -> None:
    dep = manifests.deployment(CONFIG, fn_ref(memory_mb=512, timeout_sec=60), "img:1", 1)
    assert dep["metadata"]["ownerReferences"] == [{
        "apiVersion": crd.API_VERSION, "kind": "Function", "name": "hello", "uid": "uid-1",
        "controller": True, "blockOwnerDeletion": True}]  # fmt: skip
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = pod_spec(dep)
    assert_restricted(pod)
    c = container(dep)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["resources"] == {"requests": {"cpu": "64m", "memory": "512Mi"}, "limits": {"memory": "512Mi"}}
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/_/health", "port": "http"}
    # a pause before SIGTERM while the pod leaves the Service, 3 s more of accepting connections after it
    # (until every node's rules have dropped the pod), then the drain up to the timeout
    assert c["lifecycle"] == {"preStop": {"sleep": {"seconds": manifests.PRESTOP_SLEEP_SEC}}}
    assert {"name": "SLESS_DRAIN_LISTEN_SEC", "value": "3"} in c["env"]
    assert pod["terminationGracePeriodSeconds"] == manifests.PRESTOP_SLEEP_SEC + 3 + 65
    assert "command" not in c  # the image's CMD is the server
    selector = dep["spec"]["selector"]["matchLabels"]
    assert selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_service_targets_the_deployment_pods_on_8080() -> None:
    ref = fn_ref()
    svc = manifests.service(ref)
    dep = manifests.deployment(CONFIG, ref, "img:1", 1)
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_image_pull_secret_is_referenced_when_configured() -> None:
    config = OperatorConfig(image_pull_secret="regcred")
    assert pod_spec(manifests.deployment(config, fn_ref(), "img:1", 1))["imagePullSecrets"] == [{"name": "regcred"}]
    assert "imagePullSecrets" not in pod_spec(manifests.deployment(CONFIG, fn_ref(), "img:1", 1))


# -- run Jobs and CronJobs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("runtime", "command"),
    [
        ("python3.11", ["python3", "/app/runtime/runner.py"]),
        ("nodejs20", ["node", "/app/runtime/runner.js"]),
        ("go1.23", ["/app/bin/runner"]),
    ],
)
def test_run_job_runs_the_runner_with_the_event(runtime: str, command: list[str]) -> None:
    owner = Owner(crd.API_VERSION, "FunctionJob", "nightly", "uid-j")
    job = manifests.run_job(CONFIG, fn_ref(runtime), "img:1", owner, 3, {"x": [1, 2]})
    assert job["metadata"]["name"] == "nightly-run-3"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-j"
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels[crd.LABEL_JOB] == "nightly" and labels[crd.LABEL_RUN] == "3"
    assert job["spec"]["backoffLimit"] == CONFIG.job_retries
    assert job["spec"]["activeDeadlineSeconds"] == (30 + manifests.RUN_MARGIN_SEC) * (CONFIG.job_retries + 1)
    c = container(job)
    assert c["command"] == command
    assert json.loads(next(e["value"] for e in c["env"] if e["name"] == "SLESS_EVENT")) == {"x": [1, 2]}
    assert c["terminationMessagePath"] == "/dev/termination-log"
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # the runner writes its result there, apart from what the handler prints
    assert {"name": "SLESS_RESULT_FILE", "value": "/dev/termination-log"} in c["env"]
    assert "SLESS_DRAIN_LISTEN_SEC" not in {e["name"] for e in c["env"]}  # a runner has no listener
    assert "ports" not in c and "readinessProbe" not in c
    assert pod_spec(job)["restartPolicy"] == "Never"
    assert_restricted(pod_spec(job))


def test_cron_job_suspends_when_disabled_and_belongs_to_the_trigger() -> None:
    owner = Owner(crd.API_VERSION, "Trigger", "tick", "uid-t")
    on = manifests.cron_job(CONFIG, fn_ref(), "img:1", owner, "*/5 * * * *", enabled=True)
    off = manifests.cron_job(CONFIG, fn_ref(), "img:1", owner, "*/5 * * * *", enabled=False)
    assert on["metadata"]["name"] == "tick-cron"
    assert on["spec"]["schedule"] == "*/5 * * * *" and on["spec"]["suspend"] is False
    assert off["spec"]["suspend"] is True
    assert on["spec"]["concurrencyPolicy"] == "Forbid"
    assert on["metadata"]["ownerReferences"][0]["kind"] == "Trigger"
    assert on["metadata"]["annotations"][manifests.SPEC_HASH] != off["metadata"]["annotations"][manifests.SPEC_HASH]
    event = next(e["value"] for e in container(on)["env"] if e["name"] == "SLESS_EVENT")
    assert json.loads(event) == {"type": "cron", "trigger": "tick", "schedule": "*/5 * * * *"}
    assert {"name": "SLESS_RESULT_FILE", "value": "/dev/termination-log"} in container(on)["env"]
    assert_restricted(pod_spec(on))


def test_cron_jobs_follow_the_platforms_cron_rules() -> None:
    """No overlap, a missed tick fires late only within the start deadline, and the runner learns its tick
    from the Job's name (the label the Job controller puts on the pod)."""
    owner = Owner(crd.API_VERSION, "Trigger", "tick", "uid-t")
    job = manifests.cron_job(CONFIG, fn_ref(), "img:1", owner, "*/5 * * * *", enabled=True)
    assert job["spec"]["concurrencyPolicy"] == "Forbid" and contract.CRON_OVERLAP is False
    assert job["spec"]["startingDeadlineSeconds"] == contract.CRON_START_DEADLINE_SEC
    env = container(job)["env"]
    assert {"name": "SLESS_CRON_JOB", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.labels['batch.kubernetes.io/job-name']"}}} in env
    assert [e["name"] for e in env] == sorted(e["name"] for e in env)


# -- tenancy ---------------------------------------------------------------------------------------


def test_tenant_namespace_is_restricted_and_marked() -> None:
    labels = crd.tenant_namespace_labels()
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["sless.dev/tenant"] == "true"  # what the chart's admission policy looks for


def test_the_api_labels_a_tenant_namespace_as_the_operator_does() -> None:
    from sless_api.backends.kube.platform import NAMESPACE_LABELS

    assert crd.tenant_namespace_labels() == NAMESPACE_LABELS
    assert NAMESPACE_LABELS["pod-security.kubernetes.io/audit"] == "restricted"


@pytest.mark.parametrize("namespace", ["default", "kube-system", "sless-system", "sless-build",
                                       "sless-0123456789abcde", "sless-0123456789abcdef0", "sless-0123456789ABCDEF",
                                       "sless-0123456789abcdef\n", "xsless-0123456789abcdef", ""])  # fmt: skip
def test_only_tenant_namespaces_are_served(namespace: str) -> None:
    why = tenancy.refusal(namespace)
    assert why is not None and "not a tenant namespace" in why and repr(namespace) in why
    assert tenancy.NOT_A_TENANT == "NotATenantNamespace"


def test_a_tenant_namespace_is_served() -> None:
    assert tenancy.refusal(NS) is None


def test_tenant_objects_quota_limits_and_isolation() -> None:
    objs = {o["metadata"]["name"]: o for o in manifests.tenant_objects(CONFIG, NS)}
    assert set(objs) == {"sless-quota", "sless-limits", "sless-default-deny", "sless-allow-platform", "sless-allow-dns"}
    assert all(o["metadata"]["namespace"] == NS for o in objs.values())
    assert objs["sless-quota"]["spec"]["hard"]["pods"] == "50"
    assert objs["sless-default-deny"]["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    rule = objs["sless-allow-platform"]["spec"]["ingress"][0]
    assert rule["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "sless-system"}
    assert rule["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert {p["port"] for p in objs["sless-allow-dns"]["spec"]["egress"][0]["ports"]} == {53}
    # a LimitRange default CPU limit would throttle functions that set none
    assert "cpu" not in objs["sless-limits"]["spec"]["limits"][0]["default"]


def test_function_egress_cidrs_add_one_policy() -> None:
    config = OperatorConfig(function_egress_cidrs=("10.0.0.0/8",))
    extra = [o for o in manifests.tenant_objects(config, NS) if o["metadata"]["name"] == "sless-allow-egress"]
    assert extra[0]["spec"]["egress"] == [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}]


# -- configuration ----------------------------------------------------------------------------------


def test_config_from_env_reads_and_validates() -> None:
    config = OperatorConfig.from_env({
        "SLESS_REGISTRY": "reg.example:5000/fn/", "SLESS_BUILD_RETRIES": "4", "SLESS_REGISTRY_INSECURE": "yes",
        "SLESS_FUNCTION_EGRESS_CIDRS": "10.1.2.3/8, 192.168.0.0/16", "SLESS_JOB_RETRIES": "0",
    })  # fmt: skip
    assert config.registry == "reg.example:5000/fn"
    assert (config.build_retries, config.registry_insecure, config.job_retries) == (4, True, 0)
    assert config.function_egress_cidrs == ("10.0.0.0/8", "192.168.0.0/16")
    assert OperatorConfig.from_env({}) == OperatorConfig()
    fetch = OperatorConfig.from_env({"SLESS_BUILD_FETCH_IMAGE": "reg.example/sless@sha256:" + "0" * 64})
    assert fetch.build_fetch_image == "reg.example/sless@sha256:" + "0" * 64


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SLESS_BUILD_RETRIES", "many"),
        ("SLESS_JOB_RETRIES", "9"),
        ("SLESS_BUILD_NAMESPACE", "Not_A_Label"),
        ("SLESS_REGISTRY_INSECURE", "maybe"),
        ("SLESS_FUNCTION_EGRESS_CIDRS", "10.0.0.0/99"),
        ("SLESS_BUILD_CPU", "lots"),
        ("SLESS_BUILD_FETCH_IMAGE", "Not An Image"),
        ("SLESS_KANIKO_EXTRA_ARGS", "--verbosity=debug rm"),
        ("SLESS_KANIKO_EXTRA_ARGS", "--destination=evil.example/x"),
        ("SLESS_KANIKO_EXTRA_ARGS", "--context=s3://other-bucket/x"),
    ],
)
def test_config_errors_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        OperatorConfig.from_env({name: value})


# -- observed children --------------------------------------------------------------------------------


def _trigger(name: str, kind: str = "http", enabled: bool = True, deleting: bool = False) -> Any:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec: dict[str, Any] = {"type": kind, "function": "hello", "enabled": enabled}
    if kind == "cron":
        spec["schedule"] = "0  3 * * *"
    return trigger_summary({"metadata": meta, "spec": spec})


def test_http_rule_zero_replicas_only_when_every_http_trigger_is_disabled() -> None:
    assert desired_replicas(2, []) == 2
    assert desired_replicas(2, [_trigger("a", enabled=False)]) == 0
    assert desired_replicas(2, [_trigger("a", enabled=False), _trigger("b")]) == 2
    assert desired_replicas(2, [_trigger("a", enabled=False), _trigger("c", kind="cron")]) == 0
    assert desired_replicas(2, [_trigger("a", enabled=False, deleting=True)]) == 2


def test_the_trigger_index_reads_triggers_through_the_codec() -> None:
    assert _trigger("c", kind="cron").schedule == "0 3 * * *"  # as the reconcile's CronJob has it: no flapping
    invalid = trigger_summary({"metadata": {"name": "x", "namespace": NS, "uid": "x"},
                               "spec": {"type": "http", "function": "hello", "auth": "basic"}})
    assert (invalid.name, invalid.type, invalid.function, invalid.enabled) == ("x", "", "", False)
    assert desired_replicas(2, [_trigger("a", enabled=False), invalid]) == 0  # it counts for nothing


def test_job_summary_states() -> None:
    def job(status: dict[str, Any]) -> str:
        return job_summary({"metadata": {"name": "j"}, "status": status}).state

    assert job({}) == "pending"
    assert job({"active": 1}) == "active"
    assert job({"conditions": [{"type": "Complete", "status": "True"}]}) == "complete"
    assert job({"active": 1, "conditions": [{"type": "FailureTarget", "status": "True"}]}) == "active"
    failed = job_summary({"metadata": {}, "status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "m"}]}})  # fmt: skip
    assert (failed.state, failed.reason, failed.message) == ("failed", "BackoffLimitExceeded", "m")


def test_rollout_is_ready_only_when_complete() -> None:
    def rollout(spec_replicas: int, gen: int, status: dict[str, Any]) -> str:
        body = {"metadata": {"generation": gen}, "spec": {"replicas": spec_replicas}, "status": status}
        return deployment_summary(body).rollout()[0]

    done = {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}
    assert rollout(2, 2, done) == "ready"
    assert rollout(2, 3, done) == "progressing"  # controller has not seen the change yet
    assert rollout(2, 2, {**done, "replicas": 3}) == "progressing"  # an old pod still terminating
    assert rollout(2, 2, {**done, "availableReplicas": 1}) == "progressing"
    assert rollout(0, 1, {"observedGeneration": 1}) == "ready"  # scaled to zero
    stuck = {**done, "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                                     "message": "too slow"}]}  # fmt: skip
    assert rollout(2, 2, stuck) == "failed"


# -- status ------------------------------------------------------------------------------------------


def test_status_keeps_transition_time_and_detects_no_change() -> None:
    first = StatusBuilder(None, 1).set(phase="Building").condition("Ready", False, "RollingOut", "x")
    built = first.build()
    since = built["conditions"][0]["lastTransitionTime"]
    same = StatusBuilder(built, 1).set(phase="Building").condition("Ready", False, "RollingOut", "x")
    assert not same.changed()
    flipped = StatusBuilder({**built, "conditions": [{**built["conditions"][0], "lastTransitionTime": "old"}]}, 2)
    flipped.set(phase="Ready").condition("Ready", True, "Available")
    assert flipped.changed()
    assert flipped.build()["conditions"][0]["lastTransitionTime"] != "old"
    assert flipped.build()["conditions"][0]["observedGeneration"] == 2
    kept = StatusBuilder({**built, "conditions": [{**built["conditions"][0], "lastTransitionTime": "old"}]}, 2)
    assert kept.condition("Ready", False, "Other").build()["conditions"][0]["lastTransitionTime"] == "old"
    assert since


def test_truncation_keeps_the_useful_end() -> None:
    text = "".join(f"line {i}\n" for i in range(1000))
    assert len(keep_tail(text)) <= 2000 and keep_tail(text).endswith("line 999\n")
    assert len(keep_head(text)) <= 2000 and keep_head(text).startswith("line 0\n")
    assert keep_tail("short") == "short"


# -- adoption ---------------------------------------------------------------------------------------


def test_adoption_takes_over_a_deleted_predecessor_but_not_a_stranger() -> None:
    want = manifests.deployment(CONFIG, fn_ref(), "img:1", 1)
    orphan = {"metadata": {"name": "hello"}}
    assert merged_owner_refs(want, orphan) == want["metadata"]["ownerReferences"]
    old = {"metadata": {"ownerReferences": [{**want["metadata"]["ownerReferences"][0], "uid": "old-uid"}]}}
    assert merged_owner_refs(want, old) == want["metadata"]["ownerReferences"]
    stranger = {"metadata": {"ownerReferences": [{"kind": "ReplicaSet", "name": "x", "uid": "u", "controller": True}]}}
    assert merged_owner_refs(want, stranger) is None
    extra = {"kind": "ConfigMap", "name": "note", "uid": "u2"}
    assert merged_owner_refs(want, {"metadata": {"ownerReferences": [extra]}}) == [
        *want["metadata"]["ownerReferences"], extra]  # fmt: skip


def test_needs_update_compares_our_hash_owner_labels_and_replicas() -> None:
    want = manifests.deployment(CONFIG, fn_ref(), "img:1", 1)
    live = json.loads(json.dumps(want))
    assert not needs_update(want, live)
    live["spec"]["replicas"] = 0
    assert needs_update(want, live)
    live = json.loads(json.dumps(want))
    live["metadata"]["annotations"][manifests.SPEC_HASH] = "other"
    assert needs_update(want, live)


# -- the build's context fetcher (init container) --------------------------------------------------


def _tar_gz(path: Path, entries: list[tuple[str, bytes | str | None]]) -> Path:
    """A tar.gz with ENTRIES: (name, bytes) files, (name, None) directories, (name, "->target") symlinks."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(data, str):
                info.type, info.linkname = tarfile.SYMTYPE, data.removeprefix("->")
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return path


def test_fetcher_unpacks_a_real_build_context(tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "lib").mkdir(parents=True)
    (code / "handler.py").write_text("def handle(event):\n    return event\n")
    (code / "lib" / "util.py").write_text("X = 1\n")
    archive = tmp_path / "ctx.tar.gz"
    archive.write_bytes(make_build_context(code, "python3.11", "handler.handle", "sless/python3.11:latest"))
    dest = tmp_path / "workspace" / "context"
    written = contextfetch.unpack(archive, dest, contextfetch.Limits())
    assert written > 0
    assert "\nFROM sless/python3.11:latest\n" in (dest / "Dockerfile").read_text()
    assert (dest / "function" / "handler.py").read_text().startswith("def handle")
    assert (dest / "function" / "lib" / "util.py").read_text() == "X = 1\n"


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([("../escape", b"x")], "unsafe path"),
        ([("/etc/passwd", b"x")], "unsafe path"),
        ([("function/..\\\\x", b"x")], "unsafe path"),
        ([("Dockerfile", "->/etc/shadow")], "not a regular file"),
        ([("Dockerfile", b"a"), ("./Dockerfile", b"b")], "duplicate"),
        ([(f"f{i}", b"") for i in range(6)], "more than 5 entries"),
        ([("big", b"x" * 2000)], "more than 1000 bytes"),
        ([("a", b"x" * 600), ("b", b"y" * 600)], "more than 1000 bytes"),
    ],
)  # fmt: skip
def test_fetcher_refuses_unsafe_archives(tmp_path: Path, entries: list[tuple[str, Any]], message: str) -> None:
    archive = _tar_gz(tmp_path / "bad.tar.gz", entries)
    with pytest.raises(contextfetch.FetchError, match=message):
        contextfetch.unpack(archive, tmp_path / "out", contextfetch.Limits(max_bytes=1000, max_entries=5))
    assert not (tmp_path / "escape").exists()


def test_fetcher_refuses_what_is_not_a_tar_gz(tmp_path: Path) -> None:
    archive = tmp_path / "junk.tar.gz"
    archive.write_bytes(b"PK\x03\x04 not a tar")
    with pytest.raises(contextfetch.FetchError, match=r"not a readable tar\.gz"):
        contextfetch.unpack(archive, tmp_path / "out", contextfetch.Limits())


def _fetch(s3: S3Endpoint, bucket: str, key: str, dest: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """The init container's command, as a real process with the Secret's two variables only."""
    env = {"PATH": os.environ.get("PATH", ""), "AWS_ACCESS_KEY_ID": s3.access_key,
           "AWS_SECRET_ACCESS_KEY": s3.secret_key}  # fmt: skip
    argv = [sys.executable, "-m", "sless_operator.contextfetch", f"--endpoint={s3.url}", f"--bucket={bucket}",
            f"--key={key}", f"--dest={dest}", "--region=us-east-1", *extra]  # fmt: skip
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.s3
def test_fetcher_downloads_checks_and_unpacks_from_s3(s3_endpoint: S3Endpoint, tmp_path: Path) -> None:
    from minio import Minio

    bucket = f"ctx-{secrets.token_hex(6)}"
    client = Minio(s3_endpoint.endpoint, access_key=s3_endpoint.access_key, secret_key=s3_endpoint.secret_key,
                   secure=False)  # fmt: skip
    client.make_bucket(bucket)
    data = _tar_gz(tmp_path / "c.tar.gz", [("Dockerfile", b"FROM scratch\n"), ("function", None)]).read_bytes()
    key = f"contexts/{NS}/hello/1.tar.gz"
    client.put_object(bucket, key, io.BytesIO(data), len(data))
    digest = hashlib.sha256(data).hexdigest()

    ok = _fetch(s3_endpoint, bucket, key, tmp_path / "ws" / "context", f"--sha256={digest}")
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "ws" / "context" / "Dockerfile").read_text() == "FROM scratch\n"
    assert sorted(p.name for p in (tmp_path / "ws").iterdir()) == ["context"]  # the archive is gone

    altered = _fetch(s3_endpoint, bucket, key, tmp_path / "ws2" / "context", f"--sha256={'0' * 64}")
    assert altered.returncode == 1 and f"has SHA-256 {digest}, expected" in altered.stderr
    assert not (tmp_path / "ws2" / "context").exists()  # nothing half-checked is left for kaniko
    missing = _fetch(s3_endpoint, bucket, f"contexts/{NS}/hello/none.tar.gz", tmp_path / "ws3" / "context")
    assert missing.returncode == 1 and "cannot read build context" in missing.stderr
    bad_arg = _fetch(s3_endpoint, bucket, key, tmp_path / "ws4" / "context", "--sha256=xyz")
    assert bad_arg.returncode == 2


def test_secrets_as_files_are_one_read_only_projected_volume() -> None:
    ref = fn_ref(secrets=[SecretRef("db", "tls.crt", file="tls.crt"), SecretRef("db", "password", file="pw"),
                          SecretRef("api", "token", env="API_TOKEN")])
    dep = manifests.deployment(CONFIG, ref, "img:1", replicas=1)
    pod = dep["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == manifests.SECRETS_VOLUME)
    assert volume["projected"]["sources"] == [{"secret": {"name": "sless-secret-db", "items": [
        {"key": "password", "path": "pw"}, {"key": "tls.crt", "path": "tls.crt"}]}}]
    mount = next(m for m in container(dep)["volumeMounts"] if m["name"] == manifests.SECRETS_VOLUME)
    assert mount == {"name": "secrets", "mountPath": "/run/sless/secrets", "readOnly": True}
    env = {e["name"]: e for e in container(dep)["env"]}
    assert env["SLESS_SECRETS_DIR"]["value"] == "/run/sless/secrets"
    assert env["API_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "sless-secret-api", "key": "token"}}
    plain = manifests.deployment(CONFIG, fn_ref(), "img:1", replicas=1)
    assert [v["name"] for v in plain["spec"]["template"]["spec"]["volumes"]] == ["tmp"]
    assert "SLESS_SECRETS_DIR" not in {e["name"] for e in container(plain)["env"]}


def test_a_new_secrets_version_rolls_the_pods() -> None:
    base = fn_ref(secrets=[SecretRef("db", "password", env="P")])
    one = manifests.deployment(CONFIG, dataclasses.replace(base, secrets_version="aaaa"), "img:1", 1)
    two = manifests.deployment(CONFIG, dataclasses.replace(base, secrets_version="bbbb"), "img:1", 1)
    assert one["spec"]["template"]["metadata"]["annotations"] == {crd.ANNOTATION_SECRETS: "aaaa"}
    key = manifests.SPEC_HASH
    assert one["metadata"]["annotations"][key] != two["metadata"]["annotations"][key]
    assert manifests.deployment(CONFIG, base, "img:1", 1)["spec"]["template"]["metadata"]["annotations"] == {}


# -- seccomp on every pod the operator makes ---------------------------------------------------------------


def _every_pod() -> dict[str, dict[str, Any]]:
    """Each kind of pod the operator creates: function Deployments, run Jobs, CronJobs, image builds (code and
    dependency images), Go compile Jobs."""
    owner = Owner(crd.API_VERSION, "FunctionJob", "nightly", "uid-j")
    trigger = Owner(crd.API_VERSION, "Trigger", "tick", "uid-t")
    fetched = dataclasses.replace(fn_ref(), code_key=f"code/{NS}/hello/0001-ab.tar.gz", code_sha256="c0" * 32,
                                  deps_hash="d0" * 32, context_key="")
    go = dataclasses.replace(fn_ref("go1.23"), code_key=f"code/{NS}/hello/0001-ab.tar.gz", code_sha256="c0" * 32,
                             context_key="")
    key = manifests.binary_key(go, "registry.test/sless/go1.23:latest")
    itself = dataclasses.replace(fetched, deps_hash="")
    objects = {
        "deployment": manifests.deployment(CONFIG, fn_ref(), "img:1", 1),
        "deployment (fetched code)": manifests.deployment(CONFIG, fetched, "img:1", 1),
        "deployment (the runtime fetches its code)": manifests.deployment(CONFIG, itself, "img:1", 1),
        "run job": manifests.run_job(CONFIG, fn_ref(), "img:1", owner, 1, {}),
        "cron job": manifests.cron_job(CONFIG, fn_ref("nodejs20"), "img:1", trigger, "*/5 * * * *", True),
        "build job": manifests.build_job(CONFIG, fn_ref()),
        "dependency image job": manifests.build_job(CONFIG, fetched),
        "compile job": manifests.compile_job(CONFIG, go, "registry.test/sless/go1.23:latest", key,
                                             "http://s3/get?sig", "http://s3/put?sig"),
    }
    return {name: pod_spec(obj) for name, obj in objects.items()}


@pytest.mark.parametrize("kind", list(_every_pod()))
def test_every_pod_runs_under_the_runtime_default_seccomp_profile(kind: str) -> None:
    """Pod level, so every container has it; no container may swap it for another (Unconfined)."""
    pod = _every_pod()[kind]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, kind
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        assert "seccompProfile" not in c.get("securityContext", {}), (kind, c["name"])


# -- Python and Node pods fetch their own code -------------------------------------------------------------


def _fetched(runtime: str, **fields: Any) -> manifests.FunctionRef:
    return dataclasses.replace(fn_ref(runtime), code_key=f"code/{NS}/hello/0001-ab.tar.gz", code_sha256="c0" * 32,
                               context_key="", **fields)  # fmt: skip


@pytest.mark.parametrize("runtime", ["python3.11", "nodejs20"])
def test_python_and_node_pods_on_the_runtime_image_fetch_their_own_code(runtime: str) -> None:
    """No init container (a container start less on a cold start): the runtime container reads the signed URL
    from the Secret (renewing it restarts nothing), unpacks into the code volume and says why it cannot."""
    ref = _fetched(runtime)
    assert ref.fetches_itself
    trigger = Owner(crd.API_VERSION, "Trigger", "tick", "uid-t")
    for obj in (manifests.deployment(CONFIG, ref, "img:1", 1),
                manifests.run_job(CONFIG, ref, "img:1", Owner(crd.API_VERSION, "FunctionJob", "j", "u"), 1, {}),
                manifests.cron_job(CONFIG, ref, "img:1", trigger, "*/5 * * * *", True)):  # fmt: skip
        pod = pod_spec(obj)
        assert "initContainers" not in pod, obj["kind"]
        [c] = pod["containers"]
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}
        assert env["SLESS_CODE_URL"] == {"secretKeyRef": {"name": "sless-code-hello", "key": "url"}}
        assert (env["SLESS_CODE_KEY"], env["SLESS_CODE_SHA256"]) == (ref.code_key, "c0" * 32)
        assert env["SLESS_CODE_MAX_BYTES"] == str(manifests.CODE_MAX_BYTES)
        assert env["SLESS_CODE_REPORT_FILE"] == c["terminationMessagePath"] == "/dev/termination-log"
        assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert [e["name"] for e in c["env"]] == sorted(e["name"] for e in c["env"])  # stable: no needless rollout
        # the code volume is writable for the runtime's user; the root filesystem stays read-only
        assert {"name": "code", "mountPath": "/app/function"} in c["volumeMounts"]
        assert {"name": "code", "emptyDir": {"sizeLimit": manifests.CODE_VOLUME_SIZE}} in pod["volumes"]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("ref", [_fetched("python3.11", deps_hash="d0" * 32), _fetched("go1.23")],
                         ids=["dependency image", "go"])  # fmt: skip
def test_go_and_dependency_image_pods_keep_the_fetch_code_init_container(ref: manifests.FunctionRef) -> None:
    """Go's run image is a bare base image; a dependency image may come from an older runtime image."""
    if ref.compiled:
        ref = dataclasses.replace(ref, binary_key=f"binaries/{NS}/hello/0001-ab-1.tar.gz", binary_sha256="b" * 64)
    assert not ref.fetches_itself
    pod = pod_spec(manifests.deployment(CONFIG, ref, "img:1", 1))
    [init] = pod["initContainers"]
    assert init["name"] == manifests.FETCH_CODE_CONTAINER and f"--key={ref.fetch_key}" in init["args"]
    assert not any(e["name"].startswith("SLESS_CODE_") for e in pod["containers"][0]["env"])
    assert all(m.get("readOnly") for m in pod["containers"][0]["volumeMounts"] if m["name"] == "code")
