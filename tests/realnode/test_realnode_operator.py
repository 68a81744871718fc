"""The sless operator builds a hello function for real and the function answers.

First with what the API would do done by hand (build context in S3, Function resource), then
through the real API process: upload, http trigger, `/fn/...`. The operator process is the real
one: build Job (fetch-context from S3, kaniko, push to the test bed's registry), Deployment in a
`restricted` tenant namespace, Service.

The API reaches a function at ``http://<fn>.<ns>.svc.cluster.local:8080``, a name only cluster
DNS knows: the API process runs in its own mount namespace whose /etc/resolv.conf names the test
bed's CoreDNS (which forwards other names to the host's resolver), so nothing else on the host
changes.
"""

from __future__ import annotations

import contextlib
import io
import json
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sless_core import crcodec, crd
from sless_core.buildcontext import code_tree_hash, make_build_context
from sless_core.crcodec import FunctionCode
from sless_core.models import FunctionSpec
from tests.k8s.conftest import CRDS, SLESS_KINDS, Operator, strip_finalizers
from tests.support.platform import REPO, SECRET, Tenant
from tests.support.quotas import wait_counted
from tests.support.realnode import RealNode, http_get
from tests.support.services import free_port, tools_dir

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1800)]

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


@pytest.fixture
def s3_on_bridge(real_node: RealNode, tmp_path: Path) -> Iterator[str]:
    with s3_server(real_node, tmp_path) as endpoint:
        yield endpoint


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
    bed = real_node.bed
    bed.kubectl("apply", "-f", str(CRDS))
    bed.wait_established(*SLESS_KINDS)
    wait_counted(bed)  # the tenant quota counts them


