"""The API's least privilege on a real API server: the chart's RBAC and admission policy, checked by
impersonating the API's ServiceAccount, and the real API process running with that account's token.

- Outside tenant namespaces the API reads no Secret and no pod log (``kube-system``, ``default``, its own).
- Inside a tenant's namespace it holds those rights once it has created the tenant (``POST /ensure``), or,
  for a tenant that existed before, once it first serves that tenant's secrets: a RoleBinding of the
  ``<fullname>-api-tenant`` role that the API creates itself.
- It may bind that role and no other; the admission policy lets it bind it only in tenant namespaces and
  only to itself, and refuses every write of any other kind, even where RBAC would allow it.
- A create beyond the tenant's quota (the operator's ResourceQuota) answers a JSON 403 naming the quota.
"""

from __future__ import annotations

import json
import secrets as random
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from sless_operator import manifests
from sless_operator.config import OperatorConfig
from tests.install.helm import render
from tests.support.kube_api import KubeApi, apply_crds, call, function_pod, logs_of, routable, start_api
from tests.support.platform import Tenant
from tests.support.services import S3Endpoint
from tests.support.testbed import Testbed

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

WRITE_DENIED = "the sless API may"


@dataclass(frozen=True)
class Identity:
    """The chart's API ServiceAccount, its ClusterRoles, binding and admission policy on the test bed."""

    bed: Testbed
    release_ns: str
    account: str
    tenant_role: str
    own_role: str

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.release_ns}:{self.account}"

    def as_api(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.bed.kubectl(f"--as={self.user}", *args, check=False)

    def can(self, verb: str, resource: str, namespace: str | None = None) -> bool:
        """``kubectl auth can-i`` as the API; RESOURCE may name a subresource (``pods/log``) or an object
        (``clusterroles/admin``)."""
        where = ["-n", namespace] if namespace else ["--all-namespaces"]
        kind, _, sub = resource.partition("/")
        what = [kind, f"--subresource={sub}"] if kind == "pods" and sub else [resource]
        proc = self.as_api("auth", "can-i", verb, *what, *where)
        assert proc.stdout.strip() in ("yes", "no"), proc.stderr
        return proc.stdout.strip() == "yes"

    def binding(self, namespace: str, role: str | None = None, subject: str | None = None,
                subject_ns: str | None = None) -> dict[str, Any]:  # fmt: skip
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": f"probe-{random.token_hex(3)}", "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": role or self.tenant_role},
                "subjects": [{"kind": "ServiceAccount", "name": subject or self.account,
                              "namespace": subject_ns or self.release_ns}]}  # fmt: skip

    def create_as_api(self, obj: dict[str, Any], dry_run: bool = True) -> subprocess.CompletedProcess[str]:
        args = ["create", "-f", "-", *(["--dry-run=server"] if dry_run else [])]
        return self.bed.kubectl(f"--as={self.user}", *args, stdin=json.dumps(obj), check=False)


def chart_identity(fullname: str, release_ns: str) -> list[dict[str, Any]]:
    """The chart's objects that make up the API's identity and reach."""
    names = {f"{fullname}-api", f"{fullname}-api-tenant", f"{fullname}-api-scope"}
    kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
             "ValidatingAdmissionPolicyBinding"}  # fmt: skip
    return [o for o in render({"fullnameOverride": fullname}, "-n", release_ns)
            if o["kind"] in kinds and o["metadata"]["name"] in names]  # fmt: skip


