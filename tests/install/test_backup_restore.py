"""Backup and restore (playbooks/backup.yml, playbooks/restore.yml, role sless_backup) against real servers: a kwok
test bed of this module's own, a real Vault, a real S3 server (moto) and a real PostgreSQL.

The end-to-end test fills every part (tenant namespaces, Functions with a version history, Triggers owned by them, a
finished FunctionJob, the tenants' Secrets, Vault entries, S3 objects, database rows), backs up with ansible-playbook,
deletes all of it, restores with ansible-playbook and compares; an operator Deployment of the release is stopped for
the restore and started again. Refusals (a truncated manifest, a tampered or extra file, a missing folder, names that
would leave the folder or the tenant's space) go through the playbook once and through the role's modules directly.
The bed is this module's: restoring namespaces on the session's shared bed would meet other tests' namespaces.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import secrets
import shutil
import stat
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hvac
import pytest
import yaml
from minio import Minio

from sless_core.crd import tenant_namespace_labels
from tests.install import vaultbed
from tests.support.services import S3Endpoint, fresh_pg_database, sql
from tests.support.testbed import Testbed, start_testbed, stop_testbed

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "sless_backup"
RELEASE, PLATFORM_NS = "sless", "sless-system"
GROUP = "sless.dev/v1alpha1"
H = "0123456789abcdef"
CODE = {"a": "a" * 64, "b": "b" * 64, "c": "c" * 64}
#: What the API server and kubectl add themselves (not restored: the restore's objects are new ones).
APPLIED = ("kubernetes.io/metadata.name", "kubectl.kubernetes.io/last-applied-configuration")


# -- the role's modules, loaded as Ansible would run them (their module_utils under ansible.module_utils)


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


files_utils = _load("ansible.module_utils.sless_backup_files", ROLE / "module_utils" / "sless_backup_files.py")
manifest_mod = _load("sless_backup_manifest", ROLE / "library" / "sless_backup_manifest.py")
resources_mod = _load("sless_backup_resources", ROLE / "library" / "sless_backup_resources.py")
s3_mod = _load("sless_backup_s3", ROLE / "library" / "sless_backup_s3.py")
vault_mod = _load("sless_backup_vault", ROLE / "library" / "sless_backup_vault.py")
database_mod = _load("sless_backup_database", ROLE / "library" / "sless_backup_database.py")
BackupError = files_utils.BackupError


# -- the role's shape (the rules tests/install/test_roles.py holds the other roles to)


def test_role_defaults_and_argument_specs_agree() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    assert set(specs) == {"backup", "verify", "restore"}
    for entry, spec in specs.items():
        assert (ROLE / "tasks" / f"{entry}.yml").is_file()
        assert set(spec["options"]) == set(defaults), entry
        for name, option in spec["options"].items():
            assert option["default"] == defaults[name] and option.get("description") and option.get("type"), name
            assert name.startswith("sless_backup_")
    for name in ("sless_backup_s3_access_key", "sless_backup_s3_secret_key", "sless_backup_vault_token",
                 "sless_backup_database_url"):  # fmt: skip
        assert specs["backup"]["options"][name]["no_log"] is True
    lines = (ROLE / "defaults" / "main.yml").read_text().splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith((" ", "#", "-")) and ":" in line:
            above = [ln for ln in lines[:i] if ln.strip()][-1]
            assert above.startswith("#") or not above.startswith((" ", "#")), f"{line.split(':')[0]} has no comment"


def test_secret_values_never_reach_the_output() -> None:
    """Every option of the modules that carries a secret is no_log, so Ansible masks it in every result."""
    for module, names in ((s3_mod, ("access_key", "secret_key")), (vault_mod, ("token",))):
        text = (ROLE / "library" / f"{module.__name__}.py").read_text()
        for name in names:
            assert f'"{name}": {{"type": "str", "required": True, "no_log": True}}' in text
    assert '"dsn": {"type": "str", "required": True, "no_log": True}' in (
        ROLE / "library" / "sless_backup_database.py").read_text()


# -- refusals through the modules (no server needed)


def sealed_backup(tmp_path: Path) -> Path:
    partial = tmp_path / ".sless-backup-x.partial"
    files_utils.write_json(partial / "kubernetes" / "namespaces.json", {"namespaces": []})
    files_utils.write_json(partial / "kubernetes" / "resources.json", {"Function": [], "Trigger": [],
                                                                       "FunctionJob": []})  # fmt: skip
    files_utils.write_json(partial / "kubernetes" / "secrets.json", {"secrets": []})
    with files_utils.open_private(partial / "s3" / "objects" / "code" / "x.tar.gz") as out:
        out.write(b"code bytes")
    files_utils.write_json(partial / "s3" / "index.json", {"bucket": "b", "objects": [
        {"key": "code/x.tar.gz", "size": 10, "sha256": files_utils.sha256_bytes(b"code bytes"),
         "content_type": "application/gzip"}]})  # fmt: skip
    dest = tmp_path / "sless-backup-x"
    manifest_mod.seal(partial, dest, {"kubernetes": {}}, {})
    assert not partial.exists()
    return dest


def test_a_sealed_backup_is_private_and_verifies(tmp_path: Path) -> None:
    backup = sealed_backup(tmp_path)
    manifest = manifest_mod.verify(backup)
    assert manifest["complete"] is True and manifest["info"]["platform_version"]
    assert sorted(manifest["files"]) == ["kubernetes/namespaces.json", "kubernetes/resources.json",
                                         "kubernetes/secrets.json", "s3/index.json", "s3/objects/code/x.tar.gz"]
    for path in [backup, *backup.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    assert [e["key"] for e in s3_mod.checked(backup / "s3")] == ["code/x.tar.gz"]


@pytest.mark.parametrize("damage", ["truncated", "incomplete", "missing-manifest", "tampered", "extra", "missing-file",
                                    "escaping-name"])  # fmt: skip
def test_a_damaged_backup_is_refused(tmp_path: Path, damage: str) -> None:
    backup = sealed_backup(tmp_path)
    manifest = backup / "manifest.json"
    text = manifest.read_text()
    if damage == "truncated":
        manifest.write_text(text[: len(text) // 2])
    elif damage == "incomplete":
        manifest.write_text(json.dumps({**json.loads(text), "complete": False}))
    elif damage == "missing-manifest":
        manifest.unlink()
    elif damage == "tampered":
        (backup / "s3" / "objects" / "code" / "x.tar.gz").write_bytes(b"code bytez")
    elif damage == "extra":
        (backup / "kubernetes" / "more.json").write_text("{}")
    elif damage == "missing-file":
        (backup / "kubernetes" / "secrets.json").unlink()
    elif damage == "escaping-name":
        data = json.loads(text)
        data["files"]["../outside"] = {"sha256": "0" * 64, "size": 0}
        manifest.write_text(json.dumps(data))
    with pytest.raises(BackupError) as failed:
        manifest_mod.verify(backup)
    said = str(failed.value)
    expected = {"truncated": "not complete JSON", "incomplete": "not a complete", "missing-manifest": "is missing",
                "tampered": "x.tar.gz (size or checksum differs)", "extra": "more.json (not in the manifest)",
                "missing-file": "secrets.json (missing)", "escaping-name": "'..'"}  # fmt: skip
    assert expected[damage] in said, said


def test_a_missing_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BackupError, match="not a folder"):
        manifest_mod.verify(tmp_path / "sless-backup-none")


@pytest.mark.parametrize("key", ["../etc/passwd", "/abs", "a/../../b", "a/.hidden", "a\\b", "a/\x00b", "a//b", "dir/"])
def test_object_keys_that_could_leave_the_folder_are_refused(tmp_path: Path, key: str) -> None:
    (tmp_path / "objects").mkdir()
    files_utils.write_json(tmp_path / "index.json", {"objects": [{"key": key, "size": 0, "sha256": ""}]})
    with pytest.raises(BackupError):
        s3_mod.checked(tmp_path)


@pytest.mark.parametrize("entry", [
    {"namespace": "kube-system", "name": "db", "data": {}},
    {"namespace": "../sless-0123456789abcdef", "name": "db", "data": {}},
    {"namespace": f"sless-{H}", "name": "../db", "data": {}},
    {"namespace": f"sless-{H}", "name": "db", "data": {"k": 1}},
])  # fmt: skip
def test_vault_entries_outside_a_tenant_s_space_are_refused(tmp_path: Path, entry: dict[str, Any]) -> None:
    files_utils.write_json(tmp_path / "secrets.json", {"entries": [entry]})
    with pytest.raises(BackupError):
        vault_mod.checked(tmp_path)


def _kube_files(folder: Path, namespaces: list[Any], resources: dict[str, Any], secrets_: list[Any]) -> None:
    files_utils.write_json(folder / "namespaces.json", {"namespaces": namespaces})
    files_utils.write_json(folder / "resources.json", resources)
    files_utils.write_json(folder / "secrets.json", {"secrets": secrets_})


def _fn(namespace: str, name: str, kind: str = "Function") -> dict[str, Any]:
    return {"apiVersion": GROUP, "kind": kind, "metadata": {"namespace": namespace, "name": name},
            "spec": {"runtime": "python3.11"}, "status": {}}  # fmt: skip


@pytest.mark.parametrize("case", ["namespace", "resource-namespace", "name", "kind", "secret-name", "foreign-ns"])
def test_kubernetes_objects_outside_a_tenant_s_space_are_refused(tmp_path: Path, case: str) -> None:
    ns = {"name": f"sless-{H}", "labels": {}, "annotations": {}}
    resources: dict[str, Any] = {"Function": [], "Trigger": [], "FunctionJob": []}
    secret = {"namespace": f"sless-{H}", "name": "sless-secret-db", "type": "Opaque",
              "labels": {"sless.dev/secret": "db"}, "annotations": {}, "data": {}}  # fmt: skip
    namespaces, secrets_ = [ns], [secret]
    if case == "namespace":
        namespaces = [{**ns, "name": "kube-system"}]
    elif case == "resource-namespace":
        resources["Function"] = [_fn("default", "f")]
    elif case == "name":
        resources["Function"] = [_fn(f"sless-{H}", "../f")]
    elif case == "kind":
        resources["Pod"] = [_fn(f"sless-{H}", "f", "Pod")]
    elif case == "secret-name":
        secrets_ = [{**secret, "name": "sless-code-f"}]
    elif case == "foreign-ns":
        resources["Function"] = [_fn(f"sless-{'f' * 16}", "f")]
    _kube_files(tmp_path, namespaces, resources, secrets_)
    with pytest.raises(BackupError):
        resources_mod.checked(tmp_path)


# -- the S3 and database parts alone, through the modules' functions, against the session's servers


@pytest.mark.s3
def test_s3_objects_round_trip(s3_endpoint: S3Endpoint, tmp_path: Path) -> None:
    import io

    client = Minio(s3_endpoint.endpoint, access_key=s3_endpoint.access_key, secret_key=s3_endpoint.secret_key,
                   secure=False)  # fmt: skip
    bucket = f"part-{secrets.token_hex(4)}"
    client.make_bucket(bucket)
    objects = {"code/sless-0123456789abcdef/f/1.tar.gz": secrets.token_bytes(300_000), "a/b/c": b"", "x": b"x"}
    for key, data in objects.items():
        client.put_object(bucket, key, io.BytesIO(data), len(data))
    s3 = s3_mod.client(f"http://{s3_endpoint.endpoint}", s3_endpoint.access_key, s3_endpoint.secret_key, "")
    assert s3_mod.save(s3, bucket, tmp_path / "s3") == (3, 300_001)
    for key in objects:
        client.remove_object(bucket, key)
    client.remove_bucket(bucket)
    entries = s3_mod.checked(tmp_path / "s3")
    assert s3_mod.restore(s3, bucket, entries) == (3, 300_001)
    assert s3_mod.restore(s3, bucket, entries) == (0, 0)  # the same bytes there: nothing written
    for key, data in objects.items():
        response = client.get_object(bucket, key)
        assert response.read() == data, key
        response.close()
        response.release_conn()


@pytest.mark.pg
def test_database_round_trip(pg_url: str, tmp_path: Path) -> None:
    url = fresh_pg_database(pg_url)
    sql(url, "CREATE TABLE calls (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, body BYTEA, note TEXT)")
    sql(url, "INSERT INTO calls (body, note) VALUES (%s, %s), (%s, NULL)", b"\x00\xff", "quote ' and \n", b"")
    env, name = database_mod.environment(url)
    assert name == url.rsplit("/", 1)[1] and env["PGHOST"] == "127.0.0.1"
    dump = tmp_path / "database" / "sless.dump"
    assert database_mod.save(dump, env, "pg_dump", "pg_restore") > 0
    assert stat.S_IMODE(dump.stat().st_mode) == 0o600
    sql(url, "DROP TABLE calls")
    database_mod.restore(dump, env, name, "pg_restore")
    database_mod.restore(dump, env, name, "pg_restore")  # again, over the restored tables
    rows = [(i, bytes(body), note) for i, body, note in sql(url, "SELECT id, body, note FROM calls ORDER BY id")]
    assert rows == [(1, b"\x00\xff", "quote ' and \n"), (2, b"", None)]
    with pytest.raises(BackupError, match=r"does not parse|names no database"):
        database_mod.environment("postgresql://u:secret-pw@h:5432")


# -- end to end: the playbooks on a bed of this module's own, with Vault, S3 and PostgreSQL


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    try:
        own = start_testbed(tmp_path_factory.mktemp("backup-bed") / "state")
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        if own.existing:
            pytest.skip("deletes and restores tenant namespaces: not on a cluster that is not the test's own")
        yield own
    finally:
        stop_testbed(own)


class World:
    """What the tests fill, delete and compare: names and the servers' handles."""

    def __init__(self, bed: Testbed, vault: Path, s3: S3Endpoint, db_url: str, work: Path) -> None:
        self.bed, self.vault_dir, self.s3, self.db_url, self.work = bed, vault, s3, db_url, work
        self.vault = vaultbed.client(vault)
        self.addr = vaultbed._state(vault)["addr"]
        self.token = (vault / "root-token").read_text().strip()
        self.bucket = f"backup-{secrets.token_hex(4)}"
        self.prefix = f"tenants-{secrets.token_hex(4)}"
        self.namespaces = [f"sless-{secrets.token_hex(8)}" for _ in range(2)]
        self.minio = Minio(s3.endpoint, access_key=s3.access_key, secret_key=s3.secret_key, secure=False)
        self.backups = work / "backups"

    # the platform's entries the playbooks read first (vault_secrets' fetch): the database and S3 among them
    def seed_platform(self) -> None:
        vaultbed.seed(self.vault_dir, {
            "jwt": {"secret": secrets.token_urlsafe(32)}, "database": {"url": self.db_url},
            "s3": {"access_key": self.s3.access_key, "secret_key": self.s3.secret_key},
            "rabbitmq": {"url": "amqp://sless:x@127.0.0.1:5672/sless"}})  # fmt: skip

    def playbook(self, name: str, **extra: Any) -> subprocess.CompletedProcess[str]:
        inventory = self.work / "hosts.yml"
        inventory.write_text(yaml.safe_dump({"all": {"children": {"sless_controller": {"hosts": {"localhost": {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}}}))  # fmt: skip
        extra_vars = {"sless_backup_dir": str(self.backups), "vault_secrets_url": self.addr,
                      "sless_values": {"s3": {"endpoint": self.s3.endpoint, "bucket": self.bucket}},
                      "sless_backup_vault_prefix": self.prefix, "sless_backup_chart_path": str(ROOT / "charts/sless"),
                      "sless_cluster_environment": {"K8S_AUTH_KUBECONFIG": str(self.bed.kubeconfig)}, **extra}
        env = {**self.bed.env, "K8S_AUTH_KUBECONFIG": str(self.bed.kubeconfig), "VAULT_TOKEN": self.token,
               "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
               "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".ansible/collections"), "ANSIBLE_NOCOLOR": "1"}
        argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
                str(ROOT / "playbooks" / name), "-e", json.dumps(extra_vars)]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False, cwd=ROOT)

    # -- Kubernetes

    def cr(self, kind: str, namespace: str, name: str) -> Any:
        return self.bed.get(f"{kind.lower()}s.sless.dev", name, "-n", namespace)

    def set_status(self, kind: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.bed.kubectl("patch", f"{kind.lower()}s.sless.dev", name, "-n", namespace, "--subresource=status",
                         "--type=merge", "-p", json.dumps({"status": status}))  # fmt: skip

    def fill_kubernetes(self) -> None:
        self.bed.kubectl("apply", "--server-side", "-f", str(ROOT / "charts/sless/crds"))
        self.bed.wait_established("functions.sless.dev", "triggers.sless.dev", "functionjobs.sless.dev")
        for i, ns in enumerate(self.namespaces):
            self.bed.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {
                "name": ns, "labels": tenant_namespace_labels(), "annotations": {"example.com/owner": f"team-{i}"}}})
        ns = self.namespaces[0]
        spec = {"runtime": "python3.11", "memoryMb": 256, "timeoutSec": 30, "replicas": 1,
                "envVars": {"GREETING": "hi"}, "secrets": [{"name": "db", "key": "password", "env": "DB_PASSWORD"}],
                "codeHash": CODE["c"]}  # fmt: skip
        versions = [{"version": n, "codeHash": CODE[c], "deployedAt": f"2026-01-0{n}T00:00:00Z",
                     "spec": {k: v for k, v in sorted({**spec, "codeHash": CODE[c]}.items())
                              if k not in ("replicas", "codeHash", "traffic")}}
                    for n, c in ((1, "a"), (2, "b"), (3, "c"))]  # fmt: skip
        self.bed.apply({"apiVersion": GROUP, "kind": "Function", "metadata": {"name": "hello", "namespace": ns,
                        "labels": {"app.kubernetes.io/managed-by": "sless"},
                        "annotations": {"sless.dev/last-handled-configuration": "{}", "example.com/note": "kept"}},
                        "spec": spec})  # fmt: skip
        self.set_status("Function", ns, "hello", {
            "phase": "Ready", "message": "serving", "image": "registry/x:1", "codeHash": CODE["c"],
            "versions": versions, "kopf": {"progress": {}},
            "conditions": [{"type": "Ready", "status": "True", "reason": "Available"}]})  # fmt: skip
        self.bed.apply({"apiVersion": GROUP, "kind": "Function", "metadata": {"name": "other", "namespace":
                        self.namespaces[1]}, "spec": {"runtime": "nodejs20"}})  # fmt: skip
        hello = self.cr("Function", ns, "hello")
        owner = {"apiVersion": GROUP, "kind": "Function", "name": "hello", "uid": hello["metadata"]["uid"]}
        self.bed.apply(
            {"apiVersion": GROUP, "kind": "Trigger", "metadata": {"name": "nightly", "namespace": ns,
             "labels": {"sless.dev/function": "hello"}, "ownerReferences": [owner]},
             "spec": {"type": "cron", "function": "hello", "schedule": "0 3 * * *"}},
            {"apiVersion": GROUP, "kind": "FunctionJob", "metadata": {"name": "once", "namespace": ns,
             "ownerReferences": [owner]}, "spec": {"function": "hello", "runId": 2, "event": {"n": 1}}})  # fmt: skip
        self.set_status("Trigger", ns, "nightly", {"lastFiredAt": "2026-01-03T03:00:00Z", "message": "fired"})
        self.set_status("FunctionJob", ns, "once", {"phase": "Succeeded", "runId": 2, "message": '{"ok": true}'})
        self.bed.apply({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": {
            "name": "sless-secret-db", "namespace": ns,
            "labels": {"app.kubernetes.io/managed-by": "sless", "sless.dev/secret": "db"},
            "annotations": {"sless.dev/secret-version": "2"}},
            "data": {"password": base64.b64encode(b"pw-k8s-5d1e").decode()}})  # fmt: skip

    def kubernetes_state(self) -> dict[str, Any]:
        """What a restore must bring back, without what the API server assigns (uids, times, versions)."""
        out: dict[str, Any] = {}
        for ns in self.namespaces:
            obj = self.bed.get("namespace", ns)
            out[f"ns/{ns}"] = obj and {k: v for k, v in (obj["metadata"].get("labels", {})
                                                        | obj["metadata"].get("annotations", {})).items()
                                       if k not in APPLIED}  # fmt: skip
            for kind in ("Function", "Trigger", "FunctionJob"):
                listed = self.bed.kubectl("get", f"{kind.lower()}s.sless.dev", "-n", ns, "-o", "json", check=False)
                for obj in json.loads(listed.stdout)["items"] if listed.returncode == 0 else []:  # no CRD: none
                    meta = obj["metadata"]
                    out[f"{kind}/{ns}/{meta['name']}"] = {
                        "spec": obj["spec"], "status": {k: v for k, v in obj.get("status", {}).items() if k != "kopf"},
                        "labels": meta.get("labels"),
                        "annotations": {k: v for k, v in (meta.get("annotations") or {}).items()
                                        if k not in APPLIED and k != "sless.dev/last-handled-configuration"},
                        "owners": [r["name"] for r in meta.get("ownerReferences") or []]}  # fmt: skip
            found = self.bed.get("secrets", "-n", ns, "-l", "sless.dev/secret")
            for obj in found["items"] if found else []:
                out[f"Secret/{ns}/{obj['metadata']['name']}"] = (obj["data"], obj["metadata"]["labels"])
        return out

    def delete_kubernetes(self) -> None:
        for ns in self.namespaces:
            self.bed.kubectl("delete", "functionjobs.sless.dev,triggers.sless.dev,functions.sless.dev", "--all",
                             "-n", ns, "--wait=true")  # fmt: skip
            self.bed.kubectl("delete", "namespace", ns, "--wait=false")
        self.bed.wait("the tenant namespaces gone", lambda: all(self.bed.get("namespace", ns) is None
                                                                 for ns in self.namespaces), timeout=120)
        crds = ("functions.sless.dev", "triggers.sless.dev", "functionjobs.sless.dev")
        self.bed.kubectl("delete", "crd", *crds, "--wait=false")
        self.bed.wait("the CRDs gone", lambda: all(self.bed.get("crd", crd) is None for crd in crds), timeout=120)

    # -- Vault, S3, PostgreSQL

    def fill_vault(self) -> None:
        kv = self.vault.secrets.kv.v2
        kv.create_or_update_secret(path=f"{self.prefix}/{self.namespaces[0]}/db", secret={"password": "pw-3a9f"},
                                   mount_point="secret")  # fmt: skip
        kv.create_or_update_secret(path=f"{self.prefix}/{self.namespaces[0]}/db", secret={"password": "pw-7c21",
                                   "user": "app"}, mount_point="secret")  # fmt: skip
        kv.create_or_update_secret(path=f"{self.prefix}/{self.namespaces[1]}/api-key", secret={"key": "k-0e4b"},
                                   mount_point="secret")  # fmt: skip
        kv.create_or_update_secret(path=f"{self.prefix}/not-a-tenant/x", secret={"k": "v"}, mount_point="secret")

    def vault_state(self) -> dict[str, Any]:
        out = {}
        for ns in self.namespaces:
            try:
                names = self.vault.secrets.kv.v2.list_secrets(path=f"{self.prefix}/{ns}", mount_point="secret")
            except hvac.exceptions.InvalidPath:
                continue
            for name in names["data"]["keys"]:
                got = self.vault.secrets.kv.v2.read_secret_version(path=f"{self.prefix}/{ns}/{name}",
                                                                   mount_point="secret", raise_on_deleted_version=True)
                out[f"{ns}/{name}"] = got["data"]["data"]
        return out

    def delete_vault(self) -> None:
        for key in self.vault_state():
            self.vault.secrets.kv.v2.delete_metadata_and_all_versions(path=f"{self.prefix}/{key}", mount_point="secret")

    def fill_s3(self) -> None:
        import io

        self.minio.make_bucket(self.bucket)
        ns = self.namespaces[0]
        objects = ((f"functions/{ns}/hello/1.zip", b"PK\x03\x04zip"),
                   (f"code/{ns}/hello/3.tar.gz", bytes(range(256)) * 999),
                   (f"contexts/{ns}/hello/3.tar.gz", b"ctx"), ("empty", b""))  # fmt: skip
        for key, data in objects:
            self.minio.put_object(self.bucket, key, io.BytesIO(data), len(data), content_type="application/gzip")

    def s3_state(self) -> dict[str, bytes]:
        if not self.minio.bucket_exists(self.bucket):
            return {}
        out = {}
        for obj in self.minio.list_objects(self.bucket, recursive=True):
            response = self.minio.get_object(self.bucket, obj.object_name)
            out[obj.object_name] = response.read()
            response.close()
            response.release_conn()
        return out

    def delete_s3(self) -> None:
        for key in self.s3_state():
            self.minio.remove_object(self.bucket, key)
        self.minio.remove_bucket(self.bucket)

    def fill_database(self) -> None:
        import psycopg2

        from sless_api.stores.migrate import migrate_postgres

        conn = psycopg2.connect(self.db_url)
        try:
            migrate_postgres(conn)
        finally:
            conn.close()
        for i in range(3):
            sql(self.db_url, "INSERT INTO invocations (namespace, function, method, status, duration_ms, started_at, "
                "error) VALUES (%s, 'hello', 'POST', %s, %s, now() - %s * interval '1 hour', %s)",
                self.namespaces[0], 200 + i, 1.5 * i, i, None if i else "boom\nline 2")  # fmt: skip
        sql(self.db_url, "INSERT INTO event_deliveries (queue, message_key, state) VALUES ('q', 'm-1', 'done')")

    def database_state(self) -> dict[str, Any]:
        return {table: sql(self.db_url, f"SELECT * FROM {table} ORDER BY 1, 2", missing_table_ok=True)
                for table in ("invocations", "event_deliveries", "schema_migrations")}  # fmt: skip

    def recreate_database(self) -> None:
        import psycopg2

        base, name = self.db_url.rsplit("/", 1)
        conn = psycopg2.connect(base + "/postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()

    def state(self) -> dict[str, Any]:
        return {"kubernetes": self.kubernetes_state(), "vault": self.vault_state(), "s3": self.s3_state(),
                "database": self.database_state()}

    # an operator Deployment of the release (on kwok its pods are simulated)
    def operator(self, replicas: int = 2) -> None:
        labels = {"app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/component": "operator"}
        self.bed.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PLATFORM_NS}})
        self.bed.apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
            "name": "sless-operator", "namespace": PLATFORM_NS, "labels": labels}, "spec": {
            "replicas": replicas, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels},
            "spec": {"containers": [{"name": "operator", "image": "sless:test"}]}}}})  # fmt: skip

    def operator_replicas(self) -> int:
        return int(self.bed.get("deployment", "sless-operator", "-n", PLATFORM_NS)["spec"]["replicas"])


