"""The operator's reach: only tenant namespaces, on a real apiserver.

Two fences, each tested on its own and then together:
- the operator refuses Function, Trigger and FunctionJob outside ``sless-<16 hex>``: a status
  that says why (reason ``NotATenantNamespace``) and no child anywhere;
- the chart's ValidatingAdmissionPolicy denies the operator's ServiceAccount every write of a
  workload outside tenant namespaces (build Jobs in the build namespace excepted), checked by
  impersonating that ServiceAccount and by running the real operator with its token.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.install.helm import render
from tests.support.kube_operator import CODE_A, RESOURCES, Operator, Sless, strip_finalizers
from tests.support.testbed import Testbed

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

NOT_A_TENANT = "NotATenantNamespace"
DENIED = "the sless operator may write"


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


def create_resources(bed: Testbed, namespace: str, name: str) -> None:
    """A Function with code, a cron and an http Trigger and a FunctionJob, all in NAMESPACE."""

    def cr(kind: str, cr_name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "sless.dev/v1alpha1", "kind": kind,
                "metadata": {"name": cr_name, "namespace": namespace}, "spec": spec}  # fmt: skip

    bed.apply(
        cr("Function", name, {"runtime": "python3.11", "codeHash": CODE_A,
                              "contextKey": f"contexts/{namespace}/{name}/a.tar.gz"}),
        cr("Trigger", f"{name}-tick", {"type": "cron", "function": name, "schedule": "*/5 * * * *"}),
        cr("Trigger", f"{name}-web", {"type": "http", "function": name}),
        cr("FunctionJob", f"{name}-run", {"function": name, "runId": 1, "event": {"a": 1}}),
    )  # fmt: skip


def remove_resources(bed: Testbed, namespace: str, name: str) -> None:
    """Delete what create_resources made (finalizers cleared: the operator may be gone)."""
    for kind, cr_name in (("Function", name), ("Trigger", f"{name}-tick"), ("Trigger", f"{name}-web"),
                          ("FunctionJob", f"{name}-run")):  # fmt: skip
        bed.kubectl("-n", namespace, "patch", RESOURCES[kind], cr_name, "--type=merge",
                    "-p", '{"metadata":{"finalizers":null}}', check=False)  # fmt: skip
        bed.kubectl("-n", namespace, "delete", RESOURCES[kind], cr_name, "--ignore-not-found", "--wait=false",
                    check=False)  # fmt: skip


def assert_refused(op: Operator, namespace: str, name: str) -> None:
    """Every resource of create_resources in NAMESPACE says why it is refused, and nothing was made for it."""
    bed = op.bed

    def refused(kind: str, cr_name: str, cond: str) -> dict[str, Any] | None:
        body = bed.get(RESOURCES[kind], cr_name, "-n", namespace)
        status = (body or {}).get("status") or {}
        found = condition(status, cond)
        return status if found.get("reason") == NOT_A_TENANT and found.get("status") == "False" else None

    fn = op.wait(f"Function {namespace}/{name} refused", lambda: refused("Function", name, "Ready"))
    assert fn["phase"] == "Failed" and f"namespace '{namespace}' is not a tenant namespace" in fn["message"]
    assert condition(fn, "Built")["reason"] == NOT_A_TENANT
    assert "image" not in fn and "buildJob" not in fn
    for trigger in (f"{name}-tick", f"{name}-web"):
        st = op.wait(f"Trigger {namespace}/{trigger} refused", lambda t=trigger: refused("Trigger", t, "Ready"))
        assert "not a tenant namespace" in st["message"]
    job = op.wait(f"FunctionJob {namespace}/{name}-run refused", lambda: refused("FunctionJob", f"{name}-run",
                                                                                   "Complete"))  # fmt: skip
    assert job["phase"] == "Failed" and "not a tenant namespace" in job["message"]

    for kind in ("deployments", "services", "cronjobs", "jobs", "pods"):
        listed = bed.get(kind, "-n", namespace, "-l", f"sless.dev/function={name}")
        assert listed["items"] == [], f"{kind} created in {namespace}: {listed['items']}"
    builds = bed.get("jobs", "-n", op.build_namespace, "-l", f"sless.dev/namespace={namespace}")
    assert builds["items"] == [], "a build Job was created for a non-tenant namespace"
    assert bed.get("resourcequota", "sless-quota", "-n", namespace) is None
    labels = bed.get("namespace", namespace)["metadata"].get("labels") or {}
    assert "sless.dev/tenant" not in labels and labels.get("pod-security.kubernetes.io/enforce") != "restricted"


@pytest.fixture
def outsiders(sless_crds: Testbed) -> Iterator[list[str]]:
    """``default``, a platform-like namespace and a near miss (17 hex digits): none is a tenant's."""
    bed = sless_crds
    made = [f"sless-system-{secrets.token_hex(4)}", f"sless-{secrets.token_hex(8)}0"]
    for namespace in made:
        bed.kubectl("create", "namespace", namespace)
    try:
        yield ["default", *made]
    finally:
        for namespace in made:
            strip_finalizers(bed, namespace)
            bed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_resources_outside_tenant_namespaces_get_a_status_and_no_children(
    sless_crds: Testbed, tenant: str, outsiders: list[str], tmp_path: Path
) -> None:
    bed = sless_crds
    build_ns = f"sless-build-{secrets.token_hex(4)}"
    name = f"out-{secrets.token_hex(3)}"
    op = Operator(bed, tenant, build_ns, tmp_path, more_namespaces=tuple(outsiders)).start()
    try:
        for namespace in outsiders:
            create_resources(bed, namespace, name)
        # the same operator serves the tenant meanwhile: the refusals are not an operator at a standstill
        sless = Sless(bed, tenant, op)
        sless.function(name)
        sless.wait_phase("Function", name, "Ready")
        for namespace in outsiders:
            assert_refused(op, namespace, name)
        # a refused Function is deleted like any other (the finalizer goes, nothing to clean up)
        bed.kubectl("-n", "default", "delete", RESOURCES["Function"], name, "--wait=false")
        op.wait("refused Function deleted", lambda: bed.get(RESOURCES["Function"], name, "-n", "default") is None)
    finally:
        op.stop()
        remove_resources(bed, "default", name)
        bed.kubectl("delete", "namespace", build_ns, "--wait=false", "--ignore-not-found", check=False)


