"""The REST contract of the README, case by case, against both backends (see conftest.py).

Every case runs unchanged on ``sless up`` and on the kubernetes backend with its operator: status
codes, error shapes, paging, cascades, jobs, triggers. Where the two must agree on a value (a
message, a phase), the case says it once. Cases that need a function to really run are marked
``needs_running``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests

from sless_core.models import MAX_RUN_ID
from tests.support import poll
from tests.support.backends import Backend
from tests.support.platform import Tenant, make_zip

pytestmark = [pytest.mark.e2e, pytest.mark.rabbitmq, pytest.mark.slow]

HELLO = {"handler.py": "def handle(event):\n    return {'hello': event.get('name')}\n\n"
                       "def other(event):\n    return 'other'\n"}
FUNCTION_FIELDS = {"name", "runtime", "entrypoint", "memory_mb", "timeout_sec", "env_vars", "secrets",
                   "max_concurrency", "sandbox", "scale", "namespace", "phase", "message", "code_hash", "image",
                   "created_at", "last_built_at"}
TRIGGER_FIELDS = {"name", "type", "function", "enabled", "schedule", "queue", "auth", "namespace", "created_at",
                  "last_fired_at", "message", "delivery", "methods", "cors", "path"}
JOB_FIELDS = {"name", "function", "event", "run_id", "namespace", "phase", "message", "started_at",
              "completed_at", "created_at"}


def until(what: str, probe: Callable[[], Any], timeout: float = 120, interval: float = 0.3) -> Any:
    """:func:`tests.support.poll.until` with this module's defaults: two minutes fit a build on either backend."""
    return poll.until(what, probe, timeout, interval)


def wait_for(tenant: Tenant, rest: str, check: Callable[[dict[str, Any]], bool],
             timeout: float = 120) -> dict[str, Any]:
    """GET REST until CHECK holds for its JSON body; that body."""

    def probe() -> dict[str, Any] | None:
        body: dict[str, Any] = tenant.api("GET", rest, expect=200).json()
        return body if check(body) else None

    found: dict[str, Any] = until(f"GET {rest}", probe, timeout)
    return found


def error_of(resp: requests.Response, status: int, field: str | None = None) -> dict[str, Any]:
    """The README's error shape: JSON ``{"error": "...", "field"?: ...}`` with the status code."""
    assert resp.status_code == status, f"{resp.status_code} {resp.text[:500]}"
    assert resp.headers["Content-Type"].startswith("application/json"), resp.headers
    body: dict[str, Any] = resp.json()
    assert isinstance(body.get("error"), str) and body["error"], body
    assert "Traceback" not in resp.text
    if field is not None:
        assert body.get("field") == field, body
    return body


def uploaded(tenant: Tenant, name: str, files: dict[str, str | bytes], backend: Backend) -> dict[str, Any]:
    """Create NAME, upload FILES and wait until it is Ready."""
    tenant.api("POST", "/functions", json={"name": name, "runtime": "python3.11"}, expect=201)
    tenant.upload(name, files)
    return tenant.wait_phase(name, ("Ready",), backend.build_wait_sec)


def names(items: list[dict[str, Any]]) -> list[str]:
    return [i["name"] for i in items]


# namespaces and tenancy

def test_ensure_is_idempotent_and_whoami_names_the_namespace(backend: Backend) -> None:
    t = backend.tenant("ensure")
    assert t.api("POST", "/ensure", expect=201).json() == {"namespace": t.ns, "created": True}
    assert t.api("POST", "/ensure", expect=200).json() == {"namespace": t.ns, "created": False}
    who = t.http.get(f"{t.url}/v1/whoami", timeout=30).json()
    assert who == {"sub": t.sub, "namespace": t.ns, "admin": False}


def test_another_tenants_namespace_is_403_and_bad_tokens_401(backend: Backend, tenant: Tenant) -> None:
    tenant.api("POST", "/functions", json={"name": "mine", "runtime": "python3.11"}, expect=201)
    intruder = backend.tenant("intruder")
    intruder.ns = tenant.ns
    for method, rest in (("GET", "/functions"), ("GET", "/functions/mine"), ("DELETE", "/functions/mine"),
                         ("POST", "/ensure"), ("GET", "/triggers")):
        error_of(intruder.api(method, rest), 403)
    anonymous = requests.get(f"{tenant.url}/v1/namespaces/{tenant.ns}/functions", timeout=30)
    error_of(anonymous, 401)
    error_of(tenant.api("GET", "/functions/mine", headers={"Authorization": "Bearer not-a-token"}), 401)
    tenant.api("GET", "/functions/mine", expect=200)


# functions

