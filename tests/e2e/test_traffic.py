"""Traffic splits through a real `sless up`: calls shared by weight between two versions, each record naming one."""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from typing import Any

import pytest
import requests

from tests.support.platform import Tenant, make_zip

pytestmark = pytest.mark.e2e

ONE = "def handle(event):\n    return 'one'\n"
TWO = "def handle(event):\n    return 'two'\n"
THREE = "def handle(event):\n    return 'three'\n"
BODY_VERSION = {"one": 1, "two": 2}


def code_hash(source: str) -> str:
    return hashlib.sha256(make_zip({"handler.py": source})).hexdigest()


def two_versions(tenant: Tenant) -> None:
    tenant.deploy("canary", "python3.11", {"handler.py": ONE})
    tenant.upload("canary", {"handler.py": TWO})
    tenant.wait_phase("canary", ("Ready",), code_hash=code_hash(TWO))


def calls(tenant: Tenant, count: int, tag: str) -> list[tuple[str, str]]:
    """COUNT calls in order: (request id, body) each."""
    out = []
    with requests.Session() as session:
        for i in range(count):
            rid = f"{tag}-{i:04d}"
            resp = session.get(tenant.fn_url("canary"), headers={"X-Request-Id": rid}, timeout=30)
            assert resp.status_code == 200, resp.text
            out.append((rid, resp.text))
    return out


def records(tenant: Tenant, ids: set[str]) -> dict[str, dict[str, Any]]:
    """The invocation records of the calls IDS (written in batches, a moment later)."""
    deadline = time.monotonic() + 30
    found: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        items = tenant.api("GET", "/functions/canary/invocations?limit=500", expect=200).json()["items"]
        found = {i["request_id"]: i for i in items if i["request_id"] in ids}
        if len(found) == len(ids):
            return found
        time.sleep(0.2)
    raise AssertionError(f"{len(ids) - len(found)} records missing")


def put_split(tenant: Tenant, split: list[dict[str, int]]) -> None:
    answer = tenant.api("PUT", "/functions/canary/traffic", json={"split": split}, expect=200).json()
    assert answer == {"split": split}


def test_a_split_shares_calls_by_weight_and_records_the_version(tenant: Tenant) -> None:
    two_versions(tenant)
    assert tenant.api("GET", "/functions/canary/traffic", expect=200).json() == {"split": None}
    plain = calls(tenant, 3, "plain")
    assert [body for _, body in plain] == ["two"] * 3
    assert {r["version"] for r in records(tenant, {rid for rid, _ in plain}).values()} == {2}

    # 0/100 and 100/0 are exact
    put_split(tenant, [{"version": 2, "weight": 0}, {"version": 1, "weight": 100}])
    assert [body for _, body in calls(tenant, 20, "all-one")] == ["one"] * 20
    put_split(tenant, [{"version": 2, "weight": 100}, {"version": 1, "weight": 0}])
    assert [body for _, body in calls(tenant, 20, "all-two")] == ["two"] * 20

    # 50/50 by smooth weighted round robin: exactly half each, alternating, the current version first
    put_split(tenant, [{"version": 2, "weight": 50}, {"version": 1, "weight": 50}])
    assert tenant.api("GET", "/functions/canary/traffic", expect=200).json() == {
        "split": [{"version": 2, "weight": 50}, {"version": 1, "weight": 50}]}
    half = calls(tenant, 200, "half")
    assert Counter(body for _, body in half) == {"one": 100, "two": 100}
    assert [body for _, body in half[:4]] == ["two", "one", "two", "one"]
    found = records(tenant, {rid for rid, _ in half})
    assert all(found[rid]["version"] == BODY_VERSION[body] for rid, body in half)

    # 90/10: every tenth call to version 1
    put_split(tenant, [{"version": 2, "weight": 90}, {"version": 1, "weight": 10}])
    tenth = calls(tenant, 100, "tenth")
    assert Counter(body for _, body in tenth) == {"two": 90, "one": 10}

    # dropped: every call to the current version again
    tenant.api("DELETE", "/functions/canary/traffic", expect=204)
    tenant.api("DELETE", "/functions/canary/traffic", expect=204)  # none: nothing to drop
    assert tenant.api("GET", "/functions/canary/traffic", expect=200).json() == {"split": None}
    assert [body for _, body in calls(tenant, 5, "dropped")] == ["two"] * 5


def test_a_deploy_drops_the_split(tenant: Tenant) -> None:
    two_versions(tenant)
    put_split(tenant, [{"version": 2, "weight": 50}, {"version": 1, "weight": 50}])
    tenant.api("PUT", "/functions/canary", json={"timeout_sec": 20}, expect=200)  # a new configuration
    assert tenant.api("GET", "/functions/canary/traffic", expect=200).json() == {"split": None}
    tenant.wait_phase("canary", ("Ready",))
    assert [body for _, body in calls(tenant, 4, "after-update")] == ["two"] * 4

    put_split(tenant, [{"version": 3, "weight": 50}, {"version": 1, "weight": 50}])
    tenant.upload("canary", {"handler.py": THREE})
    assert tenant.api("GET", "/functions/canary/traffic", expect=200).json() == {"split": None}
    tenant.wait_phase("canary", ("Ready",), code_hash=code_hash(THREE))
    assert [body for _, body in calls(tenant, 4, "after-upload")] == ["three"] * 4

    put_split(tenant, [{"version": 4, "weight": 50}, {"version": 1, "weight": 50}])
    tenant.api("POST", "/functions/canary/rollback", json={"version": 2}, expect=202)
    assert tenant.api("GET", "/functions/canary/traffic", expect=200).json() == {"split": None}