# -- the chart's admission policy -------------------------------------------------------------------


SCOPE_KINDS = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterRole", "ClusterRoleBinding",
               "ServiceAccount", "Namespace", "NetworkPolicy"}  # fmt: skip


@dataclass(frozen=True)
class Platform:
    """The chart's operator identity, RBAC, admission policy and build namespace on the test bed."""

    bed: Testbed
    namespace: str  # the release namespace (the operator's ServiceAccount lives here)
    service_account: str
    build_namespace: str
    policy: dict[str, Any]

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    def as_operator(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.bed.kubectl(f"--as={self.user}", *args, check=False)


def chart_objects(fullname: str, namespace: str, build_ns: str) -> list[dict[str, Any]]:
    """What the chart makes for the operator's scope: SA, RBAC, the policy, the build namespace and its policies."""
    values = yaml.safe_load((Path(__file__).resolve().parents[2] / "charts/sless/values.yaml").read_text())
    build = {**values["build"], "namespace": build_ns}
    objects = render({"fullnameOverride": fullname, "build": build}, "-n", namespace)
    picked = []
    for obj in objects:
        if obj["kind"] not in SCOPE_KINDS:
            continue
        if obj["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding") and not obj["metadata"][
            "name"
        ].endswith("-operator"):
            continue
        if obj["kind"] == "NetworkPolicy" and obj["metadata"].get("namespace") != build_ns:
            continue
        picked.append(obj)
    return picked


@pytest.fixture(scope="module")
def platform(k8s_testbed: Testbed) -> Iterator[Platform]:
    bed = k8s_testbed
    tag = secrets.token_hex(4)
    fullname, namespace, build_ns = f"scope-{tag}", f"scope-system-{tag}", f"sless-build-{tag}"
    objects = chart_objects(fullname, namespace, build_ns)
    kinds = sorted({o["kind"] for o in objects})
    assert kinds == sorted(SCOPE_KINDS), kinds
    [policy] = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"
                and o["metadata"]["name"].endswith("-operator-scope")]
    bed.kubectl("create", "namespace", namespace)
    found = Platform(bed, namespace, f"{fullname}-operator", build_ns, policy)
    try:
        bed.apply(*objects)
        # a new policy is compiled and picked up asynchronously: wait until it denies
        deployment = ["create", "deployment", "probe", "--image=busybox", "-n", "default", "--dry-run=server"]
        bed.wait("the admission policy is in force", lambda: DENIED in found.as_operator(*deployment).stderr, 60)
        yield found
    finally:
        bed.remove_applied(objects, namespace)