@pytest.fixture(scope="module")
def identity(k8s_testbed: Testbed) -> Iterator[Identity]:
    bed = k8s_testbed
    apply_crds(bed)
    tag = random.token_hex(4)
    fullname, release_ns = f"lp-{tag}", f"lp-system-{tag}"
    objects = chart_identity(fullname, release_ns)
    assert sorted(o["kind"] for o in objects) == ["ClusterRole", "ClusterRole", "ClusterRoleBinding", "ServiceAccount",
                                                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    found = Identity(bed, release_ns, f"{fullname}-api", f"{fullname}-api-tenant", f"{fullname}-api")
    bed.kubectl("create", "namespace", release_ns)
    try:
        bed.apply(*objects)
        # a new policy is compiled and picked up asynchronously: wait until it denies
        probe = ["create", "namespace", f"lp-probe-{tag}", "--dry-run=server"]
        bed.wait("the API's admission policy is in force", lambda: WRITE_DENIED in found.as_api(*probe).stderr, 60)
        yield found
    finally:
        bed.remove_applied(objects, release_ns)


@pytest.fixture
def labelled_tenant(identity: Identity) -> Iterator[str]:
    """A tenant namespace as the API creates it (the name and the sless.dev/tenant label), without the API's
    RoleBinding: a tenant from before the binding existed."""
    name = f"sless-{random.token_hex(8)}"
    identity.bed.kubectl("create", "namespace", name)
    identity.bed.kubectl("label", "namespace", name, "sless.dev/tenant=true", "app.kubernetes.io/managed-by=sless")
    try:
        yield name
    finally:
        identity.bed.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _denied(proc: subprocess.CompletedProcess[str], why: str) -> bool:
    return proc.returncode != 0 and why in proc.stderr


# -- RBAC, by impersonation -------------------------------------------------------------------------


def test_the_api_reads_no_secret_and_no_pod_log_outside_tenant_namespaces(identity: Identity,
                                                                          labelled_tenant: str) -> None:  # fmt: skip
    for namespace in ("kube-system", "default", identity.release_ns, labelled_tenant):
        for verb in ("get", "list", "watch", "create", "delete"):
            assert not identity.can(verb, "secrets", namespace), (verb, namespace)
        assert not identity.can("get", "pods/log", namespace), namespace
        assert not identity.can("list", "pods", namespace), namespace
    assert not identity.can("list", "secrets") and not identity.can("get", "pods/log")
    read = identity.as_api("get", "secrets", "-n", "kube-system")
    assert read.returncode != 0 and "forbidden" in read.stderr.lower(), read.stderr
    # what it keeps cluster-wide: its custom resources and namespaces (the route table watches them)
    assert identity.can("watch", "functions.sless.dev") and identity.can("create", "namespaces")


def test_the_api_may_bind_its_tenant_role_and_no_other(identity: Identity, labelled_tenant: str) -> None:
    assert identity.can("bind", f"clusterroles/{identity.tenant_role}", labelled_tenant)
    for role in ("admin", "edit", "cluster-admin", identity.own_role):
        assert not identity.can("bind", f"clusterroles/{role}", labelled_tenant), role
    assert not identity.can("escalate", "clusterroles", labelled_tenant)
    # RBAC refuses a binding of a role whose rights the API does not hold ...
    admin = identity.create_as_api(identity.binding(labelled_tenant, role="admin"))
    assert admin.returncode != 0 and "forbidden" in admin.stderr.lower(), admin.stderr
    # ... and the admission policy one of a role it does hold (its own ClusterRole), another subject, or
    # its tenant role outside tenant namespaces
    for obj, why in (
        (identity.binding(labelled_tenant, role=identity.own_role), "may bind only the ClusterRole"),
        (identity.binding(labelled_tenant, subject="default", subject_ns=labelled_tenant), "may bind only"),
        (identity.binding(labelled_tenant, subject_ns="kube-system"), "may bind only"),
        (identity.binding("kube-system"), "only in tenant namespaces"),
        (identity.binding("default"), "only in tenant namespaces"),
    ):
        proc = identity.create_as_api(obj)
        assert _denied(proc, why), (obj["metadata"]["namespace"], obj["roleRef"]["name"], proc.stderr)
    allowed = identity.create_as_api(identity.binding(labelled_tenant))
    assert allowed.returncode == 0, allowed.stderr


def test_the_policy_fences_the_apis_writes_even_where_rbac_would_allow_them(identity: Identity,
                                                                            labelled_tenant: str) -> None:  # fmt: skip
    """With a broad role added (``edit`` everywhere, as a mistaken install might), the policy still allows the
    API nothing but its own kinds in tenant namespaces."""
    bed = identity.bed
    extra = f"{identity.account}-extra"
    unlabelled = f"sless-{random.token_hex(8)}"
    bed.kubectl("create", "clusterrolebinding", extra, "--clusterrole=edit",
                f"--serviceaccount={identity.release_ns}:{identity.account}")  # fmt: skip
    bed.kubectl("create", "namespace", unlabelled)
    try:
        bed.wait("the extra role in force", lambda: identity.can("create", "deployments", "default"), 30)

        def create(*args: str) -> subprocess.CompletedProcess[str]:
            return identity.as_api("create", *args, "--dry-run=server")

        secret = ["secret", "generic", "sless-secret-db", "--from-literal=k=v"]
        for args, why in (
            (["deployment", "web", "--image=busybox", "-n", labelled_tenant], "may write only namespaces"),
            (["configmap", "c", "-n", labelled_tenant], "may write only namespaces"),
            (["serviceaccount", "sa", "-n", labelled_tenant], "may write only namespaces"),
            ([*secret, "-n", "kube-system"], "only in tenant namespaces"),
            ([*secret, "-n", identity.release_ns], "only in tenant namespaces"),
            ([*secret, "-n", unlabelled], "only in tenant namespaces"),
            (["secret", "generic", "other", "--from-literal=k=v", "-n", labelled_tenant], "named sless-secret-"),
            (["namespace", f"lp-{random.token_hex(3)}"], "only tenant namespaces"),
        ):
            proc = create(*args)
            assert _denied(proc, why), (args, proc.stderr)
        function = {"apiVersion": "sless.dev/v1alpha1", "kind": "Function",
                    "metadata": {"name": "f", "namespace": "default"}, "spec": {"runtime": "python3.11"}}
        proc = identity.create_as_api(function)
        assert _denied(proc, "only in tenant namespaces"), proc.stderr
        # its own kinds in a tenant namespace pass
        assert create(*secret, "-n", labelled_tenant).returncode == 0
        assert identity.create_as_api({**function, "metadata": {"name": "f", "namespace": labelled_tenant}}
                                      ).returncode == 0  # fmt: skip
    finally:
        bed.kubectl("delete", "clusterrolebinding", extra, "--ignore-not-found", check=False)
        bed.kubectl("delete", "namespace", unlabelled, "--wait=false", check=False)


# -- the real API process, with the ServiceAccount's token ------------------------------------------


def token_kubeconfig(bed: Testbed, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig that acts as the ServiceAccount (a TokenRequest token): the chart's RBAC, nothing more."""
    admin = json.loads(bed.kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
    token = bed.kubectl("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "bed", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "bed", "user": "sa"}}],
    }))  # fmt: skip
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def api_as_account(identity: Identity, s3_endpoint: S3Endpoint,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApi]:  # fmt: skip
    work = tmp_path_factory.mktemp("lp-api")
    kubeconfig = token_kubeconfig(identity.bed, identity.release_ns, identity.account, work / "sa.kubeconfig")
    api = start_api(identity.bed, s3_endpoint, work / "api", kubeconfig=kubeconfig, extra_env={
        "SLESS_KUBE_TENANT_ROLE": identity.tenant_role,
        "SLESS_KUBE_SERVICE_ACCOUNT": f"{identity.release_ns}:{identity.account}",
    })  # fmt: skip
    yield api
    api.stop()
    api.gate.close()


def test_the_api_gets_its_tenant_rights_by_creating_the_tenant(identity: Identity, api_as_account: KubeApi) -> None:
    t = api_as_account.tenant("lp")
    try:
        assert not identity.can("get", "secrets", t.ns)
        t.api("POST", "/ensure", expect=201)
        binding = identity.bed.get("rolebinding", identity.tenant_role, "-n", t.ns)
        assert binding["roleRef"]["name"] == identity.tenant_role
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": identity.account,
                                        "namespace": identity.release_ns}]  # fmt: skip
        for verb, resource in (("get", "secrets"), ("list", "secrets"), ("create", "secrets"),
                               ("list", "pods"), ("get", "pods/log")):  # fmt: skip
            assert identity.can(verb, resource, t.ns), (verb, resource)
        assert not identity.can("get", "secrets", "kube-system")  # still not elsewhere
        assert not identity.can("watch", "secrets", t.ns) and not identity.can("create", "pods/exec", t.ns)
        t.api("POST", "/secrets", json={"name": "db", "data": {"password": "pw"}}, expect=201)
        assert [s["name"] for s in t.api("GET", "/secrets", expect=200).json()["items"]] == ["db"]
        t.api("POST", "/functions", json={"name": "hello", "runtime": "python3.11",
                                          "secrets": [{"name": "db", "key": "password", "env": "PW"}]}, expect=201)
        assert t.api("POST", "/ensure", expect=200).json()["created"] is False  # a second binding is no error
        assert "Forbidden" not in api_as_account.log_tail(200)
    finally:
        identity.bed.kubectl("delete", "namespace", t.ns, "--wait=false", check=False)


