"""Code fetched at pod start on a real kubelet: a code-only change serves without a build, and a pod
whose archive is altered or gone does not start, the Function saying why.

Everything is real: the API stores the code archive in S3 (moto on the bridge), the operator signs
its URL into the function's Secret, the kubelet starts the runtime image, which fetches, checks and unpacks
its code itself (``runtimes/python3.11/sless_fetch.py``) before it listens.
"""

from __future__ import annotations

import base64
import io
import json
import secrets
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from tests.support.kube_operator import Operator, strip_finalizers
from tests.support.platform import Tenant
from tests.support.realnode import RealNode
from tests.support.realnode_operator import ACCESS, BUCKET, SECRET_KEY, build_namespace, operator_env

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1200)]


def handler(version: str) -> dict[str, str | bytes]:
    return {"handler.py": f"def handle(event):\n    return {{'version': {version!r}}}\n"}


def serves(t: Tenant, version: str) -> bool:
    import requests

    try:
        resp = requests.get(t.fn_url("fast"), timeout=10)
    except requests.RequestException:
        return False
    return resp.status_code == 200 and resp.json() == {"version": version}


def _answer(t: Tenant) -> dict[str, Any]:
    import requests

    try:
        resp = requests.get(t.fn_url("fast"), timeout=10)
        return dict(resp.json()) if resp.status_code == 200 else {}
    except (requests.RequestException, ValueError):
        return {}


def _phase(t: Tenant, want: str) -> dict[str, Any] | None:
    body: dict[str, Any] = t.api("GET", "/functions/fast", expect=200).json()
    return body if body["phase"] == want else None


def test_code_only_change_serves_without_a_build_and_a_bad_archive_fails_the_pod(
    real_node: RealNode, s3_on_bridge: str, api_url: str, tmp_path: Path
) -> None:
    from minio import Minio

    bed = real_node.bed
    t = Tenant(api_url, f"fast-{secrets.token_hex(4)}")
    t.api("POST", "/ensure", expect=201)
    build_ns = build_namespace(real_node)
    op = Operator(bed, t.ns, build_ns, tmp_path, extra_env=operator_env(real_node, s3_on_bridge)).start()
    try:
        t.api("POST", "/functions", json={"name": "fast", "runtime": "python3.11"}, expect=201)
        t.upload("fast", handler("one"))
        t.api("POST", "/triggers", json={"name": "fast", "type": "http", "function": "fast"}, expect=201)
        bed.wait("v1 serves", lambda: serves(t, "one"), timeout=300, interval=0.5)

        start = time.monotonic()
        t.upload("fast", handler("two"))
        bed.wait("v2 serves", lambda: serves(t, "two"), timeout=120, interval=0.2)
        print(f"code-only change: upload -> new code answering in {time.monotonic() - start:.1f}s")
        jobs = bed.get("jobs", "-n", build_ns) or {}
        assert jobs.get("items", []) == [], "a code-only change ran a build"

        # tenant isolation: the pod has no S3 credential, only a URL signed for its own object (S3 checks the
        # signature over the path, moto does not: that another tenant's key is never signed is the kwok test
        # test_a_function_cannot_name_another_tenants_code)
        pod = (bed.get("pods", "-n", t.ns, "-l", "sless.dev/function=fast") or {})["items"][0]["spec"]
        assert "initContainers" not in pod, "the Python runtime fetches its code itself"
        containers = pod["containers"]
        assert not any("envFrom" in c for c in containers)
        names = {e["name"] for c in containers for e in c.get("env", [])}
        assert not names & {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "SLESS_S3_ACCESS_KEY"}, names
        secret = bed.get("secret", "sless-code-fast", "-n", t.ns)
        url = base64.b64decode(secret["data"]["url"]).decode()
        spec = bed.get("functions.sless.dev", "fast", "-n", t.ns)["spec"]
        assert urllib.parse.urlsplit(url).path == f"/{BUCKET}/{spec['codeKey']}"
        assert "X-Amz-Signature=" in url and "X-Amz-Credential=" in url
        # the handler never sees the URL: the runtime takes it out of its environment before loading it
        t.upload("fast", {"handler.py": "import os\ndef handle(event):\n    return {'version': 'three', "
                                        "'url': os.environ.get('SLESS_CODE_URL'), 'writable': os.access("
                                        "__file__, os.W_OK)}\n"})
        # until the rollout is over: the old pod serves beside the new one until it is gone
        def only_v3() -> bool:
            pods = (bed.get("pods", "-n", t.ns, "-l", "sless.dev/function=fast") or {}).get("items", [])
            alone = len(pods) == 1 and "deletionTimestamp" not in pods[0]["metadata"]
            return alone and _answer(t).get("version") == "three"

        bed.wait("v3 serves alone", only_v3, timeout=180, interval=0.2)
        assert _answer(t) == {"version": "three", "url": None, "writable": False}
        spec = bed.get("functions.sless.dev", "fast", "-n", t.ns)["spec"]

        # the stored archive altered: a new pod refuses it, the old one keeps serving
        s3 = Minio(s3_on_bridge, access_key=ACCESS, secret_key=SECRET_KEY, secure=False)
        evil = b"not the code"
        s3.put_object(BUCKET, spec["codeKey"], io.BytesIO(evil), len(evil))
        # a second replica (the Function's spec: the operator owns the Deployment's count) must fetch it
        bed.kubectl("-n", t.ns, "patch", "functions.sless.dev", "fast", "--type=merge", "-p",
                    json.dumps({"spec": {"replicas": 2}}))
        failed = bed.wait("Failed with the reason", lambda: _phase(t, "Failed"), timeout=120, interval=1)
        assert "code archive" in failed["message"] and "SHA-256" in failed["message"], failed
        assert _answer(t).get("version") == "three"

        # the archive gone: the reason says so
        s3.remove_object(BUCKET, spec["codeKey"])
        # (the kubelet restarts the failed runtime container with backoff: the next attempt finds nothing)

        def missing() -> dict[str, Any] | None:
            body = _phase(t, "Failed")
            # the reason's own words: a SHA-256 in the earlier mismatch message may hold the digits "404"
            return body if body and "no such object" in body["message"] else None

        gone = bed.wait("Failed: archive missing", missing, timeout=240, interval=1)
        assert "no such object" in gone["message"], gone
    finally:
        op.stop()
        strip_finalizers(bed, t.ns)
        bed.kubectl("delete", "namespace", t.ns, build_ns, "--wait=false", check=False)