def test_function_create_read_update_delete(tenant: Tenant) -> None:
    body = {"name": "crud", "runtime": "python3.11", "memory_mb": 256, "env_vars": {"B": "2", "A": "1"}}
    created = tenant.api("POST", "/functions", json=body, expect=201).json()
    assert set(created) == FUNCTION_FIELDS
    assert (created["phase"], created["message"], created["code_hash"], created["image"]) == (
        "Pending", "waiting for code: upload a zip", None, None)
    assert (created["namespace"], created["entrypoint"], created["timeout_sec"]) == (tenant.ns, "handler.handle", 30)
    assert list(created["env_vars"]) == ["A", "B"]

    dup = error_of(tenant.api("POST", "/functions", json={**body, "memory_mb": 512}), 409)
    assert dup["existing"]["memory_mb"] == 256

    got = tenant.api("GET", "/functions/crud", expect=200).json()
    assert {k: got[k] for k in ("name", "runtime", "memory_mb", "env_vars")} == {
        "name": "crud", "runtime": "python3.11", "memory_mb": 256, "env_vars": {"A": "1", "B": "2"}}

    updated = tenant.api("PUT", "/functions/crud", json={"env_vars": {"C": "3"}, "timeout_sec": 60},
                         expect=200).json()
    assert (updated["env_vars"], updated["timeout_sec"], updated["memory_mb"]) == ({"C": "3"}, 60, 256)
    error_of(tenant.api("PUT", "/functions/crud", json={"memory_mb": 1}), 400, "memory_mb")
    error_of(tenant.api("PUT", "/functions/crud", json={"env_vars": {"PORT": "1"}}), 400, "env_vars")
    error_of(tenant.api("PUT", "/functions/crud", json={"name": "other"}), 400, "name")
    error_of(tenant.api("PUT", "/functions/crud", json=["not", "an", "object"]), 400)
    assert tenant.api("GET", "/functions/crud", expect=200).json()["env_vars"] == {"C": "3"}

    tenant.api("DELETE", "/functions/crud", expect=204)
    error_of(tenant.api("GET", "/functions/crud"), 404)
    error_of(tenant.api("DELETE", "/functions/crud"), 404)
    error_of(tenant.api("PUT", "/functions/crud", json={"timeout_sec": 5}), 404)


@pytest.mark.parametrize(("spec", "field"), [
    ({"name": "Bad_Name", "runtime": "python3.11"}, "name"),
    ({"name": "x", "runtime": "cobol"}, "runtime"),
    ({"name": "x", "runtime": "python3.11", "timeout_sec": 0}, "timeout_sec"),
    ({"name": "x", "runtime": "python3.11", "entrypoint": "no-dots"}, "entrypoint"),
    ({"name": "x", "runtime": "go1.23", "entrypoint": "lower"}, "entrypoint"),
    ({"name": "x", "runtime": "python3.11", "surprise": 1}, "surprise"),
    ({"name": "x", "runtime": "python3.11", "env_vars": {"SLESS_X": "1"}}, "env_vars"),
])
def test_invalid_function_specs_are_400_with_the_field(tenant: Tenant, spec: dict[str, Any], field: str) -> None:
    error_of(tenant.api("POST", "/functions", json=spec), 400, field)


def has_keda(backend: Backend) -> bool:
    """Whether the backend can honour ``scale``: always standalone; on Kubernetes, a cluster that serves KEDA."""
    if backend.bed is None:
        return True
    found = backend.bed.kubectl("get", "--raw", "/apis/keda.sh/v1alpha1", check=False)
    return found.returncode == 0 and '"scaledobjects"' in found.stdout


def test_function_scale_is_stored_returned_changed_and_removed(backend: Backend, tenant: Tenant) -> None:
    """``scale``: null when absent; a given object is completed with the defaults; PUT and PATCH merge into it
    (the fields given change, the others stay), null removes it. On a Kubernetes cluster without KEDA it is refused
    (422, field scale) and nothing is made."""
    plain = tenant.api("POST", "/functions", json={"name": "fixed", "runtime": "python3.11"}, expect=201).json()
    assert plain["scale"] is None
    body = {"name": "elastic", "runtime": "python3.11", "scale": {"min": 1, "max": 4}}
    if not has_keda(backend):
        refused = error_of(tenant.api("POST", "/functions", json=body), 422, "scale")
        assert "scaling needs KEDA, which this cluster does not have" in refused["error"]
        error_of(tenant.api("GET", "/functions/elastic"), 404)
        error_of(tenant.api("PATCH", "/functions/fixed", json={"scale": {"max": 2}}), 422, "scale")
        # a change that leaves scale out (or removes it) needs no KEDA
        tenant.api("PATCH", "/functions/fixed", json={"memory_mb": 256, "scale": None}, expect=200)
        return
    created = tenant.api("POST", "/functions", json=body, expect=201).json()
    assert created["scale"] == {"min": 1, "max": 4, "target": 10, "idle_sec": 300}
    assert tenant.api("GET", "/functions/elastic", expect=200).json()["scale"] == created["scale"]
    listed = tenant.api("GET", "/functions", expect=200).json()["items"]
    assert {f["name"]: f["scale"] for f in listed} == {"elastic": created["scale"], "fixed": None}

    changed = tenant.api("PUT", "/functions/elastic", json={"scale": {"max": 8, "target": 3, "idle_sec": 60}},
                         expect=200).json()
    assert changed["scale"] == {"min": 1, "max": 8, "target": 3, "idle_sec": 60}, "min was kept"
    other = tenant.api("PATCH", "/functions/elastic", json={"memory_mb": 256}, expect=200).json()
    assert (other["scale"], other["memory_mb"]) == (changed["scale"], 256), "a change without scale keeps it"
    error_of(tenant.api("PATCH", "/functions/elastic", json={"scale": {"min": 9, "max": 8}}), 400, "scale.min")
    assert tenant.api("GET", "/functions/elastic", expect=200).json()["scale"] == changed["scale"]

    removed = tenant.api("PATCH", "/functions/elastic", json={"scale": None}, expect=200).json()
    assert removed["scale"] is None
    assert tenant.api("GET", "/functions/elastic", expect=200).json()["scale"] is None
    added = tenant.api("PATCH", "/functions/fixed", json={"scale": {}}, expect=200).json()
    assert added["scale"] == {"min": 0, "max": 10, "target": 10, "idle_sec": 300}


