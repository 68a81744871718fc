"""The API's side of a tenant namespace on Kubernetes, as data: the settings and body of its RoleBinding there,
and the tenant's answer to a quota refusal (the real API server's side: tests/k8s/test_least_privilege.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import cast

import pytest

from sless_api.backends.kube.access import TenantAccess
from sless_api.backends.kube.client import KubeClient, translate
from sless_api.backends.kube.quota import QuotaExceeded, refusal
from sless_api.backends.settings import KubeSettings
from sless_api.domain.errors import Unavailable
from sless_core.envconfig import ConfigError

NS = "sless-0123456789abcdef"


# -- the API's RoleBinding --------------------------------------------------------------------------


def test_the_api_binding_settings_come_together() -> None:
    settings = KubeSettings.from_env({"SLESS_KUBE_TENANT_ROLE": "sless-api-tenant",
                                      "SLESS_KUBE_SERVICE_ACCOUNT": "sless-system:sless-api"})  # fmt: skip
    assert settings.tenant_role == "sless-api-tenant"
    assert settings.service_account == ("sless-system", "sless-api")
    assert KubeSettings.from_env({}).tenant_role == "" and KubeSettings.from_env({}).service_account is None


@pytest.mark.parametrize("env", [{"SLESS_KUBE_TENANT_ROLE": "sless-api-tenant"},
                                 {"SLESS_KUBE_SERVICE_ACCOUNT": "sless-system:sless-api"},
                                 {"SLESS_KUBE_TENANT_ROLE": "Bad Role", "SLESS_KUBE_SERVICE_ACCOUNT": "a:b"},
                                 {"SLESS_KUBE_TENANT_ROLE": "r", "SLESS_KUBE_SERVICE_ACCOUNT": "no-colon"},
                                 {"SLESS_KUBE_TENANT_ROLE": "r", "SLESS_KUBE_SERVICE_ACCOUNT": "a.b:c"}])  # fmt: skip
def test_bad_api_binding_settings_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="SLESS_KUBE_"):
        KubeSettings.from_env(env)


class FakeClient:
    """Only what TenantAccess reads before any request."""

    def __init__(self, settings: KubeSettings) -> None:
        self.settings = settings


def test_the_binding_grants_the_tenant_role_to_the_api_alone() -> None:
    settings = KubeSettings(tenant_role="sless-api-tenant", service_account=("sless-system", "sless-api"))
    access = TenantAccess(cast(KubeClient, FakeClient(settings)))
    body = access.binding(NS)
    assert body["metadata"]["namespace"] == NS and body["metadata"]["name"] == "sless-api-tenant"
    assert body["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                               "name": "sless-api-tenant"}  # fmt: skip
    assert body["subjects"] == [{"kind": "ServiceAccount", "name": "sless-api", "namespace": "sless-system"}]


def test_without_a_tenant_role_nothing_is_bound() -> None:
    access = TenantAccess(cast(KubeClient, FakeClient(KubeSettings())))
    assert not access.enabled
    assert access.ensure(NS) and access.grant(NS)  # no request: FakeClient has no API to call


# -- the tenant's answer to a quota refusal ---------------------------------------------------------

EXCEEDED = ('functions.sless.dev "f3" is forbidden: exceeded quota: sless-quota, requested: '
            "count/functions.sless.dev=1, used: count/functions.sless.dev=2, limited: count/functions.sless.dev=2")


def test_a_quota_refusal_names_the_limit() -> None:
    error = refusal(EXCEEDED, "function 'f3'")
    assert isinstance(error, QuotaExceeded) and error.status == 403
    assert error.details == {"quota": "functions", "limit": 2, "used": 2, "requested": 1}
    assert error.message.startswith("function 'f3': this tenant's quota allows 2 functions and 2 are in use")
    assert "sless-quota" in error.message


def test_a_secret_refusal_among_several_resources() -> None:
    message = ('secrets "sless-secret-x" is forbidden: exceeded quota: sless-quota, requested: secrets=1, '
               "used: secrets=200, limited: secrets=200")
    error = refusal(message, "secret 'x'")
    assert isinstance(error, QuotaExceeded) and error.details["quota"] == "secrets"


def test_a_quota_not_yet_counted_is_a_retry_and_other_refusals_are_not_quotas() -> None:
    assert isinstance(refusal("status unknown for quota: sless-quota, resources: secrets", "x"), Unavailable)
    assert refusal('secrets is forbidden: User "x" cannot list resource "secrets"', "x") is None


def test_translate_maps_a_quota_403_to_the_tenants_403() -> None:
    from kubernetes.client.exceptions import ApiException

    exc = ApiException(status=403, reason="Forbidden")
    exc.body = json.dumps({"kind": "Status", "message": EXCEEDED, "reason": "Forbidden"})
    error = translate(exc, "function 'f3'")
    assert isinstance(error, QuotaExceeded) and error.details["quota"] == "functions"
    denied = ApiException(status=403, reason="Forbidden")
    denied.body = '{"message": "functions.sless.dev is forbidden: User cannot create", "reason": "Forbidden"}'
    assert isinstance(translate(denied, "function 'f3'"), Unavailable)


# -- a quota not yet counted is waited out ----------------------------------------------------------
# The API server answers "status unknown for quota" only in the moments before its quota controller has counted
# a new quota (or discovered a new CRD): a window a real cluster cannot be held in on demand. So these tests
# raise the API server's own exception from a scripted call (a named stand-in for that fault).

UNCOUNTED = "functions.sless.dev \"f\" is forbidden: status unknown for quota: sless-quota, resources: count/triggers"


def _scripted(refusals: int) -> tuple[list[int], KubeClient, Callable[[], str]]:
    """A client and a create that the API server refuses REFUSALS times as not yet counted, then accepts."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    calls: list[int] = []

    def create(**_: object) -> str:
        calls.append(1)
        if len(calls) <= refusals:
            exc = ApiException(status=403, reason="Forbidden")
            exc.body = json.dumps({"kind": "Status", "message": UNCOUNTED, "reason": "Forbidden"})
            raise exc
        return "created"

    return calls, KubeClient(KubeSettings(), configuration=k8s.Configuration()), create


def test_a_create_waits_until_the_quota_is_counted() -> None:
    calls, client, create = _scripted(refusals=2)
    assert client.call_sync("trigger 'web'", create) == "created"
    assert len(calls) == 3


def test_a_quota_never_counted_is_a_503_after_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    import sless_api.backends.kube.quota as quota

    monkeypatch.setattr(quota, "COUNTING_WAIT_SEC", 0.5)
    calls, client, create = _scripted(refusals=10**6)
    with pytest.raises(quota.QuotaBeingCounted) as caught:
        client.call_sync("trigger 'web'", create)
    assert caught.value.status == 503 and "being counted" in caught.value.message
    assert 2 <= len(calls) <= 6  # tried again, with growing pauses, within the bound