@pytest.fixture
def labelled_tenant(platform: Platform) -> Iterator[str]:
    """A tenant namespace as the API creates it: the name and the sless.dev/tenant label."""
    name = f"sless-{secrets.token_hex(8)}"
    platform.bed.kubectl("create", "namespace", name)
    platform.bed.kubectl("label", "namespace", name, "sless.dev/tenant=true")
    try:
        yield name
    finally:
        strip_finalizers(platform.bed, name)
        platform.bed.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _denied(proc: subprocess.CompletedProcess[str]) -> bool:
    return proc.returncode != 0 and DENIED in proc.stderr


def test_policy_denies_the_operator_workloads_outside_tenant_namespaces(platform: Platform) -> None:
    for args in (["deployment", "web", "--image=busybox"], ["job", "run", "--image=busybox"],
                 ["cronjob", "tick", "--image=busybox", "--schedule=*/5 * * * *"],
                 ["service", "clusterip", "web", "--tcp=8080:8080"]):  # fmt: skip
        proc = platform.as_operator("create", *args, "-n", "default", "--dry-run=server")
        assert _denied(proc), (args, proc.returncode, proc.stderr)
        assert "not in default" in proc.stderr
    quota = platform.as_operator("create", "quota", "q", "--hard=pods=1", "-n", "kube-system", "--dry-run=server")
    assert _denied(quota), quota.stderr
    # the same request by someone else (the test's admin) is none of the policy's business
    admin = platform.bed.kubectl("create", "deployment", "web", "--image=busybox", "-n", "default",
                                 "--dry-run=server", check=False)  # fmt: skip
    assert admin.returncode == 0, admin.stderr


def test_policy_allows_the_operator_in_a_labelled_tenant_namespace(platform: Platform, labelled_tenant: str) -> None:
    ns = labelled_tenant
    made = platform.as_operator("create", "deployment", "web", "--image=busybox", "-n", ns)
    assert made.returncode == 0, made.stderr
    assert platform.bed.get("deployment", "web", "-n", ns) is not None
    scaled = platform.as_operator("patch", "deployment", "web", "-n", ns, "-p", '{"spec":{"replicas":0}}')
    assert scaled.returncode == 0, scaled.stderr
    for args in (["service", "clusterip", "web", "--tcp=8080:8080"], ["cronjob", "tick", "--image=busybox",
                 "--schedule=*/5 * * * *"], ["quota", "q", "--hard=pods=5"]):  # fmt: skip
        proc = platform.as_operator("create", *args, "-n", ns)
        assert proc.returncode == 0, (args, proc.stderr)
    gone = platform.as_operator("delete", "deployment", "web", "-n", ns)
    assert gone.returncode == 0, gone.stderr


def test_policy_wants_both_the_tenant_name_and_the_label(platform: Platform) -> None:
    bed = platform.bed
    unlabelled = f"sless-{secrets.token_hex(8)}"  # tenant-shaped, not (yet) marked
    impostor = f"scope-impostor-{secrets.token_hex(4)}"  # marked, not tenant-shaped
    bed.kubectl("create", "namespace", unlabelled)
    bed.kubectl("create", "namespace", impostor)
    try:
        bed.kubectl("label", "namespace", impostor, "sless.dev/tenant=true")
        for ns in (unlabelled, impostor):
            proc = platform.as_operator("create", "deployment", "web", "--image=busybox", "-n", ns, "--dry-run=server")
            assert _denied(proc), (ns, proc.stderr)
        # the operator may mark a tenant-shaped namespace (that is how it prepares one) ...
        marked = platform.as_operator("label", "namespace", unlabelled, "sless.dev/tenant=true")
        assert marked.returncode == 0, marked.stderr
        allowed = platform.as_operator("create", "deployment", "web", "--image=busybox", "-n", unlabelled,
                                       "--dry-run=server")  # fmt: skip
        assert allowed.returncode == 0, allowed.stderr
        # ... but not any other namespace, so it cannot mark its way into kube-system
        for ns in ("default", "kube-system"):
            proc = platform.as_operator("label", "namespace", ns, "sless.dev/tenant=true", "--dry-run=server")
            assert proc.returncode != 0 and "may change only tenant namespaces" in proc.stderr, proc.stderr
    finally:
        bed.kubectl("delete", "namespace", unlabelled, impostor, "--wait=false", check=False)


