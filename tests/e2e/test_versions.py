"""Versions and rollback through a real `sless up` (standalone backend)."""

from __future__ import annotations

import hashlib

import pytest
import requests

from tests.support.platform import Tenant, make_zip

pytestmark = pytest.mark.e2e

V1 = "import os\n\ndef handle(event):\n    return {'version': 1, 'greeting': os.environ.get('GREETING')}\n"
V2 = "import os\n\ndef handle(event):\n    return {'version': 2, 'greeting': os.environ.get('GREETING')}\n"


def answer(tenant: Tenant) -> dict[str, object]:
    resp = requests.get(tenant.fn_url("ver"), timeout=30)
    assert resp.status_code == 200, resp.text
    body: dict[str, object] = resp.json()
    return body


def code_hash(source: str) -> str:
    return hashlib.sha256(make_zip({"handler.py": source})).hexdigest()


def test_each_deploy_is_a_version_and_rollback_restores_code_and_configuration(tenant: Tenant) -> None:
    tenant.deploy("ver", "python3.11", {"handler.py": V1}, env_vars={"GREETING": "hi"})
    tenant.api("PUT", "/functions/ver", json={"env_vars": {"GREETING": "hello"}}, expect=200)
    tenant.upload("ver", {"handler.py": V2})
    tenant.wait_phase("ver", ("Ready",), code_hash=code_hash(V2))
    assert answer(tenant) == {"version": 2, "greeting": "hello"}

    items = tenant.api("GET", "/functions/ver/versions", expect=200).json()["items"]
    assert [(v["version"], v["code_hash"], v["env_vars"], v["current"]) for v in items] == [
        (3, code_hash(V2), {"GREETING": "hello"}, True),
        (2, code_hash(V1), {"GREETING": "hello"}, False),
        (1, code_hash(V1), {"GREETING": "hi"}, False),
    ]

    # no body: the previous version (v1 code with "hello")
    started = tenant.api("POST", "/functions/ver/rollback", expect=202).json()
    assert started["code_hash"] == code_hash(V1) and "version 2" in started["message"]
    tenant.wait_phase("ver", ("Ready",), code_hash=code_hash(V1))
    assert answer(tenant) == {"version": 1, "greeting": "hello"}

    # an explicit version: code and configuration of version 1
    tenant.api("POST", "/functions/ver/rollback", json={"version": 1}, expect=202)
    tenant.wait_phase("ver", ("Ready",), code_hash=code_hash(V1))
    assert answer(tenant) == {"version": 1, "greeting": "hi"}
    versions = tenant.api("GET", "/functions/ver/versions", expect=200).json()["items"]
    assert [v["version"] for v in versions] == [5, 4, 3, 2, 1] and versions[0]["env_vars"] == {"GREETING": "hi"}


def test_bad_rollbacks_are_refused_with_a_reason(tenant: Tenant) -> None:
    tenant.api("POST", "/functions", json={"name": "ver", "runtime": "python3.11"}, expect=201)
    none = tenant.api("POST", "/functions/ver/rollback", expect=409).json()
    assert "no deployed version" in none["error"]
    assert tenant.api("GET", "/functions/ver/versions", expect=200).json() == {"items": []}
    tenant.upload("ver", {"handler.py": V1})
    tenant.wait_phase("ver", ("Ready",), code_hash=code_hash(V1))
    assert "no earlier version" in tenant.api("POST", "/functions/ver/rollback", expect=409).json()["error"]
    assert "is the one deployed" in tenant.api("POST", "/functions/ver/rollback", json={"version": 1},
                                               expect=409).json()["error"]  # fmt: skip
    assert "no version 7" in tenant.api("POST", "/functions/ver/rollback", json={"version": 7},
                                        expect=404).json()["error"]  # fmt: skip
    for body in ({"version": "1"}, {"version": 0}, {"version": 1, "extra": 1}, [1]):
        err = tenant.api("POST", "/functions/ver/rollback", json=body, expect=400).json()
        assert "error" in err
    malformed = tenant.api("POST", "/functions/ver/rollback", data=b"{not json",
                           headers={"Content-Type": "application/json"}, expect=400).json()  # fmt: skip
    assert "error" in malformed
    tenant.api("POST", "/functions/nope/rollback", expect=404)
    tenant.api("GET", "/functions/nope/versions", expect=404)
    tenant.api("GET", "/functions/Bad_Name/versions", expect=400)


def test_another_tenant_cannot_see_or_roll_back_versions(tenant: Tenant, other_tenant: Tenant) -> None:
    tenant.deploy("ver", "python3.11", {"handler.py": V1})
    other = Tenant(other_tenant.url, other_tenant.sub)
    other.ns = tenant.ns  # the other tenant's token, this tenant's namespace
    other.api("GET", "/functions/ver/versions", expect=403)
    other.api("POST", "/functions/ver/rollback", json={"version": 1}, expect=403)
