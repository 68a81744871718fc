"""Tenant secrets on the Kubernetes backend: Secrets in the tenant namespace, written by the real API process
against a real API server, and rolled into function pods by the real operator (kwok runs the pods)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sless_core import crd
from tests.support.kube_api import HELLO, KubeApi, cr, upload_raw, wait_api, zip_hash
from tests.support.kube_operator import Operator, operator_for
from tests.support.platform import Tenant
from tests.support.testbed import Testbed

pytestmark = pytest.mark.k8s

VALUE = "kube-pw-6d2f90aa"
NEW_VALUE = "kube-pw-new-1c77e3b4"
REFS = [{"name": "db", "key": "password", "env": "DB_PASSWORD"}, {"name": "db", "key": "token", "file": "token"}]


def secret_object(bed: Testbed, ns: str, name: str) -> dict[str, Any] | None:
    obj: dict[str, Any] | None = bed.get("secret", f"sless-secret-{name}", "-n", ns)
    return obj


def test_secrets_are_labelled_secrets_in_the_tenant_namespace(kube_api: KubeApi) -> None:
    bed, t = kube_api.bed, kube_api.tenant("sec")
    t.api("POST", "/ensure", expect=201)
    created = t.api("POST", "/secrets", json={"name": "db", "data": {"password": VALUE, "token": "t1"}},
                    expect=201).json()
    assert (created["keys"], created["version"]) == (["password", "token"], 1) and VALUE not in str(created)
    obj = secret_object(bed, t.ns, "db")
    assert obj is not None and obj["type"] == "Opaque"
    assert obj["metadata"]["labels"] == {crd.LABEL_MANAGED: crd.MANAGED_BY, "sless.dev/secret": "db"}
    assert base64.b64decode(obj["data"]["password"]).decode() == VALUE

    # A Secret the platform did not make is neither listed nor reachable by its name.
    bed.kubectl("create", "secret", "generic", "sless-secret-foreign", "--from-literal=k=v", "-n", t.ns)
    assert [s["name"] for s in t.api("GET", "/secrets", expect=200).json()["items"]] == ["db"]
    t.api("GET", "/secrets/foreign", expect=404)

    replaced = t.api("PUT", "/secrets/db", json={"data": {"password": NEW_VALUE, "token": "t2"}}, expect=200).json()
    assert replaced["version"] == 2
    assert base64.b64decode(secret_object(bed, t.ns, "db")["data"]["password"]).decode() == NEW_VALUE  # type: ignore[index]
    for body in (t.api("GET", "/secrets", expect=200).text, t.api("GET", "/secrets/db", expect=200).text):
        assert VALUE not in body and NEW_VALUE not in body

    spec = {"name": "fn", "runtime": "python3.11", "secrets": [{"name": "nope", "key": "k", "env": "K"}]}
    assert "'nope'" in t.api("POST", "/functions", json=spec, expect=400).json()["error"]
    assert cr(bed, crd.FUNCTION_PLURAL, t.ns, "fn") is None
    t.api("POST", "/functions", json={**spec, "secrets": REFS}, expect=201)
    fn = cr(bed, crd.FUNCTION_PLURAL, t.ns, "fn")
    assert fn is not None and fn["spec"]["secrets"] == REFS and len(fn["spec"][crd.SECRETS_VERSION]) == 16
    before = fn["spec"][crd.SECRETS_VERSION]
    t.api("PUT", "/secrets/db", json={"data": {"password": VALUE, "token": "t3"}}, expect=200)
    after = cr(bed, crd.FUNCTION_PLURAL, t.ns, "fn")
    assert after is not None and after["spec"][crd.SECRETS_VERSION] not in ("", before)

    assert t.api("DELETE", "/secrets/db", expect=409).json()["functions"] == ["fn"]
    t.api("DELETE", "/functions/fn", expect=204)
    t.api("DELETE", "/secrets/db", expect=204)
    assert secret_object(bed, t.ns, "db") is None
    assert secret_object(bed, t.ns, "foreign") is not None  # untouched

    other = kube_api.tenant("other")
    resp = other.http.get(f"{kube_api.url}/v1/namespaces/{t.ns}/secrets", timeout=30)
    assert resp.status_code == 403


@pytest.fixture
def served(kube_api: KubeApi, tmp_path: Path) -> Iterator[tuple[Tenant, Operator]]:
    bed: Testbed = kube_api.bed
    t = kube_api.tenant("secop")
    t.api("POST", "/ensure", expect=201)
    with operator_for(bed, t.ns, tmp_path, kube_api.s3.env()) as op:
        yield t, op


@pytest.mark.slow
def test_a_written_secret_rolls_the_functions_pods(kube_api: KubeApi, served: tuple[Tenant, Operator]) -> None:
    t, op = served
    bed = kube_api.bed
    t.api("POST", "/secrets", json={"name": "db", "data": {"password": VALUE, "token": "t1"}}, expect=201)
    t.api("POST", "/functions", json={"name": "hello", "runtime": "python3.11", "secrets": REFS}, expect=201)
    data, _digest = zip_hash(HELLO)
    assert upload_raw(t, "hello", data).status_code == 202
    wait_api(op, "Ready", t, "/functions/hello", lambda b: b["phase"] == "Ready")

    def template() -> dict[str, Any]:
        dep = bed.get("deployment", "hello", "-n", t.ns)
        assert dep is not None
        return dict(dep["spec"]["template"])

    first = template()
    version = first["metadata"]["annotations"][crd.ANNOTATION_SECRETS]
    assert version == cr(bed, crd.FUNCTION_PLURAL, t.ns, "hello")["spec"][crd.SECRETS_VERSION]  # type: ignore[index]
    pod = first["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["DB_PASSWORD"]["valueFrom"] == {"secretKeyRef": {"name": "sless-secret-db", "key": "password"}}
    assert env["SLESS_SECRETS_DIR"]["value"] == "/run/sless/secrets"
    volume = next(v for v in pod["volumes"] if v["name"] == "secrets")
    assert volume["projected"]["sources"] == [{"secret": {"name": "sless-secret-db",
                                                          "items": [{"key": "token", "path": "token"}]}}]
    assert VALUE not in json.dumps(first)

    t.api("PUT", "/secrets/db", json={"data": {"password": NEW_VALUE, "token": "t2"}}, expect=200)
    op.wait("pod template carries the new secrets version",
            lambda: template()["metadata"]["annotations"].get(crd.ANNOTATION_SECRETS) not in (None, version))
    assert NEW_VALUE not in json.dumps(bed.get("deployment", "hello", "-n", t.ns))
    assert NEW_VALUE not in op.log_path.read_text(errors="replace") and NEW_VALUE not in kube_api.log_path.read_text()
