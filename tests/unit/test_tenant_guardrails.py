"""The guard rails the operator puts in a tenant namespace, as data: its quota and its DNS policy (the real
API server's and the real node's side: tests/k8s/test_least_privilege.py, tests/realnode/test_realnode_netpol.py)."""

from __future__ import annotations

import pytest

from sless_core.envconfig import ConfigError
from sless_operator import manifests
from sless_operator.config import OperatorConfig

NS = "sless-0123456789abcdef"


def by_name(config: OperatorConfig) -> dict[str, dict]:  # type: ignore[type-arg]
    return {o["metadata"]["name"]: o for o in manifests.tenant_objects(config, NS)}


def test_the_quota_counts_what_a_tenant_can_make_and_forbids_storage_by_default() -> None:
    hard = by_name(OperatorConfig())["sless-quota"]["spec"]["hard"]
    assert hard == {
        "pods": "50", "requests.cpu": "8", "requests.memory": "16Gi", "limits.memory": "16Gi",
        "count/functions.sless.dev": "100", "count/triggers.sless.dev": "200",
        "count/functionjobs.sless.dev": "200", "secrets": "200", "requests.storage": "0",
    }  # fmt: skip


def test_the_quota_follows_its_settings() -> None:
    config = OperatorConfig.from_env({
        "SLESS_TENANT_QUOTA_FUNCTIONS": "3", "SLESS_TENANT_QUOTA_TRIGGERS": "4", "SLESS_TENANT_QUOTA_JOBS": "5",
        "SLESS_TENANT_QUOTA_SECRETS": "6", "SLESS_TENANT_QUOTA_STORAGE": "10Gi",
    })  # fmt: skip
    hard = by_name(config)["sless-quota"]["spec"]["hard"]
    assert (hard["count/functions.sless.dev"], hard["count/triggers.sless.dev"], hard["count/functionjobs.sless.dev"],
            hard["secrets"], hard["requests.storage"]) == ("3", "4", "5", "6", "10Gi")  # fmt: skip


@pytest.mark.parametrize("env", [{"SLESS_TENANT_QUOTA_FUNCTIONS": "many"}, {"SLESS_TENANT_QUOTA_SECRETS": "-1"},
                                 {"SLESS_TENANT_QUOTA_STORAGE": "lots"}, {"SLESS_DNS_POD_LABELS": "k8s-app"},
                                 {"SLESS_DNS_POD_LABELS": "a=b c"}, {"SLESS_DNS_CIDRS": "10.0.0.300/32"},
                                 {"SLESS_DNS_NAMESPACE": "Kube_System"}])  # fmt: skip
def test_bad_guard_rail_settings_stop_the_operator(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match=next(iter(env))):
        OperatorConfig.from_env(env)


def test_dns_egress_goes_to_the_cluster_dns_only() -> None:
    [rule] = by_name(OperatorConfig())["sless-allow-dns"]["spec"]["egress"]
    assert rule["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                           "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]  # fmt: skip
    assert rule["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]


def test_dns_peers_follow_their_settings() -> None:
    config = OperatorConfig.from_env({"SLESS_DNS_NAMESPACE": "dns", "SLESS_DNS_POD_LABELS": "app=coredns,tier=edge",
                                      "SLESS_DNS_CIDRS": "169.254.20.10/32"})  # fmt: skip
    [rule] = by_name(config)["sless-allow-dns"]["spec"]["egress"]
    assert rule["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "dns"}},
                           "podSelector": {"matchLabels": {"app": "coredns", "tier": "edge"}}},
                          {"ipBlock": {"cidr": "169.254.20.10/32"}}]  # fmt: skip
