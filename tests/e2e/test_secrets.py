"""Tenant secrets through a real `sless up`: write-only values, references checked, delivery as env vars and
files, restarts on change, and no value anywhere it must not be (responses, logs, records, the data dir)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.platform import SlessProcess, Tenant, running_sless
from tests.support.secret_delivery import READER, REFS, call_until, files_containing

pytestmark = pytest.mark.e2e

VALUE = "pw-4c1d9e7a-plaintext"
TOKEN = "tok-88f2b6d0-plaintext"
NEW_VALUE = "pw-new-0b5e3f19-plaintext"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def make_secret(tenant: Tenant, name: str = "db", **data: str) -> dict[str, Any]:
    tenant.api("POST", "/ensure", expect=(200, 201))
    body = tenant.api("POST", "/secrets", json={"name": name, "data": data or {"password": VALUE, "token": TOKEN}},
                      expect=201).json()
    return dict(body)


def test_values_are_write_only(tenant: Tenant) -> None:
    created = make_secret(tenant)
    assert created["name"] == "db" and created["keys"] == ["password", "token"] and created["version"] == 1
    for body in (created, tenant.api("GET", "/secrets/db", expect=200).json(),
                 tenant.api("GET", "/secrets", expect=200).json()):
        assert VALUE not in str(body) and TOKEN not in str(body), body
    listed = tenant.api("GET", "/secrets", expect=200).json()
    assert [(s["name"], s["keys"], s["version"]) for s in listed["items"]] == [("db", ["password", "token"], 1)]

    replaced = tenant.api("PUT", "/secrets/db", json={"data": {"password": NEW_VALUE}}, expect=200).json()
    assert replaced["keys"] == ["password"] and replaced["version"] == 2 and NEW_VALUE not in str(replaced)
    dup = tenant.api("POST", "/secrets", json={"name": "db", "data": {"a": "b"}}, expect=409).json()
    assert "already exists" in dup["error"]
    tenant.api("DELETE", "/secrets/db", expect=204)
    tenant.api("GET", "/secrets/db", expect=404)
    tenant.api("DELETE", "/secrets/db", expect=404)
    tenant.api("PUT", "/secrets/db", json={"data": {"a": "b"}}, expect=404)
    again = make_secret(tenant)
    assert again["version"] == 1


def test_references_to_missing_secrets_or_keys_are_refused(tenant: Tenant, other_tenant: Tenant) -> None:
    tenant.api("POST", "/ensure", expect=(200, 201))
    spec = {"name": "needs", "runtime": "python3.11", "secrets": REFS}
    missing = tenant.api("POST", "/functions", json=spec, expect=400).json()
    assert missing["field"] == "secrets" and "'db'" in missing["error"] and "does not exist" in missing["error"]
    make_secret(tenant, password=VALUE)
    no_key = tenant.api("POST", "/functions", json=spec, expect=400).json()
    assert "no key 'token'" in no_key["error"]
    tenant.api("GET", "/functions/needs", expect=404)

    tenant.api("POST", "/functions", json={"name": "plain", "runtime": "python3.11"}, expect=201)
    bad = tenant.api("PUT", "/functions/plain", json={"secrets": [{"name": "nope", "key": "k", "env": "K"}]},
                     expect=400).json()
    assert "'nope'" in bad["error"]
    assert tenant.api("GET", "/functions/plain", expect=200).json()["secrets"] == []

    # Another tenant's secret of the same name is not this tenant's.
    other_tenant.api("POST", "/ensure", expect=(200, 201))
    other_tenant.api("POST", "/functions", json={"name": "steal", "runtime": "python3.11",
                                                 "secrets": [{"name": "db", "key": "password", "env": "X"}]},
                     expect=400)
    assert other_tenant.api("GET", "/secrets", expect=200).json()["items"] == []


def test_delivery_restart_and_no_leaks(sless: SlessProcess, tenant: Tenant) -> None:
    make_secret(tenant)
    tenant.deploy("reader", "python3.11", {"handler.py": READER}, secrets=REFS)
    call_until(tenant, "reader", {"env": sha(VALUE), "file": sha(TOKEN)})

    # A used secret cannot be deleted, nor lose a used key; a change restarts the function with new values.
    used = tenant.api("DELETE", "/secrets/db", expect=409).json()
    assert used["functions"] == ["reader"]
    dropped = tenant.api("PUT", "/secrets/db", json={"data": {"password": NEW_VALUE}}, expect=400).json()
    assert "'token'" in dropped["error"] and "reader" in dropped["error"] and NEW_VALUE not in str(dropped)
    tenant.api("PUT", "/secrets/db", json={"data": {"password": NEW_VALUE, "token": TOKEN}}, expect=200)
    call_until(tenant, "reader", {"env": sha(NEW_VALUE), "file": sha(TOKEN)})

    # A job receives them too.
    tenant.api("POST", "/jobs", json={"name": "once", "function": "reader"}, expect=201)
    job = tenant.wait_job("once")
    assert job["phase"] == "Succeeded" and sha(NEW_VALUE) in job["message"], job

    # Nothing the API answers, and nothing the platform wrote to disk, holds a value in plain text.
    answers = [tenant.api("GET", path, expect=200).text for path in
               ("/functions/reader", "/functions/reader/source", "/functions/reader/invocations", "/secrets",
                "/secrets/db", "/jobs/once")]
    for text in answers:
        for value in (VALUE, NEW_VALUE, TOKEN):
            assert value not in text, text[:300]
    assert "/run/sless/secrets" not in answers[1]
    leaks = files_containing(sless.data_dir, (VALUE, NEW_VALUE, TOKEN))
    assert leaks == [], f"plain-text secret values on disk: {leaks}"
    tenant.api("DELETE", "/functions/reader", expect=204)
    tenant.api("DELETE", "/secrets/db", expect=204)


def test_key_file_and_database_are_private(sless: SlessProcess, tenant: Tenant) -> None:
    make_secret(tenant)
    key, db = sless.data_dir / "secrets.key", sless.data_dir / "secrets.db"
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == 32
    assert db.stat().st_mode & 0o777 == 0o600


BAD_BODIES: list[tuple[str, Any, str]] = [
    ("uppercase name", {"name": "DB", "data": {"a": "b"}}, "name"),
    ("name too long", {"name": "a" * 41, "data": {"a": "b"}}, "name"),
    ("path in name", {"name": "../etc", "data": {"a": "b"}}, "name"),
    ("name not a string", {"name": 7, "data": {"a": "b"}}, "name"),
    ("no data", {"name": "s"}, "data"),
    ("empty data", {"name": "s", "data": {}}, "data"),
    ("data a list", {"name": "s", "data": ["a"]}, "data"),
    ("integer value", {"name": "s", "data": {"a": 1}}, "data"),
    ("null value", {"name": "s", "data": {"a": None}}, "data"),
    ("object value", {"name": "s", "data": {"a": {"b": "c"}}}, "data"),
    ("slash in key", {"name": "s", "data": {"a/b": "c"}}, "data"),
    ("dot key", {"name": "s", "data": {"..": "c"}}, "data"),
    ("empty key", {"name": "s", "data": {"": "c"}}, "data"),
    ("NUL in value", {"name": "s", "data": {"a": "x\x00y"}}, "data"),
    ("value too large", {"name": "s", "data": {"a": "v" * (32 * 1024 + 1)}}, "data"),
    ("too many keys", {"name": "s", "data": {f"k{i}": "v" for i in range(65)}}, "data"),
    ("secret too large", {"name": "s", "data": {f"k{i}": "v" * 30000 for i in range(10)}}, "data"),
    ("unknown field", {"name": "s", "data": {"a": "b"}, "value": "x"}, "value"),
    ("not an object", ["s"], ""),
]


@pytest.mark.parametrize(("label", "body", "field"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_secret_bodies_are_refused(tenant: Tenant, label: str, body: Any, field: str) -> None:
    tenant.api("POST", "/ensure", expect=(200, 201))
    answer = tenant.api("POST", "/secrets", json=body, expect=400).json()
    assert answer.get("field", "") == field, answer
    assert "v" * 100 not in answer["error"] and "x\x00y" not in answer["error"]
    assert tenant.api("GET", "/secrets", expect=200).json()["items"] == []


def test_bad_requests_on_secret_paths(tenant: Tenant, other_tenant: Tenant) -> None:
    make_secret(tenant, "kept", a=VALUE)
    malformed = tenant.api("POST", "/secrets", data=b'{"name": "x", "data": {', expect=400,
                           headers={"Content-Type": "application/json"}).json()
    assert "not valid JSON" in malformed["error"]
    tenant.api("POST", "/secrets", data=b"name=x", expect=415, headers={"Content-Type": "text/plain"})
    mismatch = tenant.api("PUT", "/secrets/kept", json={"name": "other", "data": {"a": "b"}}, expect=400).json()
    assert mismatch["field"] == "name"
    bad_put = tenant.api("PUT", "/secrets/kept", json={"data": {"a": 5}}, expect=400).json()
    assert VALUE not in str(bad_put)
    tenant.api("GET", "/secrets/Bad_Name", expect=400)
    tenant.api("DELETE", "/secrets/" + "a" * 41, expect=400)
    # Another tenant reaches none of it, by any method.
    for method, rest, kw in (("GET", "/secrets", {}), ("GET", "/secrets/kept", {}),
                             ("POST", "/secrets", {"json": {"name": "x", "data": {"a": "b"}}}),
                             ("PUT", "/secrets/kept", {"json": {"data": {"a": "stolen"}}}),
                             ("DELETE", "/secrets/kept", {})):
        resp = other_tenant.http.request(method, f"{tenant.url}/v1/namespaces/{tenant.ns}{rest}", timeout=30, **kw)
        assert resp.status_code == 403, (method, rest, resp.text)
    anonymous = requests.get(f"{tenant.url}/v1/namespaces/{tenant.ns}/secrets", timeout=30)
    assert anonymous.status_code == 401
    assert tenant.api("GET", "/secrets/kept", expect=200).json()["version"] == 1


def test_single_tenant_platform_delivers_files_too(tmp_path: Path) -> None:
    """Without a sandbox (SLESS_SANDBOX=off) the files are in a private folder the function is told of."""
    with running_sless(tmp_path / "data", {"SLESS_SANDBOX": "off"}) as sp:
        tenant = Tenant(sp.url, "single")
        make_secret(tenant)
        tenant.deploy("reader", "python3.11", {"handler.py": READER}, secrets=REFS)
        call_until(tenant, "reader", {"env": sha(VALUE), "file": sha(TOKEN)})
        assert files_containing(sp.data_dir, (VALUE, TOKEN)) == []
