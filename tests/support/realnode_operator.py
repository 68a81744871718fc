"""The platform on the real-node test bed: an S3 server on the node's bridge, the operator's settings for the
test bed's registry and images, build namespaces, and the API process resolving names through cluster DNS.

Used by every real-node test of the operator and by the benchmarks that deploy on the real node
(bench/deploy_speed.py, bench/kube_proxy.py): they start these per test or per run, so they share the pieces,
not a fixture.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.kube_operator import CRDS, SLESS_KINDS
from tests.support.platform import REPO, SECRET
from tests.support.quotas import wait_counted
from tests.support.realnode import RealNode, http_get
from tests.support.services import free_port, tools_dir

ACCESS, SECRET_KEY, BUCKET = "sless-test-access", "sless-test-secret", "sless"


@contextlib.contextmanager
def s3_server(real_node: RealNode, log_dir: Path) -> Iterator[str]:
    """moto_server on the bridge IP, so the build Job's fetch-context container reaches it."""
    exe = tools_dir() / "moto-venv" / "bin" / "moto_server"
    if not exe.exists():
        pytest.skip(f"{exe} is missing (scripts/install-test-services.sh installs it)")
    with socket.socket() as sock:
        sock.bind((real_node.node_ip, 0))
        port = sock.getsockname()[1]
    endpoint = f"{real_node.node_ip}:{port}"
    with open(log_dir / "moto.log", "wb") as log:
        proc = subprocess.Popen([str(exe), "-H", real_node.node_ip, "-p", str(port)], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        real_node.bed.wait("moto_server answers", lambda: _answers(f"http://{endpoint}/"), timeout=60)
        from minio import Minio

        Minio(endpoint, access_key=ACCESS, secret_key=SECRET_KEY, secure=False).make_bucket(BUCKET)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _answers(url: str) -> bool:
    try:
        return http_get(url, timeout=2)[0] == 200
    except OSError:
        return False


def operator_env(real_node: RealNode, s3_endpoint: str) -> dict[str, str]:
    """The operator pointed at the test bed: its registry, images and the S3 server on the bridge.

    No build retries: a failed build shows at once (every build here should succeed).
    """
    return {
        "SLESS_REGISTRY": f"{real_node.registry}/sless", "SLESS_REGISTRY_INSECURE": "true",
        "SLESS_KANIKO_IMAGE": real_node.image("sless-testbed/kaniko-executor"),
        "SLESS_BUILD_FETCH_IMAGE": real_node.pinned("sless/platform"),
        "SLESS_S3_ENDPOINT": s3_endpoint, "SLESS_S3_BUCKET": BUCKET, "SLESS_BUILD_CACHE": "false",
        "SLESS_BUILD_CPU": "1", "SLESS_BUILD_MEMORY_MB": "2048", "SLESS_BUILD_RETRIES": "0",
        # function pods fetch their code through URLs the operator signs; code without dependencies
        # runs on the runtime images the test bed's registry holds
        "SLESS_S3_ACCESS_KEY": ACCESS, "SLESS_S3_SECRET_KEY": SECRET_KEY,
        "SLESS_RUNTIME_IMAGE_PREFIX": f"{real_node.registry}/sless", "SLESS_RUNTIME_IMAGE_TAG": "testbed",
        # a Go function's binary runs on the distroless stand-in, as the API's kaniko builds do
        "SLESS_GO_RUN_IMAGE": real_node.image("sless-testbed/static"),
    }  # fmt: skip


def build_namespace(real_node: RealNode) -> str:
    """A build namespace with the S3 Secret the build's fetch-context container reads."""
    name = f"sless-build-{secrets.token_hex(4)}"
    real_node.bed.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {
            "pod-security.kubernetes.io/enforce": "baseline"}}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sless-build-s3", "namespace": name},
         "stringData": {"AWS_ACCESS_KEY_ID": ACCESS, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}},
    )  # fmt: skip
    return name


def build_logs(real_node: RealNode, build_ns: str) -> str:
    """The build pods and the end of their containers' output, for a failed build's message."""
    bed = real_node.bed
    pods = bed.kubectl("get", "pods", "-n", build_ns, "-o", "wide", check=False).stdout
    out = [pods]
    for name in bed.kubectl("get", "pods", "-n", build_ns, "-o", "name", check=False).stdout.split():
        logs = bed.kubectl("logs", "-n", build_ns, name, "--all-containers", "--tail=25", check=False)
        out.append(f"--- {name}\n{logs.stdout}{logs.stderr}")
    return "\n".join(out)


def apply_crds(real_node: RealNode) -> None:
    """The chart's CRDs, Established and counted by the tenant quota."""
    bed = real_node.bed
    bed.kubectl("apply", "-f", str(CRDS))
    bed.wait_established(*SLESS_KINDS)
    wait_counted(bed)  # the tenant quota counts them


@contextlib.contextmanager
def api_server(real_node: RealNode, s3_on_bridge: str, tmp_path: Path, extra_env: dict[str, str] | None = None,
               workers: int | None = None) -> Iterator[str]:  # fmt: skip
    """The API process (kubernetes backend), resolving names through the test bed's CoreDNS: uvicorn, or with
    ``workers`` the production server ``sless-api`` (gunicorn) with that many worker processes."""
    apply_crds(real_node)
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(f"nameserver {real_node.node_ip}\n")
    port = free_port()
    env = real_node.bed.env | {
        "SLESS_BACKEND": "kubernetes", "SLESS_JWT_SECRET": SECRET, "SLESS_DATA_DIR": str(tmp_path / "data"),
        "SLESS_S3_ENDPOINT": s3_on_bridge, "SLESS_S3_ACCESS_KEY": ACCESS, "SLESS_S3_SECRET_KEY": SECRET_KEY,
        "SLESS_S3_BUCKET": BUCKET, "SLESS_RUNTIME_IMAGE_PREFIX": f"{real_node.registry}/sless",
        "SLESS_RUNTIME_IMAGE_TAG": "testbed", "SLESS_KUBE_REQUEST_TIMEOUT_SEC": "10",
        "SLESS_KUBE_ROUTING": "endpoints",  # as the chart installs it: each call to a ready pod the API picks
        "SLESS_GO_RUN_IMAGE": real_node.image("sless-testbed/static"), **(extra_env or {}),
    }  # fmt: skip
    for key in ("SLESS_DATABASE_URL", "SLESS_RABBITMQ_URL"):  # the session's services, unless asked for
        if key not in (extra_env or {}):
            env.pop(key, None)
    # a private mount namespace: only this process sees the other resolv.conf
    private_dns = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   'mount --bind "$0" /etc/resolv.conf && exec "$@"', str(resolv)]  # fmt: skip
    if workers is None:
        server = [sys.executable, "-m", "uvicorn", "--factory", "sless_api.main.app:create_app", "--host", "127.0.0.1",
                  "--port", str(port), "--log-level", "info"]  # fmt: skip
    else:
        server = [sys.executable, "-m", "sless_api.main.serve"]
        env |= {"SLESS_BIND": f"127.0.0.1:{port}", "SLESS_WORKERS": str(workers)}
    argv = [*private_dns, *server]
    log_path = tmp_path / "api.log"
    with log_path.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        real_node.bed.wait("the API answers /health", lambda: _answers(f"{url}/health") or proc.poll() is not None,
                           timeout=60)  # fmt: skip
        assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        print("API log tail:\n" + "\n".join(log_path.read_text(errors="replace").splitlines()[-15:]))