def test_a_tenant_from_before_gets_the_binding_on_first_use(identity: Identity, api_as_account: KubeApi) -> None:
    """An upgrade: a tenant namespace the API made earlier has no RoleBinding; its first secret request makes it."""
    t = api_as_account.tenant("old")
    bed = identity.bed
    bed.kubectl("create", "namespace", t.ns)
    bed.kubectl("label", "namespace", t.ns, "sless.dev/tenant=true", "app.kubernetes.io/managed-by=sless")
    bed.kubectl("create", "secret", "generic", "sless-secret-old", "-n", t.ns, "--from-literal=k=v")
    bed.kubectl("label", "secret", "sless-secret-old", "-n", t.ns, "sless.dev/secret=old",
                "app.kubernetes.io/managed-by=sless")  # fmt: skip
    try:
        assert bed.get("rolebinding", identity.tenant_role, "-n", t.ns) is None
        assert [s["name"] for s in t.api("GET", "/secrets", expect=200).json()["items"]] == ["old"]
        assert bed.get("rolebinding", identity.tenant_role, "-n", t.ns) is not None
    finally:
        bed.kubectl("delete", "namespace", t.ns, "--wait=false", check=False)


def test_a_calls_logs_are_read_through_the_tenant_binding(identity: Identity, api_as_account: KubeApi) -> None:
    """GET .../invocations/{id}/logs lists the function's pods and reads their logs with the tenant role alone."""
    t = api_as_account.tenant("logs")
    try:
        t.api("POST", "/ensure", expect=201)
        routable(api_as_account, t, "talk")
        function_pod(identity.bed, t.ns, "talk", "talk-a", ["@sless:lp-1 hello through the binding"])
        call(t, "talk", "lp-1")
        identity.bed.wait("the call's lines", lambda: [line["text"] for line in logs_of(t, "talk", "lp-1")["lines"]]
                          == ["hello through the binding"], 60, 0.5)  # fmt: skip
    finally:
        identity.bed.kubectl("delete", "namespace", t.ns, "--wait=false", check=False)