def test_policy_allows_build_jobs_in_the_build_namespace_and_nothing_else(platform: Platform) -> None:
    ns = platform.build_namespace
    job = platform.as_operator("create", "job", "build", "--image=busybox", "-n", ns, "--dry-run=server")
    assert job.returncode == 0, job.stderr
    for args in (["deployment", "web", "--image=busybox"], ["cronjob", "tick", "--image=busybox",
                 "--schedule=*/5 * * * *"]):  # fmt: skip
        proc = platform.as_operator("create", *args, "-n", ns, "--dry-run=server")
        assert _denied(proc), (args, proc.stderr)


def test_chart_build_namespace_policies_are_accepted_by_the_apiserver(platform: Platform) -> None:
    listed = platform.bed.get("networkpolicies", "-n", platform.build_namespace)
    by_name = {p["metadata"]["name"]: p["spec"] for p in listed["items"]}
    deny = next(spec for name, spec in by_name.items() if name.endswith("build-default-deny"))
    assert deny["policyTypes"] == ["Ingress", "Egress"] and deny["podSelector"] == {}
    egress = next(spec for name, spec in by_name.items() if name.endswith("build-egress"))["egress"]
    peers = [json.dumps(rule["to"][0], sort_keys=True) for rule in egress]
    assert any("kube-system" in p for p in peers) and any("sless-system" in p for p in peers)


def _token_kubeconfig(bed: Testbed, namespace: str, service_account: str, path: Path) -> Path:
    """A kubeconfig that acts as the ServiceAccount (a TokenRequest token): the chart's RBAC, nothing more."""
    admin = json.loads(bed.kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
    token = bed.kubectl("create", "token", service_account, "-n", namespace, "--duration=1h").stdout.strip()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "bed", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "bed", "user": "sa"}}],
    }))  # fmt: skip
    path.chmod(0o600)
    return path


def test_the_operator_under_the_policy_builds_and_deploys_tenants_and_refuses_others(
    platform: Platform, sless_crds: Testbed, tenant: str, tmp_path: Path
) -> None:
    bed = platform.bed
    kubeconfig = _token_kubeconfig(bed, platform.namespace, platform.service_account, tmp_path / "sa.kubeconfig")
    name = f"pol-{secrets.token_hex(3)}"
    op = Operator(bed, tenant, platform.build_namespace, tmp_path, extra_env={"KUBECONFIG": str(kubeconfig)},
                  more_namespaces=("default",)).start()  # fmt: skip
    try:
        create_resources(bed, "default", name)
        sless = Sless(bed, tenant, op)
        sless.function(name)
        sless.apply("Trigger", f"{name}-tick", {"type": "cron", "function": name, "schedule": "*/5 * * * *"})
        body = sless.wait_phase("Function", name, "Ready", timeout=120)
        assert body["status"]["image"].endswith(CODE_A[:16])
        # everything a tenant needs was allowed: the mark, the guard rails, the build, the workloads
        labels = bed.get("namespace", tenant)["metadata"]["labels"]
        assert labels["sless.dev/tenant"] == "true" and labels["pod-security.kubernetes.io/enforce"] == "restricted"
        assert sless.get("resourcequota", "sless-quota") is not None
        assert sless.get("networkpolicy", "sless-default-deny") is not None
        assert sless.build_jobs(name), "no build Job in the build namespace"
        assert sless.get("deployment", name) is not None and sless.get("service", name) is not None
        op.wait("CronJob", lambda: sless.get("cronjob", f"{name}-tick-cron"))
        sless.apply("FunctionJob", f"{name}-once", {"function": name, "runId": 1, "event": {}})
        sless.wait_phase("FunctionJob", f"{name}-once", "Succeeded", timeout=120)
        assert_refused(op, "default", name)
        # deleting reaches the build namespace (build Jobs by label) and the tenant's CronJob: allowed too
        sless.delete("Function", name)
        sless.wait_gone("Function", name)
        op.wait("build Jobs deleted", lambda: not sless.build_jobs(name))
        sless.wait_gone("cronjob", f"{name}-tick-cron")
    finally:
        op.stop()
        remove_resources(bed, "default", name)
