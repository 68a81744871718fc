"""A Go function on a real kubelet: a code-only change compiles in a Job of the tenant namespace and serves
without an image build; code that does not compile fails the Function with the compiler's message.

Everything is real: the API stores the code archive in S3 (moto on the bridge), the operator signs a GET
URL of it and a PUT URL of the binary's key into the compile Job, the kubelet runs ``fetch-code``,
``runtimes/go1.23/build.sh`` on the Go runtime image (as uid 1000 under Pod Security ``restricted``)
and ``binaryupload``; the function's pods fetch the binary, check its SHA-256 and run it on the
distroless stand-in.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.kube_operator import Operator, strip_finalizers
from tests.support.platform import Tenant
from tests.support.realnode import RealNode
from tests.support.realnode_operator import build_namespace, operator_env

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1200)]


def handler(version: int, body: str = "") -> dict[str, str | bytes]:
    body = body or f'return map[string]any{{"version": {version}}}, nil'
    return {"handler.go": 'package function\n\nimport "context"\n\n'
            f"func Handle(ctx context.Context, event map[string]any) (any, error) {{\n\t{body}\n}}\n"}  # fmt: skip


def serves(t: Tenant, version: int) -> bool:
    import requests

    try:
        resp = requests.get(t.fn_url("gofn"), timeout=10)
    except requests.RequestException:
        return False
    return resp.status_code == 200 and resp.json() == {"version": version}


def test_a_go_code_change_compiles_in_the_tenant_namespace_and_bad_code_says_why(
    real_node: RealNode, s3_on_bridge: str, api_url: str, tmp_path: Path
) -> None:
    bed = real_node.bed
    t = Tenant(api_url, f"gofast-{secrets.token_hex(4)}")
    t.api("POST", "/ensure", expect=201)
    build_ns = build_namespace(real_node)
    op = Operator(bed, t.ns, build_ns, tmp_path, extra_env=operator_env(real_node, s3_on_bridge)).start()
    try:
        t.api("POST", "/functions", json={"name": "gofn", "runtime": "go1.23"}, expect=201)
        t.upload("gofn", handler(1))
        t.api("POST", "/triggers", json={"name": "gofn", "type": "http", "function": "gofn"}, expect=201)
        bed.wait("v1 serves", lambda: serves(t, 1), timeout=300, interval=0.5)

        start = time.monotonic()
        t.upload("gofn", handler(2))
        bed.wait("v2 serves", lambda: serves(t, 2), timeout=180, interval=0.2)
        print(f"Go code-only change: upload -> new code answering in {time.monotonic() - start:.1f}s")
        assert (bed.get("jobs", "-n", build_ns) or {}).get("items", []) == [], "a Go code change ran kaniko"
        jobs = (bed.get("jobs", "-n", t.ns, "-l", "sless.dev/component=compile") or {})["items"]
        assert len(jobs) == 2 and all(j["status"].get("succeeded") == 1 for j in jobs)
        pod = (bed.get("pods", "-n", t.ns, "-l", "sless.dev/component=function") or {})["items"][0]["spec"]
        assert pod["containers"][0]["image"] == real_node.image("sless-testbed/static")

        t.upload("gofn", handler(3, 'return undefinedName, nil'))

        def failed() -> dict[str, Any] | None:
            body: dict[str, Any] = t.api("GET", "/functions/gofn", expect=200).json()
            return body if body["phase"] == "Failed" else None

        record = bed.wait("Failed with the compiler's message", failed, timeout=180, interval=0.5)
        assert "compile failed" in record["message"], record
        assert "handler.go" in record["message"] and "undefined: undefinedName" in record["message"], record
        assert serves(t, 2)  # what served keeps serving
    finally:
        op.stop()
        strip_finalizers(bed, t.ns)
        bed.kubectl("delete", "namespace", t.ns, build_ns, "--wait=false", check=False)