def test_a_tenant_without_a_namespace_has_no_secrets_rather_than_an_error(api_as_account: KubeApi) -> None:
    t = api_as_account.tenant("none")
    assert t.api("GET", "/secrets", expect=200).json()["items"] == []
    assert t.api("GET", "/secrets/db", expect=404).json()["error"] == "secret 'db' not found"


# -- the quota ---------------------------------------------------------------------------------------


def quota_in(bed: Testbed, namespace: str, **limits: int) -> None:
    """The operator's ResourceQuota for a configuration with LIMITS, counted by the controller-manager."""
    config = OperatorConfig.from_env({f"SLESS_TENANT_QUOTA_{k.upper()}": str(v) for k, v in limits.items()})
    [quota] = [o for o in manifests.tenant_objects(config, namespace) if o["kind"] == "ResourceQuota"]
    bed.apply(quota)

    def counted() -> bool:
        status = (bed.get("resourcequota", quota["metadata"]["name"], "-n", namespace) or {}).get("status") or {}
        return set(quota["spec"]["hard"]) <= set(status.get("used") or {})

    bed.wait("the tenant quota counted", counted, timeout=90, interval=0.5)


def test_a_create_beyond_the_quota_answers_403_naming_it(identity: Identity, api_as_account: KubeApi) -> None:
    t: Tenant = api_as_account.tenant("quota")
    try:
        t.api("POST", "/ensure", expect=201)
        quota_in(identity.bed, t.ns, functions=2, secrets=1, triggers=1, jobs=1)
        for name in ("f1", "f2"):
            t.api("POST", "/functions", json={"name": name, "runtime": "python3.11"}, expect=201)
        over = t.api("POST", "/functions", json={"name": "f3", "runtime": "python3.11"}, expect=403)
        body = over.json()
        assert body["quota"] == "functions" and body["limit"] == 2 and body["used"] == 2, body
        assert body["error"].startswith("function 'f3': this tenant's quota allows 2 functions"), body
        assert "sless-quota" in body["error"] and "Traceback" not in over.text
        t.api("POST", "/secrets", json={"name": "a", "data": {"k": "v"}}, expect=201)
        second = t.api("POST", "/secrets", json={"name": "b", "data": {"k": "v"}}, expect=403).json()
        assert second["quota"] == "secrets" and second["limit"] == 1, second
        t.api("POST", "/triggers", json={"name": "web", "type": "http", "function": "f1"}, expect=201)
        trigger = t.api("POST", "/triggers", json={"name": "web2", "type": "http", "function": "f2"}, expect=403)
        assert trigger.json()["quota"] == "triggers"
        t.api("POST", "/jobs", json={"name": "j1", "function": "f1"}, expect=201)
        assert t.api("POST", "/jobs", json={"name": "j2", "function": "f1"}, expect=403).json()["quota"] == "jobs"
        # deleting one frees its place again
        t.api("DELETE", "/functions/f2", expect=204)
        identity.bed.wait("the quota counts the deletion", lambda: t.api(
            "POST", "/functions", json={"name": "f3", "runtime": "python3.11"}).status_code == 201, 60, 1)
    finally:
        identity.bed.kubectl("delete", "namespace", t.ns, "--wait=false", check=False)
