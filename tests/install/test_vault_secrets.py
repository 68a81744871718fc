"""The vault_secrets role against a real Vault server and the Kubernetes test bed.

Vault is HashiCorp Vault built from its Go module (tests/install/build-vault.sh), in dev mode on
loopback; the role runs through ansible-playbook exactly as playbooks/install.yml runs it.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.install import vaultbed
from tests.support.testbed import Testbed

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = """\
- name: vault_secrets
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: vault_secrets
  post_tasks:
    - name: Expose what later roles would read
      ansible.builtin.copy:
        content: "{{ vault_secrets_values | to_json }}"
        dest: "{{ values_file }}"
        mode: "0600"
      changed_when: false  # the test's own probe, not the role
"""

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def run_role(bed: Testbed, vault: Path, work: Path, **extra: Any) -> tuple[subprocess.CompletedProcess[str], Any]:
    work.mkdir(parents=True, exist_ok=True)
    (work / "play.yml").write_text(PLAYBOOK)
    values_file = work / "values.json"
    info = json.loads((vault / "vault.json").read_text())
    extra_vars = {"vault_secrets_url": info["addr"], "values_file": str(values_file), **extra}
    env = {**bed.env, "K8S_AUTH_KUBECONFIG": str(bed.kubeconfig), "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".ansible/collections"),
           "ANSIBLE_NOCOLOR": "1"}  # fmt: skip
    env.pop("VAULT_TOKEN", None)
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(work / "play.yml"),
            "-e", json.dumps(extra_vars), "-e", f"ansible_python_interpreter={sys.executable}"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False, cwd=ROOT)
    values = json.loads(values_file.read_text()) if values_file.exists() else None
    return proc, values


def secret(bed: Testbed, namespace: str, name: str) -> dict[str, str]:
    obj = bed.get("secret", name, "-n", namespace)
    assert obj is not None, f"Secret {namespace}/{name} missing"
    return {k: base64.b64decode(v).decode() for k, v in obj["data"].items()}


def recap(proc: subprocess.CompletedProcess[str]) -> str:
    return (proc.stdout + proc.stderr)[-3000:]


def changed(proc: subprocess.CompletedProcess[str]) -> int:
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("localhost") and "changed=" in ln)
    return int(line.split("changed=")[1].split()[0])


def test_token_auth_writes_every_secret_and_a_second_run_changes_nothing(
    k8s_testbed: Testbed, vault: Path, tmp_path: Path
) -> None:
    entries = vaultbed.platform_entries(15432, 5673)
    vaultbed.seed(vault, entries, prefix="tok")
    token = (vault / "root-token").read_text().strip()
    ns, build = "vs-token", "vs-token-build"
    args = {"vault_secrets_token": token, "vault_secrets_kv_prefix": "tok", "vault_secrets_namespace": ns,
            "vault_secrets_build_namespace": build}  # fmt: skip
    proc, values = run_role(k8s_testbed, vault, tmp_path / "one", **args)
    assert proc.returncode == 0, recap(proc)
    assert secret(k8s_testbed, ns, "sless-jwt") == {"secret": entries["jwt"]["secret"]}
    assert secret(k8s_testbed, ns, "sless-database") == {"url": entries["database"]["url"]}
    assert secret(k8s_testbed, ns, "sless-s3") == {"access-key": entries["s3"]["access_key"],
                                                    "secret-key": entries["s3"]["secret_key"]}  # fmt: skip
    assert secret(k8s_testbed, ns, "sless-rabbitmq") == {"url": entries["rabbitmq"]["url"]}
    build_s3 = {"AWS_ACCESS_KEY_ID": entries["s3"]["access_key"], "AWS_SECRET_ACCESS_KEY": entries["s3"]["secret_key"]}
    assert secret(k8s_testbed, build, "sless-build-s3") == build_s3
    registry = k8s_testbed.get("secret", "sless-registry", "-n", build)
    assert registry["type"] == "kubernetes.io/dockerconfigjson"
    assert values["database"]["url"] == entries["database"]["url"]
    # no secret value in the output, even with the values flowing through every task
    for entry in entries.values():
        for value in entry.values():
            assert value not in proc.stdout + proc.stderr
    again, _ = run_role(k8s_testbed, vault, tmp_path / "two", **args)
    assert again.returncode == 0, recap(again)
    assert changed(again) == 0, recap(again)


def test_a_changed_value_in_vault_is_written_on_the_next_run(k8s_testbed: Testbed, vault: Path, tmp_path: Path) -> None:
    entries = vaultbed.platform_entries(15432, 5673)
    vaultbed.seed(vault, entries, prefix="rot")
    token = (vault / "root-token").read_text().strip()
    args = {"vault_secrets_token": token, "vault_secrets_kv_prefix": "rot", "vault_secrets_namespace": "vs-rot",
            "vault_secrets_build_namespace": "vs-rot-build"}  # fmt: skip
    assert run_role(k8s_testbed, vault, tmp_path / "one", **args)[0].returncode == 0
    entries["jwt"]["secret"] = "rotated-" + entries["jwt"]["secret"]
    vaultbed.seed(vault, {"jwt": entries["jwt"]}, prefix="rot")
    proc, _ = run_role(k8s_testbed, vault, tmp_path / "two", **args)
    assert proc.returncode == 0, recap(proc)
    assert changed(proc) >= 1
    assert secret(k8s_testbed, "vs-rot", "sless-jwt") == {"secret": entries["jwt"]["secret"]}


def test_a_missing_entry_fails_before_writing_and_says_which(k8s_testbed: Testbed, vault: Path, tmp_path: Path) -> None:
    entries = vaultbed.platform_entries(15432, 5673)
    del entries["rabbitmq"]
    entries["s3"].pop("secret_key")
    vaultbed.seed(vault, entries, prefix="gap")
    token = (vault / "root-token").read_text().strip()
    proc, _ = run_role(k8s_testbed, vault, tmp_path, vault_secrets_token=token, vault_secrets_kv_prefix="gap",
                       vault_secrets_namespace="vs-gap", vault_secrets_build_namespace="vs-gap-build")  # fmt: skip
    assert proc.returncode != 0
    assert "s3:secret_key" in proc.stdout or "rabbitmq" in proc.stdout, recap(proc)
    assert k8s_testbed.get("secret", "sless-jwt", "-n", "vs-gap") is None


def test_a_wrong_token_is_refused(k8s_testbed: Testbed, vault: Path, tmp_path: Path) -> None:
    proc, _ = run_role(k8s_testbed, vault, tmp_path, vault_secrets_token="hvs.not-a-token",
                       vault_secrets_namespace="vs-bad", vault_secrets_build_namespace="vs-bad-build")  # fmt: skip
    assert proc.returncode != 0
    assert k8s_testbed.get("namespace", "vs-bad") is None


def test_kubernetes_auth_with_a_service_account_token(k8s_testbed: Testbed, vault: Path, tmp_path: Path) -> None:
    entries = vaultbed.platform_entries(15432, 5673)
    vaultbed.seed(vault, entries)  # the default prefix: the role sless-installer may read secret/sless/*
    kubectl = str(Path(k8s_testbed.bin_dir or "") / "kubectl") if k8s_testbed.bin_dir else "kubectl"
    jwt_file = vaultbed.kubernetes_auth(vault, k8s_testbed.kubeconfig, kubectl)
    args = {"vault_secrets_auth_method": "kubernetes", "vault_secrets_kubernetes_jwt_file": str(jwt_file),
            "vault_secrets_namespace": "vs-k8s", "vault_secrets_build_namespace": "vs-k8s-build"}  # fmt: skip
    proc, values = run_role(k8s_testbed, vault, tmp_path / "ok", **args)
    assert proc.returncode == 0, recap(proc)
    assert secret(k8s_testbed, "vs-k8s", "sless-jwt") == {"secret": entries["jwt"]["secret"]}
    assert values["rabbitmq"]["url"] == entries["rabbitmq"]["url"]
    # the same token for a role that does not bind this service account: Vault says no
    denied, _ = run_role(k8s_testbed, vault, tmp_path / "denied", vault_secrets_kubernetes_role="nobody", **args)
    assert denied.returncode != 0
    # a token that is not the cluster's: TokenReview fails
    forged = tmp_path / "forged.jwt"
    forged.write_text(os.urandom(16).hex())
    bad, _ = run_role(
        k8s_testbed, vault, tmp_path / "forged", **{**args, "vault_secrets_kubernetes_jwt_file": str(forged)}
    )
    assert bad.returncode != 0
