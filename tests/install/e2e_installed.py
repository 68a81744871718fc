"""End to end through the API of an installed sless (Molecule scenario e2e; run by its verify).

Not collected by a plain `pytest` run (no test_ prefix): it needs what the scenario made, namely
the chart installed by playbooks/install.yml on the test bed ($KUBECONFIG), Secrets from Vault,
PostgreSQL and RabbitMQ from the roles, and an S3 server.

kwok runs no containers, so the platform's two processes run here, configured exactly as their
pods would be: the chart's ConfigMap and Secrets as environment, and the API server credentials
of the chart's own ServiceAccounts (tokens from `kubectl create token`). So this also proves that
the chart's least-privilege RBAC is enough for the API and the operator to do their work.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import jwt
import psycopg2
import pytest
import requests
import yaml

from sless_api.domain.archive import zip_bytes
from tests.support.poll import until
from tests.support.quotas import wait_counted
from tests.support.testbed import Testbed

NS = "sless-system"
BIN = Path(sys.executable).parent
TIMEOUT = float(os.environ.get("SLESS_E2E_TIMEOUT", "120"))
POLL = 0.5  # s between looks: an installed platform on a shared test bed, not worth asking faster

pytestmark = [pytest.mark.e2e, pytest.mark.k8s]


def kubectl(*args: str, stdin: str | None = None, check: bool = True, timeout: float = 60) -> str:
    """kubectl with ARGS; TIMEOUT bounds the process (longer than a ``--timeout`` given to kubectl itself)."""
    exe = shutil.which("kubectl") or str(Path(os.environ["SLESS_TESTBED_BIN"]) / "kubectl")
    proc = subprocess.run([exe, *args], input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def get(*args: str) -> Any:
    out = kubectl("get", *args, "-o", "json", check=False)
    return json.loads(out) if out.strip() else None


class InstalledCluster:
    """The installed platform's cluster ($KUBECONFIG), in the shape of the test bed that
    :func:`tests.support.quotas.wait_counted` probes."""

    kubeconfig = os.environ.get("KUBECONFIG", "")

    def kubectl(self, *args: str, check: bool = True) -> str:
        return kubectl(*args, check=check)

    def apply(self, *objects: dict[str, Any]) -> None:
        kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}))

    def get(self, *args: str) -> Any:
        return get(*args)


def counted_cluster() -> None:
    """Until the cluster's quota controller counts the platform's custom resources. The chart installed their
    CRDs moments ago; a tenant quota the operator makes before the controller discovered them (it looks every
    30 s) stays uncounted until its next full resync (5 min), and the API server refuses creates meanwhile. On a
    cluster the CRDs come long before the first tenant; here the first tenant comes right after the install."""
    wait_counted(cast(Testbed, InstalledCluster()))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def service_account_kubeconfig(name: str, path: Path) -> Path:
    """A kubeconfig that acts as ServiceAccount sless-system/NAME (the chart's RBAC, nothing more)."""
    admin = json.loads(kubectl("config", "view", "--raw", "--minify", "-o", "json"))
    cluster = admin["clusters"][0]["cluster"]
    token = kubectl("create", "token", name, "-n", NS, "--duration=2h").strip()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "bed", "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "bed", "user": name}}],
    }))  # fmt: skip
    path.chmod(0o600)
    return path


def secret_value(name: str, key: str, namespace: str = NS) -> str:
    data = get("secret", name, "-n", namespace)["data"]
    return base64.b64decode(data[key]).decode()


@dataclass
class Platform:
    url: str
    jwt_secret: str = field(repr=False)
    logs: dict[str, Path] = field(repr=False)
    database_url: str = field(repr=False)

    def token(self, sub: str) -> str:
        return jwt.encode({"sub": sub, "exp": int(time.time()) + 3600}, self.jwt_secret, algorithm="HS256")

    def tail(self) -> str:
        return "\n".join(f"--- {n} ---\n" + "\n".join(p.read_text(errors="replace").splitlines()[-40:])
                         for n, p in self.logs.items())  # fmt: skip


