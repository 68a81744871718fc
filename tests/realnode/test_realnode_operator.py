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

import io
import json
import secrets
import time
from pathlib import Path

import pytest

from sless_core import crcodec, crd
from sless_core.buildcontext import code_tree_hash, make_build_context
from sless_core.crcodec import FunctionCode
from sless_core.models import FunctionSpec
from tests.support.kube_operator import Operator, strip_finalizers
from tests.support.platform import Tenant
from tests.support.realnode import RealNode, http_get
from tests.support.realnode_operator import (
    ACCESS,
    BUCKET,
    SECRET_KEY,
    apply_crds,
    build_logs,
    build_namespace,
    operator_env,
)

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1800)]


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