@pytest.mark.parametrize(("scale", "field"), [
    ({"min": 5, "max": 2}, "scale.min"),  # min above max
    ({"min": -1}, "scale.min"),  # negative
    ({"max": 0}, "scale.max"),  # no replica at most
    ({"max": 1_000_000}, "scale.max"),  # huge
    ({"min": 101, "max": 100}, "scale.min"),  # beyond the replica bound
    ({"target": 0}, "scale.target"),
    ({"target": 1_000_000}, "scale.target"),
    ({"idle_sec": 1}, "scale.idle_sec"),  # too small
    ({"idle_sec": 10**9}, "scale.idle_sec"),  # huge
    ({"max": 2.5}, "scale.max"),  # not an integer
    ({"max": "3"}, "scale.max"),
    ({"min": True}, "scale.min"),  # booleans are no integers
    ({"replicas": 3}, "scale"),  # unknown key
    ({"idleSec": 60}, "scale"),  # the custom resource's spelling is not the API's
    ("fast", "scale"),  # not an object
    ([1, 2], "scale"),
    (True, "scale"),
    (3, "scale"),
], ids=["min-above-max", "negative-min", "zero-max", "huge-max", "min-beyond-bound", "zero-target", "huge-target",
        "idle-too-small", "idle-huge", "float-max", "string-max", "boolean-min", "unknown-key", "cr-spelling",
        "string", "list", "boolean", "number"])
def test_invalid_scale_is_400_naming_the_field(tenant: Tenant, scale: Any, field: str) -> None:
    created = error_of(tenant.api("POST", "/functions", json={"name": "sc", "runtime": "python3.11",
                                                                  "scale": scale}), 400, field)
    assert "scale" in created["error"]
    tenant.api("POST", "/functions", json={"name": "sc", "runtime": "python3.11"}, expect=201)
    for method in ("PUT", "PATCH"):
        error_of(tenant.api(method, "/functions/sc", json={"scale": scale}), 400, field)
    assert tenant.api("GET", "/functions/sc", expect=200).json()["scale"] is None


def test_malformed_bodies_and_names_are_400(tenant: Tenant) -> None:
    error_of(tenant.api("POST", "/functions", data=b"{not json", headers={"Content-Type": "application/json"}), 400)
    error_of(tenant.api("POST", "/functions", data=b'{"a": NaN}', headers={"Content-Type": "application/json"}),
             400)
    error_of(tenant.api("GET", "/functions/Not_A_Name"), 400)
    error_of(tenant.api("GET", "/functions/" + "a" * 64), 400)
    error_of(tenant.api("GET", "/functions/missing"), 404)


def test_lists_are_paged_in_name_order(tenant: Tenant) -> None:
    for name in ("fe", "fa", "fd", "fb", "fc"):
        tenant.api("POST", "/functions", json={"name": name, "runtime": "python3.11"}, expect=201)
        tenant.api("POST", "/triggers", json={"name": f"t-{name}", "type": "http", "function": name}, expect=201)
    for rest, expected in (("/functions", ["fa", "fb", "fc", "fd", "fe"]),
                           ("/triggers", ["t-fa", "t-fb", "t-fc", "t-fd", "t-fe"])):
        seen: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
            page = tenant.api("GET", rest, params=params, expect=200).json()
            assert set(page) == {"items", "next_cursor"}
            assert len(page["items"]) <= 2
            seen += names(page["items"])
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert (seen, pages) == (expected, 3)
        assert names(tenant.api("GET", rest, expect=200).json()["items"]) == expected
        for bad in ({"limit": 0}, {"limit": 1001}, {"limit": "x"}):
            error_of(tenant.api("GET", rest, params=bad), 400, "limit")
        error_of(tenant.api("GET", rest, params={"cursor": "abc"}), 400)