def test_operator_builds_and_serves_a_hello_function(real_node: RealNode, s3_on_bridge: str, tmp_path: Path) -> None:
    from minio import Minio

    bed = real_node.bed
    apply_crds(real_node)
    tenant = f"sless-{secrets.token_hex(8)}"
    code = tmp_path / "hello"
    code.mkdir()
    (code / "handler.py").write_text('def handle(event):\n    return {"hello": event.get("name", "world")}\n')
    code_hash = code_tree_hash(code)
    context = make_build_context(code, "python3.11", "handler.handle", real_node.image("sless/python3.11"),
                                 code_hash=code_hash)  # fmt: skip
    key = f"contexts/{tenant}/hello/{code_hash}.tar.gz"
    s3 = Minio(s3_on_bridge, access_key=ACCESS, secret_key=SECRET_KEY, secure=False)
    s3.put_object(BUCKET, key, io.BytesIO(context), len(context))

    bed.apply({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": tenant, "labels": crd.tenant_namespace_labels()}})  # fmt: skip
    build_ns = build_namespace(real_node)
    op = Operator(bed, tenant, build_ns, tmp_path, extra_env=operator_env(real_node, s3_on_bridge)).start()
    start = time.monotonic()
    try:
        spec = FunctionSpec.from_user({"name": "hello", "runtime": "python3.11", "entrypoint": "handler.handle",
                                       "memory_mb": 128, "timeout_sec": 10}, 3600)
        code = FunctionCode(code_hash=code_hash, context_key=key)
        bed.apply(crcodec.manifest("Function", tenant, "hello", crcodec.function_spec_to_cr(spec) | code.to_cr()))

        def ready() -> dict[str, object] | None:
            fn = bed.get("functions.sless.dev", "hello", "-n", tenant) or {}
            status = fn.get("status", {})
            if status.get("phase") == "Failed":
                raise AssertionError(f"the function failed: {json.dumps(status)}\n{op.log_tail()}")
            return dict(status) if status.get("phase") == "Ready" else None

        try:
            status = bed.wait("the Function Ready", ready, timeout=600, interval=1)
        except AssertionError as exc:
            jobs = bed.kubectl("get", "jobs,pods", "-n", build_ns, "-o", "wide", check=False).stdout
            raise AssertionError(f"{exc}\n{jobs}\n{op.log_tail()}") from None
        print(f"Function Ready (built and rolled out) in {time.monotonic() - start:.1f}s: {status.get('image')}")
        assert str(status.get("image", "")).startswith(f"{real_node.registry}/sless/")

        cluster_ip = bed.get("service", "hello", "-n", tenant)["spec"]["clusterIP"]
        answer = bed.wait("the function answers", lambda: _get_json(f"http://{cluster_ip}:8080/?x=1"), timeout=60)
        assert answer == {"hello": "world"}
    finally:
        op.stop()
        strip_finalizers(bed, tenant)
        bed.kubectl("delete", "namespace", tenant, build_ns, "--wait=false", check=False)


def _get_json(url: str) -> object:
    try:
        status, body = http_get(url, timeout=3)
    except OSError:
        return None
    return json.loads(body) if status == 200 else None


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
        "SLESS_GO_RUN_IMAGE": real_node.image("sless-testbed/static"), **(extra_env or {}),
    }  # fmt: skip
    env.pop("SLESS_DATABASE_URL", None)
    env.pop("SLESS_RABBITMQ_URL", None)
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


@pytest.fixture
def api_url(real_node: RealNode, s3_on_bridge: str, tmp_path: Path) -> Iterator[str]:
    with api_server(real_node, s3_on_bridge, tmp_path) as url:
        yield url


HANDLERS: dict[str, dict[str, str | bytes]] = {
    "python3.11": {"handler.py": 'def handle(event):\n    return {"hello": event.get("name", "world")}\n'},
    "nodejs20": {"handler.js": 'exports.handle = async (event) => ({ hello: event.name ?? "world" });\n'},
    "go1.23": {"handler.go": 'package function\n\nimport "context"\n\n'
               "func Handle(ctx context.Context, event map[string]any) (any, error) {\n"
               '\treturn map[string]any{"hello": event["name"]}, nil\n}\n'},
}  # fmt: skip


@pytest.mark.parametrize("runtime", list(HANDLERS))
def test_api_fn_reaches_a_function_the_operator_built(
    real_node: RealNode, s3_on_bridge: str, api_url: str, tmp_path: Path, runtime: str
) -> None:
    import requests

    bed = real_node.bed
    t = Tenant(api_url, f"realnode-{secrets.token_hex(4)}")
    t.api("POST", "/ensure", expect=201)
    build_ns = build_namespace(real_node)
    op = Operator(bed, t.ns, build_ns, tmp_path, extra_env=operator_env(real_node, s3_on_bridge)).start()
    start = time.monotonic()
    try:
        t.api("POST", "/functions", json={"name": "hello", "runtime": runtime}, expect=201)
        t.upload("hello", HANDLERS[runtime])
        t.api("POST", "/triggers", json={"name": "hello", "type": "http", "function": "hello"}, expect=201)

        def ready() -> dict[str, object] | None:
            body = t.api("GET", "/functions/hello", expect=200).json()
            if body["phase"] == "Failed":
                raise AssertionError(f"the function failed: {body}\n{build_logs(real_node, build_ns)}")
            return dict(body) if body["phase"] == "Ready" else None

        body = bed.wait("the function Ready through the API", ready, timeout=600, interval=1)
        print(f"{runtime}: upload -> Ready through the API and the operator: {time.monotonic() - start:.1f}s")
        if runtime == "go1.23":  # compiled in a Job of the tenant namespace; the binary fetched at start
            assert body["image"] == real_node.image("sless-testbed/static"), body
        else:  # no dependencies: the runtime's own image, the code fetched at start
            assert body["image"] == real_node.image(f"sless/{runtime}"), body

        last: list[str] = []

        def answered() -> object:
            resp = requests.post(t.fn_url("hello", "/greet"), json={"name": "real node"}, timeout=30)
            last[:] = [f"{resp.status_code} {resp.text[:300]}"]
            return resp.json() if resp.status_code == 200 else None

        try:
            assert bed.wait("/fn answers", answered, timeout=120) == {"hello": "real node"}
        except AssertionError as exc:
            pods = bed.kubectl("get", "pods", "-n", t.ns, "-o", "wide", check=False).stdout
            logs = bed.kubectl("logs", "-n", t.ns, "deployment/hello", "--tail=30", check=False)
            raise AssertionError(f"{exc}; last answer: {last}\n{pods}\n{logs.stdout}{logs.stderr}") from None
    finally:
        op.stop()
        strip_finalizers(bed, t.ns)
        bed.kubectl("delete", "namespace", t.ns, build_ns, "--wait=false", check=False)
