"""An existing tenant's guard rails after an upgrade, on a real API server with the real operator: the quota
and DNS policy an earlier version left are replaced by the current ones when the operator serves the tenant."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sless_core import crd
from sless_operator import manifests
from sless_operator.config import OperatorConfig
from tests.support.kube_operator import Operator, Sless

pytestmark = pytest.mark.k8s


def earlier_version(tenant: str) -> list[dict[str, Any]]:
    """The quota without object counts and the DNS policy open to any resolver, as an earlier operator made them."""
    current = {o["metadata"]["name"]: o for o in manifests.tenant_objects(OperatorConfig(), tenant)}
    quota = copy.deepcopy(current[manifests.QUOTA_NAME])
    quota["spec"]["hard"] = {k: v for k, v in quota["spec"]["hard"].items()
                             if k in ("pods", "requests.cpu", "requests.memory", "limits.memory")}  # fmt: skip
    dns = copy.deepcopy(current[manifests.ALLOW_DNS_NAME])
    dns["spec"]["egress"] = [{"ports": dns["spec"]["egress"][0]["ports"]}]
    for obj in (quota, dns):
        obj["metadata"]["annotations"][manifests.SPEC_HASH] = "an-earlier-version"
    return [quota, dns]


def test_an_existing_tenants_quota_and_dns_policy_are_brought_up_to_date(operator: Operator) -> None:
    bed, tenant = operator.bed, operator.namespace
    bed.kubectl("label", "namespace", tenant, *(f"{k}={v}" for k, v in crd.tenant_namespace_labels().items()),
                "--overwrite")  # fmt: skip
    bed.apply(*earlier_version(tenant))
    sless = Sless(bed, tenant, operator)
    sless.function("up")  # the operator serves the tenant: it prepares the namespace once per process

    def current() -> bool:
        quota = sless.get("resourcequota", manifests.QUOTA_NAME) or {}
        policy = sless.get("networkpolicy", manifests.ALLOW_DNS_NAME) or {}
        return ("count/functions.sless.dev" in quota.get("spec", {}).get("hard", {})
                and "to" in (policy.get("spec", {}).get("egress") or [{}])[0])  # fmt: skip

    operator.wait("the tenant's guard rails updated", current, timeout=90)
    want = {o["metadata"]["name"]: o["spec"] for o in manifests.tenant_objects(operator_config(operator), tenant)}
    hard = sless.get("resourcequota", manifests.QUOTA_NAME)["spec"]["hard"]  # type: ignore[index]
    assert set(hard) == set(want[manifests.QUOTA_NAME]["hard"])
    [rule] = sless.get("networkpolicy", manifests.ALLOW_DNS_NAME)["spec"]["egress"]  # type: ignore[index]
    assert rule["to"] == want[manifests.ALLOW_DNS_NAME]["egress"][0]["to"]


def operator_config(op: Operator) -> OperatorConfig:
    """The configuration the test's operator reads (its environment)."""
    return OperatorConfig.from_env({k: v for k, v in op.env.items() if k.startswith("SLESS_")})