def recap(proc: subprocess.CompletedProcess[str]) -> str:
    return (proc.stdout + proc.stderr)[-4000:]


@pytest.fixture(scope="module")
def world(bed: Testbed, vault: Path, s3_endpoint: S3Endpoint, pg_url: str,
          tmp_path_factory: pytest.TempPathFactory) -> World:  # fmt: skip
    w = World(bed, vault, s3_endpoint, fresh_pg_database(pg_url), tmp_path_factory.mktemp("backup-work"))
    w.seed_platform()
    return w


@pytest.mark.k8s
@pytest.mark.s3
@pytest.mark.pg
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_backup_then_restore_brings_everything_back(world: World) -> None:
    from sless_operator import history

    world.fill_kubernetes()
    world.fill_vault()
    world.fill_s3()
    world.fill_database()
    world.operator(replicas=2)
    before = world.state()
    assert before["kubernetes"][f"Function/{world.namespaces[0]}/hello"]["status"]["versions"][-1]["version"] == 3
    assert len(before["s3"]) == 4 and len(before["vault"]) == 2 and len(before["database"]["invocations"]) == 3

    made = world.playbook("backup.yml")
    assert made.returncode == 0, recap(made)
    [backup] = list(world.backups.iterdir())
    assert backup.name.startswith("sless-backup-") and stat.S_IMODE(backup.stat().st_mode) == 0o700
    manifest = json.loads((backup / "manifest.json").read_text())
    assert manifest["contents"]["kubernetes"] == {"namespaces": 2, "secrets": 1, "Function": 2, "Trigger": 1,
                                                  "FunctionJob": 1}  # fmt: skip
    assert manifest["contents"]["vault"] == {"entries": 2} and manifest["contents"]["s3"]["objects"] == 4
    assert manifest["info"]["chart_app_version"] == yaml.safe_load((ROOT / "charts/sless/Chart.yaml").read_text())[
        "appVersion"]
    assert f"{world.prefix}/not-a-tenant/" in manifest["info"]["skipped"]
    for secret in ("pw-7c21", "k-0e4b", world.s3.secret_key, world.token, world.db_url):
        assert secret not in made.stdout + made.stderr, "a secret value in Ansible's output"

    world.delete_kubernetes()
    world.delete_vault()
    world.delete_s3()
    world.recreate_database()
    gone = world.state()
    assert not gone["vault"] and not gone["s3"] and not any(gone["database"].values())
    assert not any(v for k, v in gone["kubernetes"].items())

    restored = world.playbook("restore.yml", sless_backup_restore_from=str(backup), sless_backup_operator_wait_sec=120)
    assert restored.returncode == 0, recap(restored)
    after = world.state()
    assert after == before
    hello = world.cr("Function", world.namespaces[0], "hello")
    # the operator, once it runs, finds the newest version is what is deployed: no new version
    assert history.recorded(hello["status"], hello["spec"], hello["spec"]["codeHash"], "now") is None
    assert "sless.dev/last-handled-configuration" not in hello["metadata"].get("annotations", {})
    for kind, name in (("Trigger", "nightly"), ("FunctionJob", "once")):
        [owner] = world.cr(kind, world.namespaces[0], name)["metadata"]["ownerReferences"]
        assert owner["uid"] == hello["metadata"]["uid"], kind
    assert world.operator_replicas() == 2
    stopped = [ln for ln in restored.stdout.splitlines() if "Stop the operator" in ln]
    assert stopped, recap(restored)

    again = world.playbook("restore.yml", sless_backup_restore_from=str(backup))
    assert again.returncode == 0, recap(again)
    assert world.state() == before