def test_upload_build_identical_upload_source_and_rebuild_rules(backend: Backend, tenant: Tenant) -> None:
    tenant.api("POST", "/functions", json={"name": "code", "runtime": "python3.11"}, expect=201)
    data = make_zip(HELLO)
    digest = hashlib.sha256(data).hexdigest()
    accepted = tenant.api("POST", "/functions/code/upload", expect=202,
                          files={"code": ("code.zip", data, "application/zip")}).json()
    assert (accepted["code_hash"], accepted["phase"]) == (digest, "Building")
    ready = tenant.wait_phase("code", ("Ready",), backend.build_wait_sec)
    assert ready["code_hash"] == digest and ready["image"] and ready["last_built_at"]

    same = tenant.api("POST", "/functions/code/upload", data=data, headers={"Content-Type": "application/zip"},
                      expect=202).json()
    assert (same["phase"], same["code_hash"]) == ("Ready", digest)
    assert "identical code uploaded: no rebuild" in same["message"]

    def not_rebuilt() -> bool:
        now = tenant.api("GET", "/functions/code", expect=200).json()
        return (now["phase"], now["last_built_at"]) == ("Ready", ready["last_built_at"])

    poll.holds("no rebuild after an identical upload", not_rebuilt, for_sec=2,
               why="a rebuild starts as the upload is handled (standalone: in the request; kubernetes: the "
               "operator's reconcile, well under a second on the bed) and shows as phase Building; 2 s covers that")

    files = tenant.api("GET", "/functions/code/source", expect=200).json()
    assert files == {"files": [{"name": "handler.py", "content": HELLO["handler.py"], "binary": False}]}

    # env_vars, memory_mb and timeout_sec do not rebuild; a new entrypoint is Ready again once in place
    kept = tenant.api("PUT", "/functions/code", json={"env_vars": {"A": "1"}, "timeout_sec": 20}, expect=200).json()
    assert (kept["phase"], kept["last_built_at"], kept["code_hash"]) == ("Ready", ready["last_built_at"], digest)
    moved = tenant.api("PUT", "/functions/code", json={"entrypoint": "handler.other"}, expect=200).json()
    assert (moved["entrypoint"], moved["code_hash"]) == ("handler.other", digest)
    final = wait_for(tenant, "/functions/code", lambda f: f["phase"] == "Ready", backend.build_wait_sec)
    assert (final["entrypoint"], final["env_vars"], final["timeout_sec"]) == ("handler.other", {"A": "1"}, 20)


def test_an_identical_upload_builds_a_failed_function_again(backend: Backend, tenant: Tenant) -> None:
    """Identical code does not rebuild, except when the function is Failed: the cause may have gone
    (a passing failure, or an environment variable its import needs, which an update does not rebuild for)."""
    code: dict[str, str | bytes] = {"handler.py": "import os\nNEEDED = os.environ['NEEDED']\n\n"
                                                  "def handle(event):\n    return NEEDED\n"}
    tenant.api("POST", "/functions", json={"name": "flaky", "runtime": "python3.11"}, expect=201)
    with backend.failing_builds(tenant.ns, "flaky"):
        tenant.upload("flaky", code)
        failed = tenant.wait_phase("flaky", ("Failed",), backend.build_wait_sec)
        tenant.api("PUT", "/functions/flaky", json={"env_vars": {"NEEDED": "yes"}}, expect=200)
        tenant.wait_phase("flaky", ("Failed",), backend.build_wait_sec)
        # still in the block: on kwok a pod that starts heals a Failed function by itself (a passing failure
        # gone), and the Deployment replaces failed pods, so only here is the function sure to be Failed
        again = tenant.upload("flaky", code).json()
    assert (again["code_hash"], again["phase"]) == (failed["code_hash"], "Building"), again
    assert "identical" not in again["message"]
    # Ready once a pod starts; on kwok a pod made while the failing stage held may still fail after the block and
    # show Failed a moment, until the Deployment's next pod starts: only Ready ends the wait
    ready = poll.until("flaky Ready after its identical upload",
                       lambda: (rec := tenant.api("GET", "/functions/flaky", expect=200).json())["phase"] == "Ready"
                       and rec, backend.build_wait_sec, 0.2)  # fmt: skip
    assert ready["code_hash"] == failed["code_hash"]
    same = tenant.upload("flaky", code).json()  # Ready: identical code builds nothing
    assert same["phase"] == "Ready" and "identical code uploaded: no rebuild" in same["message"]


def test_upload_errors(tenant: Tenant) -> None:
    tenant.api("POST", "/functions", json={"name": "up", "runtime": "python3.11"}, expect=201)
    error_of(tenant.api("POST", "/functions/up/upload", data=b"", headers={"Content-Type": "application/zip"}), 400)
    error_of(tenant.api("POST", "/functions/up/upload", data=b"x", headers={"Content-Type": "text/plain"}), 415)
    error_of(tenant.api("POST", "/functions/up/upload", files={"other": ("a.txt", b"a", "text/plain")}), 400)
    error_of(tenant.api("POST", "/functions/up/upload", data=b"not a zip",
                        headers={"Content-Type": "application/zip"}), 400)
    error_of(tenant.api("POST", "/functions/missing/upload", data=make_zip(HELLO),
                        headers={"Content-Type": "application/zip"}), 404)
    assert tenant.api("GET", "/functions/up", expect=200).json()["phase"] == "Pending"
    assert tenant.api("GET", "/functions/up/source", expect=200).json() == {"files": []}


