"""Every NetworkPolicy the platform writes passes the API server's own validation.

The policies come from the platform's code, never re-typed: the operator's tenant policies
(``manifests.tenant_objects`` with a configuration read from ``SLESS_*`` settings, egress CIDRs and
an S3 address included so all five appear) and the chart's (``helm template`` with every policy on:
API/operator/events ingress and egress, the build namespace's default-deny and egress with
CIDR and namespace peers). Each is created with a server-side dry run and strict field
validation, so an unknown or misspelt field is an error rather than silently dropped.
The same dry run refuses a broken policy, so it is not a check that cannot fail.
"""

from __future__ import annotations

import copy
import json
import secrets
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from sless_core import crd
from sless_operator import manifests
from sless_operator.config import OperatorConfig
from tests.install.helm import render
from tests.support.testbed import Testbed

pytestmark = pytest.mark.k8s


def dry_run(bed: Testbed, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """Create OBJ with a server-side dry run: admission and validation run, nothing is stored."""
    return bed.kubectl("create", "--dry-run=server", "--validate=strict", "-o", "json", "-f", "-",
                       stdin=json.dumps(obj), check=False)  # fmt: skip


@pytest.fixture(scope="module")
def namespaces(k8s_testbed: Testbed) -> Iterator[dict[str, str]]:
    """A tenant, a release and a build namespace (a dry-run create needs its namespace to exist)."""
    names = {"tenant": f"sless-{secrets.token_hex(8)}", "release": f"sless-system-{secrets.token_hex(4)}",
             "build": f"sless-build-{secrets.token_hex(4)}"}  # fmt: skip
    labels = {"tenant": crd.tenant_namespace_labels(), "release": {}, "build": {}}
    for role, name in names.items():
        k8s_testbed.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels[role]}})
    try:
        yield names
    finally:
        k8s_testbed.kubectl("delete", "namespace", *names.values(), "--wait=false", check=False)


def operator_policies(tenant: str, release: str) -> list[dict[str, Any]]:
    config = OperatorConfig.from_env({"SLESS_PLATFORM_NAMESPACE": release, "SLESS_S3_ENDPOINT": "10.199.0.1:9000",
                                      "SLESS_FUNCTION_EGRESS_CIDRS": "10.20.0.0/16,192.168.7.8/32"})  # fmt: skip
    return [o for o in manifests.tenant_objects(config, tenant) if o["kind"] == "NetworkPolicy"]


def chart_policies(release: str, build: str) -> list[dict[str, Any]]:
    """The chart's NetworkPolicies with everything on (the defaults leave platform egress off)."""
    values: dict[str, Any] = {
        "networkPolicy": {"enabled": True,
                          "apiIngressNamespaceSelectors": [{"matchLabels": {"kubernetes.io/metadata.name": "ingress"}},
                                                           {"matchExpressions": [{"key": "team", "operator": "In",
                                                                                  "values": ["edge"]}]}],
                          "egress": {"enabled": True, "to": [{"cidr": "10.0.0.1/32", "ports": [443, 6443]},
                                                             {"cidr": "10.1.0.0/16"}]}},
    }  # fmt: skip
    build_policy = {"enabled": True, "dns": [{"namespace": "kube-system", "ports": [53]}],
                    "registry": [{"cidr": "10.199.0.1/32", "ports": [5000]}],
                    "s3": [{"namespace": release, "ports": [9000]}],
                    "packageRegistries": [{"cidr": "151.101.0.0/16", "ports": [443]}]}  # fmt: skip
    values["build"] = {"namespace": build, "networkPolicy": build_policy}
    return [o for o in render(values, "-n", release) if o["kind"] == "NetworkPolicy"]


def test_the_operators_tenant_policies_pass_server_validation(k8s_testbed: Testbed,
                                                              namespaces: dict[str, str]) -> None:  # fmt: skip
    policies = operator_policies(namespaces["tenant"], namespaces["release"])
    names = sorted(p["metadata"]["name"] for p in policies)
    assert names == sorted([manifests.DENY_NAME, manifests.ALLOW_PLATFORM_NAME, manifests.ALLOW_DNS_NAME,
                            manifests.ALLOW_EGRESS_NAME, manifests.ALLOW_CODE_FETCH_NAME])  # fmt: skip
    for policy in policies:
        proc = dry_run(k8s_testbed, policy)
        assert proc.returncode == 0, f"{policy['metadata']['name']}: {proc.stderr}"
        # what the server would store is what the operator wrote (no field dropped or defaulted away)
        stored = json.loads(proc.stdout)["spec"]
        assert stored == stored | policy["spec"], (stored, policy["spec"])


def test_the_charts_policies_pass_server_validation(k8s_testbed: Testbed, namespaces: dict[str, str]) -> None:
    policies = chart_policies(namespaces["release"], namespaces["build"])
    by_namespace = sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in policies)
    release, build = namespaces["release"], namespaces["build"]
    assert by_namespace == sorted([(release, "sless-api"), (release, "sless-operator"), (release, "sless-events"),
                                   (release, "sless-scaler"), (build, "sless-build-default-deny"),
                                   (build, "sless-build-egress")])  # fmt: skip
    for policy in policies:
        proc = dry_run(k8s_testbed, policy)
        assert proc.returncode == 0, f"{policy['metadata']['name']}: {proc.stderr}"
        stored = json.loads(proc.stdout)["spec"]
        assert stored == stored | policy["spec"], (stored, policy["spec"])


def _broken(policy: dict[str, Any], path: list[str | int], value: Any) -> dict[str, Any]:
    bad = copy.deepcopy(policy)
    target: Any = bad
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return bad


@pytest.mark.parametrize(("name", "path", "value", "message"), [
    (manifests.ALLOW_EGRESS_NAME, ["spec", "egress", 0, "to", 0, "ipBlock", "cidr"], "10.20.0.0/33", "cidr"),
    (manifests.ALLOW_PLATFORM_NAME, ["spec", "ingress", 0, "ports", 0, "port"], 0, "port"),
    (manifests.ALLOW_DNS_NAME, ["spec", "egress", 0, "ports", 0, "protocol"], "ICMP", "protocol"),
    (manifests.DENY_NAME, ["spec", "policyTypes"], ["Ingress", "Sideways"], "policyTypes"),
    (manifests.DENY_NAME, ["spec", "podSelecter"], {}, "podSelecter"),
    (manifests.ALLOW_PLATFORM_NAME, ["spec", "ingress", 0, "from", 0, "namespaceSelector", "matchLabels"],
     {"kubernetes.io/metadata.name": "not a name!"}, "matchLabels"),
])  # fmt: skip
def test_the_same_dry_run_refuses_a_broken_policy(k8s_testbed: Testbed, namespaces: dict[str, str], name: str,
                                                  path: list[str | int], value: Any, message: str) -> None:  # fmt: skip
    [policy] = [p for p in operator_policies(namespaces["tenant"], namespaces["release"])
                if p["metadata"]["name"] == name]  # fmt: skip
    proc = dry_run(k8s_testbed, _broken(policy, path, value))
    assert proc.returncode != 0, f"the API server accepted a broken {name}: {proc.stdout}"
    assert message in proc.stderr, proc.stderr
