"""Tenant secrets in a real Vault (``SLESS_SECRETS_BACKEND=vault``): KV v2 entries written by the API, delivered
to standalone functions, and mirrored into the tenant's Kubernetes Secrets on the kubernetes backend.

Vault is the one tests/install/build-vault.sh builds (dev mode, loopback); every check reads it back with hvac.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import hvac
import pytest

from tests.install import vaultbed
from tests.support.kube_api import start_api
from tests.support.platform import Tenant, running_sless
from tests.support.secret_delivery import READER, REFS, call_until, files_containing
from tests.support.services import S3Endpoint
from tests.support.testbed import Testbed

VALUE = "vault-pw-19ae0c55"
TOKEN = "vault-tok-7b3e2d10"
NEW_VALUE = "vault-pw-new-c04d8e21"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def vault_env(state: Path, prefix: str) -> dict[str, str]:
    addr = vaultbed._state(state)["addr"]
    token = (state / "root-token").read_text().strip()
    return {"SLESS_SECRETS_BACKEND": "vault", "SLESS_VAULT_ADDR": addr, "SLESS_VAULT_TOKEN": token,
            "SLESS_VAULT_PREFIX": prefix}


def entry(client: hvac.Client, path: str) -> tuple[dict[str, str], int]:
    answer = client.secrets.kv.v2.read_secret_version(path=path, mount_point="secret", raise_on_deleted_version=True)
    return answer["data"]["data"], answer["data"]["metadata"]["version"]


@pytest.mark.e2e
def test_standalone_keeps_secrets_in_vault(vault: Path, tmp_path: Path) -> None:
    client = vaultbed.client(vault)
    with running_sless(tmp_path / "data", vault_env(vault, "standalone")) as sp:
        t = Tenant(sp.url, "vault-user")
        t.api("POST", "/ensure", expect=(200, 201))
        created = t.api("POST", "/secrets", json={"name": "db", "data": {"password": VALUE, "token": TOKEN}},
                        expect=201).json()
        assert (created["keys"], created["version"]) == (["password", "token"], 1) and VALUE not in str(created)
        assert entry(client, f"standalone/{t.ns}/db") == ({"password": VALUE, "token": TOKEN}, 1)
        t.api("POST", "/secrets", json={"name": "db", "data": {"a": "b"}}, expect=409)

        t.deploy("reader", "python3.11", {"handler.py": READER}, secrets=REFS)
        call_until(t, "reader", {"env": sha(VALUE), "file": sha(TOKEN)})
        assert t.api("PUT", "/secrets/db", json={"data": {"password": NEW_VALUE, "token": TOKEN}},
                     expect=200).json()["version"] == 2
        assert entry(client, f"standalone/{t.ns}/db")[1] == 2
        call_until(t, "reader", {"env": sha(NEW_VALUE), "file": sha(TOKEN)})

        missing = t.api("POST", "/functions", json={"name": "x", "runtime": "python3.11",
                                                    "secrets": [{"name": "db", "key": "nokey", "env": "K"}]},
                        expect=400).json()
        assert "'nokey'" in missing["error"]
        assert [s["name"] for s in t.api("GET", "/secrets", expect=200).json()["items"]] == ["db"]
        t.api("DELETE", "/functions/reader", expect=204)
        t.api("DELETE", "/secrets/db", expect=204)
        t.api("GET", "/secrets/db", expect=404)
        with pytest.raises(hvac.exceptions.InvalidPath):
            entry(client, f"standalone/{t.ns}/db")
        assert not (sp.data_dir / "secrets.db").exists()  # the local store is not in use
        assert files_containing(sp.data_dir, (VALUE, NEW_VALUE, TOKEN)) == []


@pytest.mark.k8s
def test_kubernetes_mirrors_vault_into_the_tenant_secret(vault: Path, k8s_testbed: Testbed, s3_endpoint: S3Endpoint,
                                                         tmp_path: Path) -> None:
    client = vaultbed.client(vault)
    api = start_api(k8s_testbed, s3_endpoint, tmp_path / "api", extra_env=vault_env(vault, "kube"))
    t = api.tenant("vault")
    try:
        t.api("POST", "/ensure", expect=201)
        t.api("POST", "/secrets", json={"name": "db", "data": {"password": VALUE}}, expect=201)
        assert entry(client, f"kube/{t.ns}/db") == ({"password": VALUE}, 1)
        obj = k8s_testbed.get("secret", "sless-secret-db", "-n", t.ns)
        assert base64.b64decode(obj["data"]["password"]).decode() == VALUE
        assert t.api("PUT", "/secrets/db", json={"data": {"password": NEW_VALUE}}, expect=200).json()["version"] == 2
        obj = k8s_testbed.get("secret", "sless-secret-db", "-n", t.ns)
        assert base64.b64decode(obj["data"]["password"]).decode() == NEW_VALUE
        t.api("DELETE", "/secrets/db", expect=204)
        assert k8s_testbed.get("secret", "sless-secret-db", "-n", t.ns) is None
        with pytest.raises(hvac.exceptions.InvalidPath):
            entry(client, f"kube/{t.ns}/db")
        assert VALUE not in api.log_path.read_text() and NEW_VALUE not in api.log_path.read_text()
    finally:
        api.stop()
        api.gate.close()
        k8s_testbed.kubectl("delete", "namespace", t.ns, "--wait=false", "--ignore-not-found", check=False)