def test_deleting_a_function_deletes_its_triggers_and_jobs(backend: Backend, tenant: Tenant) -> None:
    uploaded(tenant, "doomed", HELLO, backend)
    tenant.api("POST", "/functions", json={"name": "bystander", "runtime": "python3.11"}, expect=201)
    for trig in ({"name": "web", "type": "http", "function": "doomed"},
                 {"name": "tick", "type": "cron", "function": "doomed", "schedule": "0 0 1 1 *"},
                 {"name": "feed", "type": "event", "function": "doomed", "queue": "doomed-feed"},
                 {"name": "keep", "type": "http", "function": "bystander"}):
        tenant.api("POST", "/triggers", json=trig, expect=201)
    tenant.api("POST", "/jobs", json={"name": "later", "function": "doomed", "run_id": 0}, expect=201)

    tenant.api("DELETE", "/functions/doomed", expect=204)
    for rest in ("/functions/doomed", "/triggers/web", "/triggers/tick", "/triggers/feed", "/jobs/later"):
        error_of(tenant.api("GET", rest), 404)
    assert names(tenant.api("GET", "/triggers", expect=200).json()["items"]) == ["keep"]

    # the same name again starts empty: no triggers, no history
    tenant.api("POST", "/functions", json={"name": "doomed", "runtime": "python3.11"}, expect=201)
    assert tenant.api("GET", "/functions/doomed/invocations", expect=200).json() == {"items": [], "next_cursor": None}
    error_of(tenant.api("GET", "/triggers/web"), 404)


# triggers

def test_trigger_create_read_patch_delete(tenant: Tenant) -> None:
    tenant.api("POST", "/functions", json={"name": "target", "runtime": "python3.11"}, expect=201)
    web = tenant.api("POST", "/triggers", json={"name": "web", "type": "http", "function": "target"},
                     expect=201).json()
    assert set(web) == TRIGGER_FIELDS | {"url"}
    assert (web["enabled"], web["auth"], web["schedule"], web["queue"]) == (True, "public", None, None)
    assert web["url"].endswith(f"/fn/{tenant.ns}/target")
    dup = error_of(tenant.api("POST", "/triggers", json={"name": "web", "type": "cron", "function": "target",
                                                          "schedule": "* * * * *"}), 409)
    assert dup["existing"]["type"] == "http"

    cron = tenant.api("POST", "/triggers", json={"name": "nightly", "type": "cron", "function": "target",
                                                 "schedule": "0  3 * *   *"}, expect=201).json()
    assert set(cron) == TRIGGER_FIELDS and cron["schedule"] == "0 3 * * *"
    off = tenant.api("PATCH", "/triggers/nightly", json={"enabled": False}, expect=200).json()
    assert (off["enabled"], off["schedule"]) == (False, "0 3 * * *")
    assert tenant.api("GET", "/triggers/nightly", expect=200).json()["enabled"] is False
    moved = tenant.api("PATCH", "/triggers/nightly", json={"schedule": "5 4 * * 1"}, expect=200).json()
    assert (moved["schedule"], moved["enabled"]) == ("5 4 * * 1", False)

    error_of(tenant.api("PATCH", "/triggers/nightly", json={"type": "http"}), 400, "type")
    error_of(tenant.api("PATCH", "/triggers/nightly", json={"schedule": "every day"}), 400, "schedule")
    error_of(tenant.api("PATCH", "/triggers/nightly", json={"function": "missing"}), 404)
    error_of(tenant.api("PATCH", "/triggers/nightly", json=[1]), 400)
    assert tenant.api("GET", "/triggers/nightly", expect=200).json()["schedule"] == "5 4 * * 1"

    tenant.api("DELETE", "/triggers/nightly", expect=204)
    error_of(tenant.api("GET", "/triggers/nightly"), 404)
    error_of(tenant.api("DELETE", "/triggers/nightly"), 404)
    error_of(tenant.api("PATCH", "/triggers/nightly", json={"enabled": True}), 404)


@pytest.mark.parametrize(("trigger", "status", "field"), [
    ({"name": "t", "type": "http", "function": "missing"}, 404, None),
    ({"name": "t", "type": "smoke", "function": "target"}, 400, "type"),
    ({"name": "t", "type": "cron", "function": "target"}, 400, "schedule"),
    ({"name": "t", "type": "cron", "function": "target", "schedule": "61 * * * *"}, 400, "schedule"),
    ({"name": "t", "type": "cron", "function": "target", "schedule": "* * * * * *"}, 400, "schedule"),
    ({"name": "t", "type": "event", "function": "target"}, 400, "queue"),
    ({"name": "t", "type": "event", "function": "target", "queue": "no spaces"}, 400, "queue"),
    ({"name": "t", "type": "http", "function": "target", "schedule": "* * * * *"}, 400, "schedule"),
    ({"name": "t", "type": "http", "function": "target", "auth": "maybe"}, 400, "auth"),
    ({"name": "T", "type": "http", "function": "target"}, 400, "name"),
    ({"name": "t", "type": "http", "function": "target", "path": "/a/../b"}, 400, "path"),
    ({"name": "t", "type": "http", "function": "target", "path": "/{id}/{id}"}, 400, "path"),
    ({"name": "t", "type": "cron", "function": "target", "schedule": "* * * * *", "path": "/a"}, 400, "path"),
])
def test_invalid_triggers(tenant: Tenant, trigger: dict[str, Any], status: int, field: str | None) -> None:
    tenant.api("POST", "/functions", json={"name": "target", "runtime": "python3.11"}, expect=201)
    error_of(tenant.api("POST", "/triggers", json=trigger), status, field)