def _start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    work = tmp_path_factory.mktemp("installed")
    config = get("configmap", "sless-config", "-n", NS)["data"]
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLESS_") and k != "KUBECONFIG"}
    base |= config
    # what the API Deployment maps from Secrets (charts/sless/templates/api-deployment.yaml)
    api_env = base | {
        "SLESS_JWT_SECRET": secret_value("sless-jwt", "secret"),
        "SLESS_DATABASE_URL": secret_value("sless-database", "url"),
        "SLESS_S3_ACCESS_KEY": secret_value("sless-s3", "access-key"),
        "SLESS_S3_SECRET_KEY": secret_value("sless-s3", "secret-key"),
        "SLESS_RABBITMQ_URL": secret_value("sless-rabbitmq", "url"),
        # the token file the chart mounts for sless-scaler's reports (the host process cannot reach the scaler's
        # Service, which leaves its reports unsent and no call affected)
        "SLESS_SCALER_TOKEN": secret_value("sless-scaler-token", "token"),
        "SLESS_BIND": f"127.0.0.1:{free_port()}",
        "SLESS_WORKERS": "1",
        "SLESS_DATA_DIR": str(work / "api-data"),
        "KUBECONFIG": str(service_account_kubeconfig("sless-api", work / "api.kubeconfig")),
    }
    # what the operator Deployment maps from Secrets (charts/sless/templates/operator-deployment.yaml): the S3
    # keys sign the code download URLs of pods that fetch their code at start
    operator_env = base | {
        "SLESS_S3_ACCESS_KEY": api_env["SLESS_S3_ACCESS_KEY"], "SLESS_S3_SECRET_KEY": api_env["SLESS_S3_SECRET_KEY"],
        "KUBECONFIG": str(service_account_kubeconfig("sless-operator", work / "op.kubeconfig")),
    }
    logs = {"operator": work / "operator.log", "api": work / "api.log"}
    operator = _start([str(BIN / "sless-operator"), "--liveness=http://127.0.0.1:0/healthz"], operator_env,
                      logs["operator"])  # fmt: skip
    api = _start([str(BIN / "sless-api")], api_env, logs["api"])
    found = Platform(f"http://{api_env['SLESS_BIND']}", api_env["SLESS_JWT_SECRET"], logs,
                     api_env["SLESS_DATABASE_URL"])  # fmt: skip
    try:

        def answers(probe: str) -> bool:
            assert api.poll() is None, f"sless-api exited {api.returncode}:\n{found.tail()}"
            assert operator.poll() is None, f"sless-operator exited {operator.returncode}:\n{found.tail()}"
            try:
                return requests.get(found.url + probe, timeout=2).status_code == 200
            except requests.RequestException:
                return False

        until("the API's /health", lambda: answers("/health"), 90, POLL)
        # healthy first, ready once its route table has loaded from the cluster (a Service waits for the same)
        until("the API's /ready", lambda: answers("/ready"), 90, POLL)
        yield found
    finally:
        _stop(api)
        _stop(operator)
        print(found.tail())


@dataclass
class Tenant:
    platform: Platform
    sub: str

    @property
    def ns(self) -> str:
        import hashlib

        return "sless-" + hashlib.sha256(self.sub.encode()).hexdigest()[:16]

    def call(self, method: str, path: str, expect: int | tuple[int, ...] | None = None, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.platform.token(self.sub)}"}
        resp = requests.request(method, f"{self.platform.url}/v1/namespaces/{self.ns}{path}", headers=headers,
                                timeout=30, **kwargs)  # fmt: skip
        if expect is not None:
            wanted = (expect,) if isinstance(expect, int) else expect
            assert resp.status_code in wanted, f"{method} {path}: {resp.status_code} {resp.text[:500]}"
        return resp


@pytest.fixture(scope="module")
def tenant(platform: Platform) -> Tenant:
    counted_cluster()
    t = Tenant(platform, f"e2e-{uuid.uuid4()}")
    t.call("POST", "/ensure", expect=(200, 201))
    return t


def code_zip(files: dict[str, str]) -> bytes:
    return zip_bytes((name, text, False) for name, text in files.items())


def test_probes_answer_without_auth(platform: Platform) -> None:
    assert requests.get(platform.url + "/health", timeout=5).status_code == 200
    assert requests.get(platform.url + "/ready", timeout=5).status_code == 200


def test_the_api_refuses_requests_without_a_token(platform: Platform) -> None:
    resp = requests.get(f"{platform.url}/v1/namespaces/sless-0000000000000000/functions", timeout=10)
    assert resp.status_code == 401


def test_ensure_creates_the_tenant_namespace_with_the_api_service_account(tenant: Tenant) -> None:
    namespace = until("tenant namespace", lambda: get("namespace", tenant.ns), TIMEOUT, POLL)
    assert namespace["status"]["phase"] == "Active"


