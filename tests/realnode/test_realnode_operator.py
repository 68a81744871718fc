"""The sless operator builds a hello function for real and the function answers.

What the API would do is done by hand (build context in S3, Function resource); the operator
process is the real one: build Job (fetch-context from S3, kaniko, push to the test bed's
registry), Deployment in a `restricted` tenant namespace, Service. Then the Service answers.
"""

from __future__ import annotations

import io
import json
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sless_api.buildcontext import code_tree_hash, make_build_context
from sless_core import crd
from sless_operator import manifests
from tests.k8s.conftest import CRDS, SLESS_KINDS, Operator, strip_finalizers
from tests.support.realnode import RealNode, http_get
from tests.support.services import tools_dir

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1800)]

ACCESS, SECRET, BUCKET = "sless-test-access", "sless-test-secret", "sless"


@pytest.fixture
def s3_on_bridge(real_node: RealNode, tmp_path: Path) -> Iterator[str]:
    """moto_server on the bridge IP, so the build Job's fetch-context container reaches it."""
    exe = tools_dir() / "moto-venv" / "bin" / "moto_server"
    if not exe.exists():
        pytest.skip(f"{exe} is missing (scripts/install-test-services.sh installs it)")
    with socket.socket() as sock:
        sock.bind((real_node.node_ip, 0))
        port = sock.getsockname()[1]
    endpoint = f"{real_node.node_ip}:{port}"
    with open(tmp_path / "moto.log", "wb") as log:
        proc = subprocess.Popen([str(exe), "-H", real_node.node_ip, "-p", str(port)], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        real_node.bed.wait("moto_server answers", lambda: _answers(f"http://{endpoint}/"), timeout=60)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _answers(url: str) -> bool:
    try:
        return http_get(url, timeout=2)[0] == 200
    except OSError:
        return False


def test_operator_builds_and_serves_a_hello_function(real_node: RealNode, s3_on_bridge: str, tmp_path: Path) -> None:
    from minio import Minio

    bed = real_node.bed
    bed.kubectl("apply", "-f", str(CRDS))
    bed.kubectl("wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{k}" for k in SLESS_KINDS],
                timeout=90)  # fmt: skip
    tenant = f"sless-{secrets.token_hex(8)}"
    build_ns = f"sless-build-{secrets.token_hex(4)}"
    code = tmp_path / "hello"
    code.mkdir()
    (code / "handler.py").write_text('def handle(event):\n    return {"hello": event.get("name", "world")}\n')
    code_hash = code_tree_hash(code)
    context = make_build_context(code, "python3.11", "handler.handle", real_node.image("sless/python3.11"),
                                 code_hash=code_hash)  # fmt: skip
    key = f"contexts/{tenant}/hello/{code_hash}.tar.gz"
    s3 = Minio(s3_on_bridge, access_key=ACCESS, secret_key=SECRET, secure=False)
    s3.make_bucket(BUCKET)
    s3.put_object(BUCKET, key, io.BytesIO(context), len(context))

    bed.apply(
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": tenant, "labels": manifests.tenant_namespace_labels()}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": build_ns, "labels": {
            "pod-security.kubernetes.io/enforce": "baseline"}}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sless-build-s3", "namespace": build_ns},
         "stringData": {"AWS_ACCESS_KEY_ID": ACCESS, "AWS_SECRET_ACCESS_KEY": SECRET}},
    )  # fmt: skip
    op = Operator(bed, tenant, build_ns, tmp_path, extra_env={
        "SLESS_REGISTRY": f"{real_node.registry}/sless", "SLESS_REGISTRY_INSECURE": "true",
        "SLESS_KANIKO_IMAGE": real_node.image("sless-testbed/kaniko-executor"),
        "SLESS_BUILD_FETCH_IMAGE": real_node.image("sless-testbed/platform-fetch"),
        "SLESS_S3_ENDPOINT": s3_on_bridge, "SLESS_S3_BUCKET": BUCKET, "SLESS_BUILD_CACHE": "false",
        "SLESS_BUILD_CPU": "500m", "SLESS_BUILD_MEMORY_MB": "1024", "SLESS_BUILD_RETRIES": "0",
    }).start()  # fmt: skip
    start = time.monotonic()
    try:
        spec = {"runtime": "python3.11", "entrypoint": "handler.handle", "memory_mb": 128, "timeout_sec": 10}
        bed.apply({"apiVersion": "sless.dev/v1alpha1", "kind": "Function",
                   "metadata": {"name": "hello", "namespace": tenant},
                   "spec": crd.function_spec_to_cr(spec, code_hash=code_hash, context_key=key)})  # fmt: skip

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