def test_one_event_trigger_per_queue(backend: Backend, tenant: Tenant) -> None:
    for name in ("a", "b"):
        tenant.api("POST", "/functions", json={"name": name, "runtime": "python3.11"}, expect=201)
    first = tenant.api("POST", "/triggers", json={"name": "first", "type": "event", "function": "a",
                                                  "queue": "orders"}, expect=201).json()
    assert first["queue"] == "orders"
    taken = error_of(tenant.api("POST", "/triggers", json={"name": "second", "type": "event", "function": "b",
                                                           "queue": "orders"}), 409)
    assert taken["existing"]["name"] == "first" and "orders" in taken["error"]
    tenant.api("POST", "/triggers", json={"name": "second", "type": "event", "function": "b", "queue": "refunds"},
               expect=201)
    error_of(tenant.api("PATCH", "/triggers/second", json={"queue": "orders"}), 409)
    assert tenant.api("GET", "/triggers/second", expect=200).json()["queue"] == "refunds"
    # the same trigger may keep its own queue, and a disabled one still holds it
    tenant.api("PATCH", "/triggers/first", json={"queue": "orders", "enabled": False}, expect=200)
    error_of(tenant.api("POST", "/triggers", json={"name": "third", "type": "event", "function": "b",
                                                   "queue": "orders"}), 409)
    # another tenant's "orders" is another queue (<namespace>.orders)
    other = backend.tenant("other")
    other.api("POST", "/functions", json={"name": "a", "runtime": "python3.11"}, expect=201)
    other.api("POST", "/triggers", json={"name": "mine", "type": "event", "function": "a", "queue": "orders"},
              expect=201)


def test_disabling_the_last_http_trigger_takes_the_function_off_fn(backend: Backend, tenant: Tenant) -> None:
    uploaded(tenant, "web", HELLO, backend)
    tenant.api("POST", "/triggers", json={"name": "web", "type": "http", "function": "web"}, expect=201)
    reachable = 200 if backend.runs_functions else 502  # kwok: routed, but no container answers
    until("routed", lambda: requests.get(tenant.fn_url("web"), timeout=30).status_code == reachable)
    tenant.api("PATCH", "/triggers/web", json={"enabled": False}, expect=200)
    until("off /fn", lambda: requests.get(tenant.fn_url("web"), timeout=30).status_code == 404)
    error_of(requests.get(tenant.fn_url("web"), timeout=30), 404)
    tenant.api("PATCH", "/triggers/web", json={"enabled": True}, expect=200)
    until("routed again", lambda: requests.get(tenant.fn_url("web"), timeout=30).status_code == reachable)
    tenant.api("DELETE", "/triggers/web", expect=204)
    until("off /fn again", lambda: requests.get(tenant.fn_url("web"), timeout=30).status_code == 404)


def test_an_http_path_pattern_routes_with_its_own_auth(backend: Backend, tenant: Tenant) -> None:
    """Stored (in the Trigger resource on Kubernetes) and routed by both backends' route tables: the pattern's
    paths with its auth, other paths 404, the same pattern twice 409."""
    uploaded(tenant, "paths", HELLO, backend)
    made = tenant.api("POST", "/triggers", json={"name": "orders", "type": "http", "function": "paths",
                                                 "path": "/orders/{id}", "auth": "token"}, expect=201).json()
    assert made["path"] == "/orders/{id}" and made["url"].endswith(f"/fn/{tenant.ns}/paths/orders/{{id}}")
    order = tenant.fn_url("paths", "/orders/7")
    until("routed", lambda: requests.get(order, timeout=30).status_code == 401)
    reachable = 200 if backend.runs_functions else 502  # kwok: routed, but no container answers
    assert requests.get(order, headers={"Authorization": f"Bearer {tenant.token}"}, timeout=30).status_code == reachable
    error_of(requests.get(tenant.fn_url("paths", "/elsewhere"), timeout=30), 404)
    clash = error_of(tenant.api("POST", "/triggers", json={"name": "again", "type": "http", "function": "paths",
                                                           "path": "/orders/{order}"}), 409)
    assert "has the http trigger orders already" in clash["error"]


# jobs