BAD_SPLITS = [
    ({"split": [{"version": 2, "weight": 60}, {"version": 1, "weight": 60}]}, "sum to 100"),
    ({"split": [{"version": 2, "weight": 90}, {"version": 1, "weight": 5}]}, "sum to 100"),
    ({"split": [{"version": 2, "weight": 50}, {"version": 1, "weight": 25}, {"version": 1, "weight": 25}]},
     "at most 2"),
    ({"split": [{"version": 2, "weight": 110}, {"version": 1, "weight": -10}]}, "from 0 to 100"),
    ({"split": [{"version": 2, "weight": 50.5}, {"version": 1, "weight": 49.5}]}, "integer"),
    ({"split": [{"version": 2, "weight": "50"}, {"version": 1, "weight": 50}]}, "integer"),
    ({"split": [{"version": 2, "weight": True}, {"version": 1, "weight": 99}]}, "integer"),
    ({"split": [{"version": "2", "weight": 50}, {"version": 1, "weight": 50}]}, "integer"),
    ({"split": [{"version": 2, "weight": 50}, {"version": 2, "weight": 50}]}, "twice"),
    ({"split": [{"version": 2}]}, "both"),
    ({"split": [{"version": 2, "weight": 100, "note": "x"}]}, "unknown field"),
    ({"split": []}, "list of 1 or 2"),
    ({"split": None}, "list of 1 or 2"),
    ({"split": [2]}, "must be an object"),
    ({"weights": [50, 50]}, "unknown field"),
    ({}, "split is required"),
    ([{"version": 2, "weight": 100}], "JSON object"),
]


def test_bad_splits_are_refused_with_a_reason(tenant: Tenant) -> None:
    tenant.api("POST", "/ensure", expect=(200, 201))
    tenant.api("POST", "/functions", json={"name": "canary", "runtime": "python3.11"}, expect=201)
    assert "no deployed version" in tenant.api(
        "PUT", "/functions/canary/traffic", json={"split": [{"version": 1, "weight": 100}]}, expect=409).json()["error"]
    two_versions_after_create(tenant)
    for body, reason in BAD_SPLITS:
        err = tenant.api("PUT", "/functions/canary/traffic", json=body, expect=400).json()
        assert reason in err["error"], (body, err)
    malformed = tenant.api("PUT", "/functions/canary/traffic", data=b'{"split": [', expect=400,
                           headers={"Content-Type": "application/json"}).json()  # fmt: skip
    assert "error" in malformed
    tenant.api("PUT", "/functions/canary/traffic", data=b"{}", expect=415, headers={"Content-Type": "text/plain"})
    unknown = tenant.api("PUT", "/functions/canary/traffic", expect=404,
                         json={"split": [{"version": 2, "weight": 50}, {"version": 7, "weight": 50}]}).json()
    assert "no version 7 (kept: 1, 2)" in unknown["error"]
    without_current = tenant.api("PUT", "/functions/canary/traffic", expect=409,
                                 json={"split": [{"version": 1, "weight": 100}]}).json()  # fmt: skip
    assert "current version 2" in without_current["error"]
    tenant.api("PUT", "/functions/nope/traffic", json={"split": [{"version": 1, "weight": 100}]}, expect=404)
    tenant.api("GET", "/functions/nope/traffic", expect=404)
    tenant.api("DELETE", "/functions/nope/traffic", expect=404)
    tenant.api("GET", "/functions/Bad_Name/traffic", expect=400)
    assert tenant.api("GET", "/functions/canary/traffic", expect=200).json() == {"split": None}


def two_versions_after_create(tenant: Tenant) -> None:
    tenant.upload("canary", {"handler.py": ONE})
    tenant.wait_phase("canary", ("Ready",), code_hash=code_hash(ONE))
    tenant.upload("canary", {"handler.py": TWO})
    tenant.wait_phase("canary", ("Ready",), code_hash=code_hash(TWO))


def test_another_tenant_cannot_read_or_set_a_split(tenant: Tenant, other_tenant: Tenant) -> None:
    tenant.deploy("canary", "python3.11", {"handler.py": ONE})
    other = Tenant(other_tenant.url, other_tenant.sub)
    other.ns = tenant.ns  # the other tenant's token, this tenant's namespace
    other.api("GET", "/functions/canary/traffic", expect=403)
    other.api("PUT", "/functions/canary/traffic", json={"split": [{"version": 1, "weight": 100}]}, expect=403)
    other.api("DELETE", "/functions/canary/traffic", expect=403)
