"""Deploy, invoke, update and delete functions of each runtime through a real `sless up`."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
import requests

from tests.support.platform import Tenant, make_zip, running_sless

pytestmark = pytest.mark.e2e

PY_V1 = "def handle(event):\n    return {'version': 1, 'name': event.get('name')}\n"
PY_V2 = "def handle(event):\n    return {'version': 2, 'name': event.get('name')}\n"
NODE = "exports.handle = async (event) => ({ runtime: 'node', name: event.name, method: event._method });\n"
GO = """package function

import "context"

func Handle(ctx context.Context, event map[string]any) (any, error) {
	return map[string]any{"runtime": "go", "name": event["name"]}, nil
}
"""


def test_python_function_lifecycle(tenant: Tenant) -> None:
    record = tenant.deploy("hello", "python3.11", {"handler.py": PY_V1})
    assert record["phase"] == "Ready" and record["last_built_at"]
    assert record["code_hash"] == hashlib.sha256(make_zip({"handler.py": PY_V1})).hexdigest()
    resp = requests.post(tenant.fn_url("hello"), json={"name": "ann"}, timeout=30)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"version": 1, "name": "ann"}

    tenant.upload("hello", {"handler.py": PY_V2})
    new_hash = hashlib.sha256(make_zip({"handler.py": PY_V2})).hexdigest()
    tenant.wait_phase("hello", ("Ready",), code_hash=new_hash)
    assert requests.post(tenant.fn_url("hello"), json={"name": "bo"}, timeout=30).json()["version"] == 2

    listed = tenant.api("GET", "/functions", expect=200).json()
    assert [f["name"] for f in listed["items"]] == ["hello"]
    source = tenant.api("GET", "/functions/hello/source", expect=200).json()["files"]
    assert source == [{"name": "handler.py", "content": PY_V2, "binary": False}]

    tenant.api("DELETE", "/functions/hello", expect=204)
    tenant.api("GET", "/functions/hello", expect=404)
    assert requests.get(tenant.fn_url("hello"), timeout=30).status_code == 404
    assert tenant.api("GET", "/triggers", expect=200).json()["items"] == []


def test_identical_upload_does_not_rebuild(tenant: Tenant) -> None:
    first = tenant.deploy("same", "python3.11", {"handler.py": PY_V1})
    again = tenant.upload("same", {"handler.py": PY_V1}).json()
    assert again["phase"] == "Ready" and "identical" in again["message"]
    assert again["last_built_at"] == first["last_built_at"]


def test_node_function(tenant: Tenant) -> None:
    tenant.deploy("hello-node", "nodejs20", {"handler.js": NODE})
    resp = requests.put(tenant.fn_url("hello-node"), json={"name": "cy"}, timeout=30)
    assert resp.json() == {"runtime": "node", "name": "cy", "method": "PUT"}


@pytest.mark.slow
def test_go_function(tenant: Tenant) -> None:
    tenant.deploy("hello-go", "go1.23", {"handler.go": GO, "go.mod": "module example.com/h\n\ngo 1.23\n"},
                  wait=600)
    assert requests.post(tenant.fn_url("hello-go"), json={"name": "di"}, timeout=30).json() == {
        "runtime": "go", "name": "di"}


def test_python_requirements_installed(tenant: Tenant) -> None:
    code = "import six\n\ndef handle(event):\n    return {'six': six.__version__}\n"
    tenant.deploy("with-deps", "python3.11", {"handler.py": code, "requirements.txt": "six==1.16.0\n"}, wait=300)
    assert requests.get(tenant.fn_url("with-deps"), timeout=30).json() == {"six": "1.16.0"}


def test_build_failure_reports_log_tail(tenant: Tenant) -> None:
    tenant.api("POST", "/functions", json={"name": "broken", "runtime": "python3.11"}, expect=201)
    tenant.upload("broken", {"handler.py": PY_V1, "requirements.txt": "this-package-does-not-exist-sless==0.0.1\n"})
    record = tenant.wait_phase("broken", ("Failed",), wait=300)
    assert "this-package-does-not-exist-sless" in record["message"]


def test_update_env_and_timeout_without_rebuild(tenant: Tenant) -> None:
    code = "import os\n\ndef handle(event):\n    return {'greeting': os.environ.get('GREETING')}\n"
    before = tenant.deploy("envfn", "python3.11", {"handler.py": code}, env_vars={"GREETING": "hi"})
    assert requests.get(tenant.fn_url("envfn"), timeout=30).json() == {"greeting": "hi"}
    updated = tenant.api("PUT", "/functions/envfn", json={"env_vars": {"GREETING": "hello"}, "timeout_sec": 60},
                         expect=200).json()
    assert updated["timeout_sec"] == 60 and updated["last_built_at"] == before["last_built_at"]
    assert requests.get(tenant.fn_url("envfn"), timeout=30).json() == {"greeting": "hello"}


def test_invocations_are_listed_and_paged(tenant: Tenant) -> None:
    tenant.deploy("counted", "python3.11", {"handler.py": PY_V1})
    for _ in range(5):
        assert requests.get(tenant.fn_url("counted", "/x?a=1"), timeout=30).status_code == 200
    deadline = time.monotonic() + 10
    items: list[dict[str, object]] = []
    while time.monotonic() < deadline and len(items) < 5:
        items = tenant.api("GET", "/functions/counted/invocations?limit=100", expect=200).json()["items"]
        time.sleep(0.3)
    assert len(items) == 5
    assert {(i["method"], i["status"], i["trigger"]) for i in items} == {("GET", 200, "http")}
    first = tenant.api("GET", "/functions/counted/invocations?limit=2", expect=200).json()
    assert len(first["items"]) == 2 and first["next_cursor"]
    second = tenant.api("GET", f"/functions/counted/invocations?limit=2&cursor={first['next_cursor']}",
                        expect=200).json()
    assert {i["id"] for i in first["items"]}.isdisjoint({i["id"] for i in second["items"]})


def test_a_recreated_function_starts_with_no_history(tenant: Tenant) -> None:
    tenant.deploy("reborn", "python3.11", {"handler.py": PY_V1})
    for _ in range(3):
        assert requests.get(tenant.fn_url("reborn"), timeout=30).status_code == 200
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if len(tenant.api("GET", "/functions/reborn/invocations", expect=200).json()["items"]) == 3:
            break
        time.sleep(0.2)
    tenant.api("DELETE", "/functions/reborn", expect=204)
    time.sleep(1.1)  # creation times have second resolution on the kubernetes backend; same rule here
    tenant.api("POST", "/functions", json={"name": "reborn", "runtime": "python3.11"}, expect=201)
    assert tenant.api("GET", "/functions/reborn/invocations", expect=200).json()["items"] == []


def test_the_source_view_is_the_upload_not_what_the_function_wrote(tmp_path: Path) -> None:
    """Without a sandbox (one trusted tenant) a function can write into its folder; the source stays the upload."""
    writer = "import os\n\ndef handle(event):\n    open('injected.txt', 'w').write('x')\n    return os.getcwd()\n"
    with running_sless(tmp_path / "data", {"SLESS_SANDBOX": "off"}) as sp:
        tenant = Tenant(sp.url, "source-view")
        tenant.deploy("writer", "python3.11", {"handler.py": writer})
        assert requests.get(tenant.fn_url("writer"), timeout=30).status_code == 200
        files = tenant.api("GET", "/functions/writer/source", expect=200).json()["files"]
        assert [f["name"] for f in files] == ["handler.py"]