def test_job_run_id_semantics(backend: Backend, tenant: Tenant) -> None:
    uploaded(tenant, "worker", HELLO, backend)
    recorded = tenant.api("POST", "/jobs", json={"name": "j", "function": "worker", "event": {"name": "x"},
                                                 "run_id": 0}, expect=201).json()
    assert set(recorded) == JOB_FIELDS
    assert (recorded["phase"], recorded["message"], recorded["run_id"]) == (
        "Recorded", "recorded: set run_id above 0 to run it", 0)
    poll.holds("a run_id 0 job stays Recorded",
               lambda: tenant.api("GET", "/jobs/j", expect=200).json()["phase"] == "Recorded", for_sec=1.5,
               why="a job that runs is started as it is created (standalone: a task spawned in the request; "
               "kubernetes: the operator's first reconcile, under a second on the bed); 1.5 s covers that")
    assert tenant.api("PATCH", "/jobs/j", json={"run_id": 0}, expect=200).json()["phase"] == "Recorded"

    first = tenant.api("PATCH", "/jobs/j", json={"run_id": 1}, expect=200).json()
    assert (first["run_id"], first["phase"]) == (1, "Pending")
    done = wait_for(tenant, "/jobs/j", lambda j: j["phase"] in ("Succeeded", "Failed"))
    assert done["phase"] == "Succeeded" and done["started_at"] and done["completed_at"], done
    same = tenant.api("PATCH", "/jobs/j", json={"run_id": 1}, expect=200).json()  # the same run_id: no new run
    assert (same["run_id"], same["phase"], same["completed_at"]) == (1, "Succeeded", done["completed_at"])

    error_of(tenant.api("PATCH", "/jobs/j", json={"run_id": 0}), 400, "run_id")
    for bad in ({"run_id": -1}, {"run_id": MAX_RUN_ID + 1}, {"run_id": "2"}, {"run_id": True},
                {"run_id": 2, "event": {}}, {}):
        error_of(tenant.api("PATCH", "/jobs/j", json=bad), 400, "run_id")
    again = tenant.api("PATCH", "/jobs/j", json={"run_id": 7}, expect=200).json()
    assert (again["run_id"], again["phase"], again["completed_at"]) == (7, "Pending", None)
    until("run 7 done", lambda: tenant.api("GET", "/jobs/j").json()["phase"] == "Succeeded")

    dup = error_of(tenant.api("POST", "/jobs", json={"name": "j", "function": "worker"}), 409)
    assert dup["existing"]["run_id"] == 7
    tenant.api("DELETE", "/jobs/j", expect=204)
    error_of(tenant.api("GET", "/jobs/j"), 404)
    error_of(tenant.api("DELETE", "/jobs/j"), 404)
    error_of(tenant.api("PATCH", "/jobs/j", json={"run_id": 9}), 404)


@pytest.mark.parametrize(("job", "status", "field"), [
    ({"name": "j", "function": "missing"}, 404, None),
    ({"name": "j", "function": "worker", "event": [1]}, 400, "event"),
    ({"name": "j", "function": "worker", "run_id": -1}, 400, "run_id"),
    ({"name": "J", "function": "worker"}, 400, "name"),
    ({"name": "j", "function": "worker", "extra": 1}, 400, "extra"),
])
def test_invalid_jobs(tenant: Tenant, job: dict[str, Any], status: int, field: str | None) -> None:
    tenant.api("POST", "/functions", json={"name": "worker", "runtime": "python3.11"}, expect=201)
    error_of(tenant.api("POST", "/jobs", json=job), status, field)


# cron

