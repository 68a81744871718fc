#!/usr/bin/env python3
"""A real Vault server on loopback for the install tests, and the data the platform expects in it.

    vaultbed.py up       --state DIR [--port 18200]   start `vault server -dev` (in-memory, KV v2 at secret/)
    vaultbed.py seed     --state DIR --pg-port P --amqp-port Q [--host H]
                         write secret/sless/{jwt,database,s3,rabbitmq,registry}; the database and
                         RabbitMQ URLs name H (default 127.0.0.1; the real node's bridge address when
                         the platform runs as pods, which cannot reach the host's loopback)
    vaultbed.py k8s-auth --state DIR --kubeconfig K [--kubectl BIN]
                         enable Vault's Kubernetes auth method against that cluster (TokenReview by a
                         service account with system:auth-delegator), role sless-installer reading
                         secret/sless/*, and write a token of the installer's service account to
                         DIR/installer.jwt
    vaultbed.py down     --state DIR                   stop the server, delete DIR

The binary comes from tests/install/build-vault.sh (HashiCorp Vault built from its Go module:
OpenBao's server module is not served by the module proxy). Nothing here imitates Vault: every
call goes to the real server's HTTP API through hvac.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import hvac
import requests

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build-vault.sh"
NOT_BUILT = 3
INSTALLER_NAMESPACE = "sless-installer"
INSTALLER_SA = "sless-installer"
REVIEWER_SA = "vault-token-reviewer"
POLICY = 'path "secret/data/sless/*" { capabilities = ["read"] }\n'


class VaultBedError(RuntimeError):
    """The server could not be started or configured; the message says why."""


def log(message: str) -> None:
    print(f"[vaultbed {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def binary() -> str:
    proc = subprocess.run(["bash", str(BUILD), "--check"], capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode == NOT_BUILT:
        raise VaultBedError(f"Vault is not built yet: run `{BUILD}` first (cold: 30-60 min on 2 cores)")
    if proc.returncode != 0:
        raise VaultBedError(f"{BUILD} --check failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def _state(state: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((state / "vault.json").read_text()))
    except FileNotFoundError:
        raise VaultBedError(f"{state} holds no Vault (run `vaultbed.py up --state {state}`)") from None


def client(state: Path) -> hvac.Client:
    info = _state(state)
    return hvac.Client(url=info["addr"], token=(state / "root-token").read_text().strip())


def up(state: Path, port: int, timeout: float = 60) -> dict[str, str]:
    """Start a dev-mode server (in-memory storage, unsealed, KV v2 at secret/) on 127.0.0.1:PORT."""
    vault = binary()
    state.mkdir(parents=True, exist_ok=True)
    if (state / "vault.json").exists():
        raise VaultBedError(f"{state} already holds a Vault; run `vaultbed.py down --state {state}` first")
    token = "root-" + secrets.token_hex(16)
    token_file = state / "root-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    addr = f"http://127.0.0.1:{port}"
    argv = [vault, "server", "-dev", f"-dev-listen-address=127.0.0.1:{port}", f"-dev-root-token-id={token}",
            "-dev-no-store-token", "-log-level=warn"]  # fmt: skip
    logfile = (state / "vault.log").open("ab")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VAULT_")}
    env["HOME"] = str(state)  # no ~/.vault-token of the user's
    proc = subprocess.Popen(argv, stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True)  # fmt: skip
    (state / "vault.json").write_text(json.dumps({"pid": proc.pid, "addr": addr, "binary": vault}) + "\n")
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            tail = (state / "vault.log").read_text(errors="replace")[-3000:]
            down(state, keep=True)
            raise VaultBedError(f"vault exited with {proc.returncode}:\n{tail}")
        try:
            if requests.get(f"{addr}/v1/sys/health", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            down(state, keep=True)
            raise VaultBedError(f"vault did not answer on {addr} within {timeout:.0f}s")
        time.sleep(0.2)
    version = requests.get(f"{addr}/v1/sys/health", timeout=5).json().get("version")
    log(f"Vault {version} up on {addr} (pid {proc.pid})")
    return {"VAULT_ADDR": addr, "VAULT_TOKEN": token}


def down(state: Path, keep: bool = False, grace: float = 10) -> None:
    """Stop the server started in STATE (by its recorded pid) and delete STATE unless KEEP."""
    info = json.loads((state / "vault.json").read_text()) if (state / "vault.json").exists() else {}
    pid = info.get("pid")
    if pid:
        try:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                if _gone(pid):
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if not keep and state.exists():
        for path in sorted(state.rglob("*"), reverse=True):
            path.unlink() if path.is_file() or path.is_symlink() else path.rmdir()
        state.rmdir()


def _gone(pid: int) -> bool:
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)
        if finished:
            return True
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def platform_entries(pg_port: int, amqp_port: int, host: str = "127.0.0.1") -> dict[str, dict[str, str]]:
    """Fresh random credentials for every entry the vault_secrets role reads."""
    # a letter first: rabbitmqctl add_user takes a password starting with '-' (1 in 64 of token_urlsafe's) for options
    pg_password = "p" + secrets.token_urlsafe(18)
    mq_password = "m" + secrets.token_urlsafe(18)
    auth = json.dumps({"auths": {"registry.example.test": {"auth": secrets.token_urlsafe(12)}}})
    return {
        "jwt": {"secret": secrets.token_urlsafe(32)},
        "database": {"url": f"postgresql://sless:{pg_password}@{host}:{pg_port}/sless"},
        "s3": {"access_key": "AK" + secrets.token_hex(8).upper(), "secret_key": secrets.token_urlsafe(24)},
        "rabbitmq": {"url": f"amqp://sless:{mq_password}@{host}:{amqp_port}/sless"},
        "registry": {"dockerconfigjson": auth},
    }


def seed(state: Path, entries: dict[str, dict[str, str]], prefix: str = "sless") -> None:
    vault = client(state)
    for path, data in entries.items():
        vault.secrets.kv.v2.create_or_update_secret(path=f"{prefix}/{path}", secret=data, mount_point="secret")
    log(f"wrote secret/{prefix}/{{{','.join(entries)}}}")


def _kubectl(kubectl: str, kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run([kubectl, f"--kubeconfig={kubeconfig}", *args], input=stdin, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise VaultBedError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def kubernetes_auth(state: Path, kubeconfig: Path, kubectl: str = "kubectl", duration: str = "2h") -> Path:
    """Vault's Kubernetes auth method against the cluster in KUBECONFIG, and an installer token."""
    config = json.loads(_kubectl(kubectl, kubeconfig, "config", "view", "--raw", "--minify", "-o", "json"))
    cluster = config["clusters"][0]["cluster"]
    host = cluster["server"]
    if "certificate-authority-data" in cluster:
        import base64

        ca_pem = base64.b64decode(cluster["certificate-authority-data"]).decode()
    else:
        ca_pem = Path(cluster["certificate-authority"]).read_text()
    objects = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": INSTALLER_NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": REVIEWER_SA, "namespace": INSTALLER_NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": INSTALLER_SA, "namespace": INSTALLER_NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "sless-vault-token-reviewer"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
         "subjects": [{"kind": "ServiceAccount", "name": REVIEWER_SA, "namespace": INSTALLER_NAMESPACE}]},
    ]  # fmt: skip
    _kubectl(kubectl, kubeconfig, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                          "items": objects}))  # fmt: skip
    reviewer = _kubectl(kubectl, kubeconfig, "create", "token", REVIEWER_SA, "-n", INSTALLER_NAMESPACE,
                        f"--duration={duration}").strip()  # fmt: skip
    installer = _kubectl(kubectl, kubeconfig, "create", "token", INSTALLER_SA, "-n", INSTALLER_NAMESPACE,
                         f"--duration={duration}").strip()  # fmt: skip
    vault = client(state)
    if "kubernetes/" not in vault.sys.list_auth_methods():
        vault.sys.enable_auth_method("kubernetes")
    vault.auth.kubernetes.configure(kubernetes_host=host, kubernetes_ca_cert=ca_pem, token_reviewer_jwt=reviewer,
                                    disable_local_ca_jwt=True)  # fmt: skip
    vault.sys.create_or_update_policy("sless-install", POLICY)
    vault.auth.kubernetes.create_role("sless-installer", bound_service_account_names=[INSTALLER_SA],
                                      bound_service_account_namespaces=[INSTALLER_NAMESPACE],
                                      policies=["sless-install"], ttl="15m")  # fmt: skip
    jwt_file = state / "installer.jwt"
    jwt_file.write_text(installer)
    jwt_file.chmod(0o600)
    log(f"kubernetes auth against {host}; role sless-installer; token in {jwt_file}")
    return jwt_file


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="vaultbed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = parser.add_subparsers(dest="verb", required=True)
    p_up = sub.add_parser("up")
    p_up.add_argument("--port", type=int, default=18200)
    p_seed = sub.add_parser("seed")
    p_seed.add_argument("--pg-port", type=int, required=True)
    p_seed.add_argument("--amqp-port", type=int, required=True)
    p_seed.add_argument("--host", default="127.0.0.1")
    p_auth = sub.add_parser("k8s-auth")
    p_auth.add_argument("--kubeconfig", type=Path, required=True)
    p_auth.add_argument("--kubectl", default="kubectl")
    sub.add_parser("down")
    for p in (p_up, p_seed, p_auth, *[sub.choices["down"]]):
        p.add_argument("--state", type=Path, required=True)
    args = parser.parse_args(argv)
    state = args.state.resolve()
    try:
        if args.verb == "up":
            env = up(state, args.port)
            print("\n".join(f"export {k}={v}" for k, v in env.items()))
        elif args.verb == "seed":
            seed(state, platform_entries(args.pg_port, args.amqp_port, args.host))
            (state / "seeded").touch()  # Molecule's create runs this once (`creates:`)
        elif args.verb == "k8s-auth":
            print(kubernetes_auth(state, args.kubeconfig, args.kubectl))
        elif args.verb == "down":
            down(state)
    except (VaultBedError, hvac.exceptions.VaultError, requests.RequestException) as exc:
        print(f"vaultbed {args.verb}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