def test_function_builds_and_becomes_ready_through_the_operator(platform: Platform, tenant: Tenant) -> None:
    tenant.call("POST", "/functions", expect=201, json={"name": "hello", "runtime": "python3.11"})
    files = {"handler.py": "def handle(event):\n    return {'hello': event.get('name', 'world')}\n"}
    tenant.call("POST", "/functions/hello/upload", expect=(200, 201, 202),
                files={"code": ("code.zip", code_zip(files), "application/zip")})  # fmt: skip

    def with_code() -> Any:
        c = get("functions.sless.dev", "hello", "-n", tenant.ns)
        return c if c and c["spec"].get("codeHash") else None

    cr = until("Function CR with its code hash", with_code, TIMEOUT, POLL)
    assert len(cr["spec"]["codeHash"]) == 64
    # the operator (its own ServiceAccount) ran the build Job, then made the Deployment and Service
    ready = until("Function Ready", lambda: (f := tenant.call("GET", "/functions/hello", expect=200).json())
                  .get("phase") in ("Ready", "Failed") and f, TIMEOUT, POLL)  # fmt: skip
    assert ready["phase"] == "Ready", f"{ready['message']}\n{platform.tail()}"
    assert get("deployment", "hello", "-n", tenant.ns) is not None
    assert get("service", "hello", "-n", tenant.ns) is not None


def test_operator_puts_guard_rails_into_the_tenant_namespace(tenant: Tenant) -> None:
    quotas = until("ResourceQuota", lambda: get("resourcequota", "-n", tenant.ns)["items"], TIMEOUT, POLL)
    policies = get("networkpolicy", "-n", tenant.ns)["items"]
    assert quotas and policies
    labels = get("namespace", tenant.ns)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_triggers_http_cron_and_event(tenant: Tenant) -> None:
    tenant.call("POST", "/triggers", expect=201, json={"name": "web", "type": "http", "function": "hello"})
    tenant.call("POST", "/triggers", expect=201,
                json={"name": "tick", "type": "cron", "function": "hello", "schedule": "*/5 * * * *"})  # fmt: skip
    until("CronJob of the cron trigger", lambda: get("cronjob", "-n", tenant.ns)["items"], TIMEOUT, POLL)
    # RabbitMQ is configured (Secret sless-rabbitmq): event triggers are accepted
    tenant.call("POST", "/triggers", expect=201,
                json={"name": "queue", "type": "event", "function": "hello", "queue": "e2e-events"})  # fmt: skip
    names = {t["name"] for t in tenant.call("GET", "/triggers", expect=200).json()["items"]}
    assert names >= {"web", "tick", "queue"}


def test_a_one_shot_job_runs(tenant: Tenant) -> None:
    tenant.call("POST", "/jobs", expect=201, json={"name": "once", "function": "hello", "event": {"name": "e2e"},
                                                   "run_id": 1})  # fmt: skip
    done = until("job finished", lambda: (j := tenant.call("GET", "/jobs/once", expect=200).json())
                 .get("phase") in ("Succeeded", "Failed") and j, TIMEOUT, POLL)  # fmt: skip
    assert done["phase"] == "Succeeded", done


def test_invocation_log_lives_in_postgresql_under_the_platforms_user(platform: Platform, tenant: Tenant) -> None:
    # the log connects (and migrates) on first use: reading a function's invocations is one
    listed = tenant.call("GET", "/functions/hello/invocations", expect=200).json()
    assert isinstance(listed.get("items", listed), list)
    with psycopg2.connect(platform.database_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT current_user, to_regclass('invocations') IS NOT NULL")
        user, has_table = cur.fetchone()
    assert user == "sless"
    assert has_table, "the API did not migrate the invocation log with the platform's credentials"


def test_delete_cascades(tenant: Tenant) -> None:
    tenant.call("DELETE", "/functions/hello", expect=(200, 202, 204))
    until("Deployment gone", lambda: get("deployment", "hello", "-n", tenant.ns) is None, TIMEOUT, POLL)
    until("Function gone", lambda: tenant.call("GET", "/functions/hello").status_code == 404, TIMEOUT, POLL)


def test_no_permission_was_missing(platform: Platform) -> None:
    for name, log in platform.logs.items():
        text = log.read_text(errors="replace")
        assert "forbidden" not in text.lower(), f"{name} hit RBAC refusals:\n{platform.tail()}"