class _Collector(BaseHTTPRequestHandler):
    received: list[dict[str, Any]]

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.received.append(json.loads(self.rfile.read(length)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.fixture
def collector(host_service_port: int) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A loopback HTTP server that keeps the JSON bodies posted to it (what a function saw), on the one host
    port functions may reach besides the API (see the backend fixture)."""
    received: list[dict[str, Any]] = []
    handler = type("Collector", (_Collector,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", host_service_port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", received
    finally:
        server.shutdown()
        server.server_close()


REPORTER = """
import json, os, urllib.request

def handle(event):
    req = urllib.request.Request(os.environ["REPORT_URL"], data=json.dumps(event).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(req, timeout=10).close()
    return {"ok": True}
"""


@pytest.mark.needs_running
@pytest.mark.timeout(240)
def test_a_cron_firing_carries_its_tick(backend: Backend, tenant: Tenant,
                                        collector: tuple[str, list[dict[str, Any]]]) -> None:
    url, received = collector
    tenant.api("POST", "/functions", json={"name": "ticker", "runtime": "python3.11",
                                           "env_vars": {"REPORT_URL": url}}, expect=201)
    tenant.upload("ticker", {"handler.py": REPORTER})
    tenant.wait_phase("ticker", ("Ready",), backend.build_wait_sec)
    tenant.api("POST", "/triggers", json={"name": "minutely", "type": "cron", "function": "ticker",
                                          "schedule": "* * * * *"}, expect=201)
    until("a firing", lambda: received, timeout=90, interval=0.5)
    event = received[0]
    assert set(event) == {"type", "trigger", "schedule", "scheduled_at"}, event
    assert (event["type"], event["trigger"], event["schedule"]) == ("cron", "minutely", "* * * * *")
    tick = datetime.fromisoformat(event["scheduled_at"])
    assert tick.tzinfo is not None and tick.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
    assert (tick.second, tick.microsecond) == (0, 0)
    assert abs((datetime.now(UTC) - tick).total_seconds()) < 60
    fired = wait_for(tenant, "/triggers/minutely", lambda t: bool(t["last_fired_at"]), timeout=30)
    assert fired["enabled"] is True
    items = until("the invocation log", lambda: [i for i in tenant.api(
        "GET", "/functions/ticker/invocations").json()["items"] if i["trigger"] == "cron"], timeout=30)
    assert items[0]["status"] == 200


def test_versions_and_rollback(backend: Backend, tenant: Tenant) -> None:
    """Each Ready deploy is a version; a rollback (default: the previous one) deploys it again as a new one."""
    tenant.api("POST", "/functions", json={"name": "ver", "runtime": "python3.11"}, expect=201)
    assert tenant.api("GET", "/functions/ver/versions", expect=200).json() == {"items": []}
    assert "no deployed version" in tenant.api("POST", "/functions/ver/rollback", expect=409).json()["error"]
    hashes = []
    for n in (1, 2):
        data = make_zip({"handler.py": f"def handle(event):\n    return {n}\n"})
        hashes.append(hashlib.sha256(data).hexdigest())
        tenant.api("POST", "/functions/ver/upload", data=data, headers={"Content-Type": "application/zip"},
                   expect=202)  # fmt: skip
        tenant.wait_phase("ver", ("Ready",), backend.build_wait_sec, code_hash=hashes[-1])
    listed = wait_for(tenant, "/functions/ver/versions", lambda b: len(b["items"]) == 2, backend.build_wait_sec)
    assert [(v["version"], v["code_hash"], v["current"]) for v in listed["items"]] == [
        (2, hashes[1], True), (1, hashes[0], False)]
    assert set(listed["items"][0]) == {"version", "code_hash", "runtime", "entrypoint", "memory_mb", "timeout_sec",
                                       "env_vars", "secrets", "max_concurrency", "sandbox", "scale",
                                       "deployed_at", "current"}

    for body, status in (({"version": 2}, 409), ({"version": 9}, 404), ({"version": "1"}, 400), ([], 400)):
        assert "error" in tenant.api("POST", "/functions/ver/rollback", json=body, expect=status).json()
    back = tenant.api("POST", "/functions/ver/rollback", expect=202).json()
    assert back["code_hash"] == hashes[0]
    tenant.wait_phase("ver", ("Ready",), backend.build_wait_sec, code_hash=hashes[0])
    after = wait_for(tenant, "/functions/ver/versions", lambda b: len(b["items"]) == 3, backend.build_wait_sec)
    assert [(v["version"], v["code_hash"]) for v in after["items"]] == [(3, hashes[0]), (2, hashes[1]),
                                                                        (1, hashes[0])]  # fmt: skip
    tenant.api("GET", "/functions/nope/versions", expect=404)
    tenant.api("POST", "/functions/nope/rollback", expect=404)


def test_a_rollback_to_a_version_whose_secret_is_gone_is_refused(backend: Backend, tenant: Tenant) -> None:
    """A kept version may read a secret deleted since (no function used it then): a rollback to it is refused as
    an update to that configuration is (400 naming the secret), and nothing changes."""
    ref = {"name": "db", "key": "password", "env": "DB_PASSWORD"}
    tenant.api("POST", "/secrets", json={"name": "db", "data": {"password": "pw"}}, expect=201)
    tenant.api("POST", "/functions", json={"name": "ver", "runtime": "python3.11", "secrets": [ref]}, expect=201)
    data = make_zip({"handler.py": "def handle(event):\n    return 1\n"})
    tenant.api("POST", "/functions/ver/upload", data=data, headers={"Content-Type": "application/zip"}, expect=202)
    tenant.wait_phase("ver", ("Ready",), backend.build_wait_sec, code_hash=hashlib.sha256(data).hexdigest())
    tenant.api("PUT", "/functions/ver", json={"secrets": []}, expect=200)
    wait_for(tenant, "/functions/ver/versions", lambda b: len(b["items"]) == 2, backend.build_wait_sec)
    tenant.api("DELETE", "/secrets/db", expect=204)

    refused = tenant.api("POST", "/functions/ver/rollback", json={"version": 1}, expect=400).json()
    as_update = tenant.api("PUT", "/functions/ver", json={"secrets": [ref]}, expect=400).json()
    assert refused == as_update and "db" in refused["error"]
    assert tenant.api("GET", "/functions/ver", expect=200).json()["secrets"] == []
    listed = tenant.api("GET", "/functions/ver/versions", expect=200).json()["items"]
    assert [(v["version"], v["current"], v["secrets"]) for v in listed] == [(2, True, []), (1, False, [ref])]