@pytest.mark.k8s
@pytest.mark.s3
@pytest.mark.pg
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_restore_refuses_a_damaged_backup_and_changes_nothing(world: World) -> None:
    backups = sorted(world.backups.iterdir()) if world.backups.exists() else []
    if not backups:
        world.fill_kubernetes()
        made = world.playbook("backup.yml")
        assert made.returncode == 0, recap(made)
        backups = sorted(world.backups.iterdir())
    world.operator(replicas=2)
    source = backups[-1]
    cases = {"truncated manifest": "not complete JSON", "tampered archive": "size or checksum differs",
             "missing folder": "not a folder"}  # fmt: skip
    for case, said in cases.items():
        damaged = world.work / f"damaged-{case.replace(' ', '-')}"
        if case != "missing folder":
            shutil.copytree(source, damaged)
        if case == "truncated manifest":
            text = (damaged / "manifest.json").read_text()
            (damaged / "manifest.json").write_text(text[: len(text) // 3])
        elif case == "tampered archive":
            [archive] = [p for p in (damaged / "s3" / "objects").rglob("*.zip")] or [damaged / "database/sless.dump"]
            archive.write_bytes(archive.read_bytes()[:-1] + b"X")
        ns = world.namespaces[0]
        world.bed.kubectl("delete", "triggers.sless.dev", "nightly", "-n", ns, "--ignore-not-found")
        refused = world.playbook("restore.yml", sless_backup_restore_from=str(damaged))
        assert refused.returncode != 0, case
        assert said in refused.stdout + refused.stderr, (case, recap(refused))
        assert world.cr("Trigger", ns, "nightly") is None, f"{case}: the restore changed the cluster"
        assert world.operator_replicas() == 2, f"{case}: the operator was touched"
        assert "Stop the operator" not in refused.stdout, case
