"""A traffic split on a real kubelet: two versions answer side by side and calls are shared by weight.

Everything is real: the API stores both versions' archives in S3 (moto on the bridge), the operator runs the
split's other version as ``<name>-split-<hash>`` (its own Deployment, Service and signed code URL: no build), and the
API's router sends calls to both Services through the tenant's NetworkPolicy.
"""

from __future__ import annotations

import secrets
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sless_core import crd
from sless_core.traffic import other_version_name
from tests.support.kube_operator import Operator, strip_finalizers
from tests.support.platform import Tenant, invocation_record
from tests.support.realnode import RealNode
from tests.support.realnode_operator import build_namespace, operator_env

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1200)]


def handler(body: str) -> dict[str, str | bytes]:
    return {"handler.py": f"def handle(event):\n    return {body!r}\n"}


def answer(t: Tenant, rid: str | None = None) -> str | None:
    import requests

    headers = {"X-Request-Id": rid} if rid else {}
    try:
        resp = requests.get(t.fn_url("canary"), headers=headers, timeout=10)
    except requests.RequestException:
        return None
    return resp.text if resp.status_code == 200 else None


def test_a_split_shares_calls_between_two_running_versions(
    real_node: RealNode, s3_on_bridge: str, api_url: str, tmp_path: Path
) -> None:
    bed = real_node.bed
    t = Tenant(api_url, f"split-{secrets.token_hex(4)}")
    t.api("POST", "/ensure", expect=201)
    build_ns = build_namespace(real_node)
    op = Operator(bed, t.ns, build_ns, tmp_path, extra_env=operator_env(real_node, s3_on_bridge)).start()
    try:
        t.api("POST", "/functions", json={"name": "canary", "runtime": "python3.11"}, expect=201)
        t.upload("canary", handler("one"))
        t.api("POST", "/triggers", json={"name": "canary", "type": "http", "function": "canary"}, expect=201)
        bed.wait("v1 serves", lambda: answer(t) == "one", timeout=300, interval=0.5)
        t.upload("canary", handler("two"))
        bed.wait("v2 serves", lambda: answer(t) == "two", timeout=120, interval=0.2)
        bed.wait("two versions", lambda: len(t.api("GET", "/functions/canary/versions", expect=200).json()["items"])
                 == 2, timeout=60)  # fmt: skip

        half = [{"version": 2, "weight": 50}, {"version": 1, "weight": 50}]
        t.api("PUT", "/functions/canary/traffic", json={"split": half}, expect=200)

        def split_status() -> Any:
            return ((bed.get(f"{crd.FUNCTION_PLURAL}.{crd.GROUP}", "canary", "-n", t.ns) or {}).get("status")
                    or {}).get("split")  # fmt: skip

        bed.wait("the other version ready", lambda: split_status() == {"version": 1, "ready": True}, timeout=180)
        bed.wait("calls reach version 1", lambda: answer(t) == "one" or answer(t) == "one", timeout=60, interval=0.2)
        assert (bed.get("jobs", "-n", build_ns) or {}).get("items", []) == [], "the split's version was built"

        bodies = [(f"split-{i:03d}", answer(t, f"split-{i:03d}")) for i in range(200)]
        assert Counter(body for _, body in bodies) == {"one": 100, "two": 100}
        for rid, body in bodies[-10:]:  # the newest records (a page holds 100)
            assert invocation_record(t, "canary", rid)["version"] == {"one": 1, "two": 2}[body]

        t.api("DELETE", "/functions/canary/traffic", expect=204)
        other = other_version_name("canary")
        bed.wait("the other version removed", lambda: bed.get("deployment", other, "-n", t.ns) is None,
                 timeout=120)  # fmt: skip
        assert [answer(t) for _ in range(6)] == ["two"] * 6
    finally:
        op.stop()
        strip_finalizers(bed, t.ns)
        bed.kubectl("delete", "namespace", t.ns, "--wait=false", "--ignore-not-found", check=False)
