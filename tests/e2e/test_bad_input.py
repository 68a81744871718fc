"""Every kind of bad input gets a clear JSON error with the right status, never a stack trace."""

from __future__ import annotations

import base64
import io
import json
import stat
import time
import zipfile

import jwt
import pytest
import requests

from tests.support.platform import SECRET, SlessProcess, Tenant, make_zip

pytestmark = pytest.mark.e2e
PY = "def handle(event):\n    return 'ok'\n"


def assert_json_error(resp: requests.Response, status: int, contains: str = "") -> dict[str, object]:
    assert resp.status_code == status, f"{resp.status_code} {resp.text[:300]}"
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert isinstance(body.get("error"), str) and body["error"]
    assert "Traceback" not in resp.text
    assert contains.lower() in body["error"].lower(), body
    return body  # type: ignore[no-any-return]


def test_malformed_json(tenant: Tenant) -> None:
    resp = tenant.api("POST", "/functions", data=b"{not json", headers={"Content-Type": "application/json"})
    assert_json_error(resp, 400, "json")
    resp = tenant.api("POST", "/functions", data=b"[1, 2]", headers={"Content-Type": "application/json"})
    assert_json_error(resp, 400, "object")
    resp = tenant.api("POST", "/functions", data=b"name=x", headers={"Content-Type": "text/plain"})
    assert_json_error(resp, 415)


@pytest.mark.parametrize(("spec", "field"), [
    ({"name": "Bad_Name", "runtime": "python3.11"}, "name"),
    ({"name": "-x", "runtime": "python3.11"}, "name"),
    ({"name": "a" * 41, "runtime": "python3.11"}, "name"),
    ({"name": "ok", "runtime": "cobol"}, "runtime"),
    ({"name": "ok", "runtime": "python3.11", "timeout_sec": 0}, "timeout_sec"),
    ({"name": "ok", "runtime": "python3.11", "timeout_sec": 901}, "timeout_sec"),
    ({"name": "ok", "runtime": "python3.11", "memory_mb": 1}, "memory_mb"),
    ({"name": "ok", "runtime": "python3.11", "memory_mb": "128"}, "memory_mb"),
    ({"name": "ok", "runtime": "python3.11", "env_vars": {"1BAD": "x"}}, "env_vars"),
    ({"name": "ok", "runtime": "python3.11", "env_vars": {"PORT": "1"}}, "env_vars"),
    ({"name": "ok", "runtime": "go1.23", "env_vars": {"GOFLAGS": "-toolexec=/bin/sh"}}, "env_vars"),
    ({"name": "ok", "runtime": "python3.11", "env_vars": {"PIP_INDEX_URL": "http://127.0.0.1:1/"}}, "env_vars"),
    ({"name": "ok", "runtime": "nodejs20", "env_vars": {"npm_config_script_shell": "/bin/sh"}}, "env_vars"),
    ({"name": "ok", "runtime": "python3.11", "entrypoint": "no-dot"}, "entrypoint"),
    ({"name": "ok", "runtime": "go1.23", "entrypoint": "lowercase"}, "entrypoint"),
    ({"name": "ok", "runtime": "python3.11", "surprise": 1}, "surprise"),
])
def test_invalid_function_specs(tenant: Tenant, spec: dict[str, object], field: str) -> None:
    body = assert_json_error(tenant.api("POST", "/functions", json=spec), 400)
    assert body.get("field") == field


def test_duplicate_function_is_409(tenant: Tenant) -> None:
    tenant.api("POST", "/functions", json={"name": "dup", "runtime": "python3.11"}, expect=201)
    body = assert_json_error(tenant.api("POST", "/functions", json={"name": "dup", "runtime": "nodejs20"}),
                             409, "exists")
    assert body["existing"]["runtime"] == "python3.11"  # type: ignore[index]


@pytest.mark.parametrize(("trigger", "field"), [
    ({"name": "c", "type": "cron", "function": "f", "schedule": "61 * * * *"}, "schedule"),
    ({"name": "c", "type": "cron", "function": "f", "schedule": "* * *"}, "schedule"),
    ({"name": "c", "type": "cron", "function": "f"}, "schedule"),
    ({"name": "c", "type": "cron", "function": "f", "schedule": "@every 5s"}, "schedule"),
    ({"name": "c", "type": "webhook", "function": "f"}, "type"),
    ({"name": "c", "type": "http", "function": "f", "auth": "maybe"}, "auth"),
    ({"name": "c", "type": "event", "function": "f"}, "queue"),
    ({"name": "C!", "type": "http", "function": "f"}, "name"),
    ({"name": "c", "type": "http", "function": "f", "enabled": "yes"}, "enabled"),
])
def test_invalid_triggers(tenant: Tenant, trigger: dict[str, object], field: str) -> None:
    tenant.api("POST", "/functions", json={"name": "f", "runtime": "python3.11"}, expect=201)
    body = assert_json_error(tenant.api("POST", "/triggers", json=trigger), 400)
    assert body.get("field") == field


def test_trigger_for_missing_function_is_404(tenant: Tenant) -> None:
    assert_json_error(tenant.api("POST", "/triggers", json={"name": "t", "type": "http", "function": "nope"}), 404)


def test_event_trigger_without_rabbitmq_is_a_clear_4xx(tenant: Tenant) -> None:
    tenant.api("POST", "/functions", json={"name": "f", "runtime": "python3.11"}, expect=201)
    resp = tenant.api("POST", "/triggers", json={"name": "t", "type": "event", "function": "f", "queue": "q"})
    assert_json_error(resp, 422, "rabbitmq")


def _zip_with(entries: list[tuple[zipfile.ZipInfo | str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for info, data in entries:
            zf.writestr(info, data)
    return buf.getvalue()


def _symlink_entry() -> zipfile.ZipInfo:
    info = zipfile.ZipInfo("link")
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info


@pytest.mark.parametrize("archive", [
    _zip_with([("../evil.py", b"x")]),
    _zip_with([("/etc/evil.py", b"x")]),
    _zip_with([("dir\\evil.py", b"x")]),
    _zip_with([(_symlink_entry(), b"/etc/passwd")]),
    _zip_with([("a.py", b"1"), ("a.py", b"2")]),
    b"this is not a zip file at all",
], ids=["traversal", "absolute", "backslash", "symlink", "duplicate", "not-a-zip"])
def test_malicious_zips_are_rejected(tenant: Tenant, sless: SlessProcess, archive: bytes) -> None:
    tenant.api("POST", "/functions", json={"name": "z", "runtime": "python3.11"}, expect=201)
    resp = tenant.api("POST", "/functions/z/upload", files={"code": ("c.zip", archive)})
    assert_json_error(resp, 400)
    assert tenant.api("GET", "/functions/z", expect=200).json()["phase"] == "Pending"
    assert not list(sless.data_dir.rglob("evil.py"))


def test_zip_bomb_is_rejected(tenant: Tenant) -> None:
    tenant.api("POST", "/functions", json={"name": "bomb", "runtime": "python3.11"}, expect=201)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(3):
            zf.writestr(f"zeros{i}.bin", b"\0" * (100 * 1024 * 1024))
    assert len(buf.getvalue()) < 2 * 1024 * 1024
    resp = tenant.api("POST", "/functions/bomb/upload", files={"code": ("c.zip", buf.getvalue())})
    assert_json_error(resp, 400)


def test_upload_problems(tenant: Tenant) -> None:
    tenant.api("POST", "/functions", json={"name": "up", "runtime": "python3.11"}, expect=201)
    assert_json_error(tenant.api("POST", "/functions/up/upload", files={"other": ("c.zip", make_zip({"a": "b"}))}),
                      400, "code")
    assert_json_error(tenant.api("POST", "/functions/up/upload", data=b"x", headers={"Content-Type": "text/plain"}),
                      415)
    assert_json_error(tenant.api("POST", "/functions/missing/upload",
                                 files={"code": ("c.zip", make_zip({"handler.py": PY}))}), 404)


def test_oversize_upload_is_413(tenant: Tenant) -> None:
    tenant.api("POST", "/functions", json={"name": "big", "runtime": "python3.11"}, expect=201)
    blob = bytes(range(256)) * (33 * 1024 * 1024 // 256 + 1)
    assert_json_error(tenant.api("POST", "/functions/big/upload", files={"code": ("c.zip", blob)}), 413)
    # without Content-Length (chunked), the size is counted while streaming
    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(34):
            yield b"\0" * (1024 * 1024)
    resp = tenant.api("POST", "/functions/big/upload", data=chunks(), headers={"Content-Type": "application/zip"})
    assert_json_error(resp, 413)


def test_another_tenants_namespace_is_403_on_every_route(tenant: Tenant, other_tenant: Tenant) -> None:
    tenant.deploy("mine", "python3.11", {"handler.py": PY})
    foreign = other_tenant.http
    base = f"{tenant.url}/v1/namespaces/{tenant.ns}"
    for method, path in [("POST", "/ensure"), ("GET", "/functions"), ("GET", "/functions/mine"),
                         ("PUT", "/functions/mine"), ("DELETE", "/functions/mine"),
                         ("POST", "/functions/mine/upload"), ("GET", "/functions/mine/source"),
                         ("GET", "/functions/mine/invocations"), ("GET", "/triggers"), ("GET", "/triggers/mine"),
                         ("PATCH", "/triggers/mine"), ("DELETE", "/triggers/mine"), ("POST", "/jobs"),
                         ("GET", "/jobs/x"), ("DELETE", "/jobs/x")]:
        assert_json_error(foreign.request(method, base + path, json={}, timeout=30), 403)
    assert tenant.api("GET", "/functions/mine", expect=200).json()["phase"] == "Ready"


def _token(payload: dict[str, object], key: str = SECRET, alg: str = "HS256") -> str:
    return jwt.encode(payload, key, algorithm=alg)


def _b64(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def test_bad_tokens_are_401(sless: SlessProcess) -> None:
    now = int(time.time())
    good = {"sub": "someone", "exp": now + 600}
    valid = _token(good)
    header, _payload, signature = valid.split(".")
    tampered = ".".join([header, _b64({"sub": "admin", "exp": now + 600}), signature])
    cases = {
        "missing": None,
        "not bearer": f"Basic {valid}",
        "garbage": "Bearer not.a.token",
        "alg none": "Bearer " + _b64({"alg": "none", "typ": "JWT"}) + "." + _b64(good) + ".",
        "wrong secret": "Bearer " + _token(good, key="another-secret-of-sufficient-length"),
        "expired": "Bearer " + _token({"sub": "someone", "exp": now - 3600}),
        "future nbf": "Bearer " + _token({**good, "nbf": now + 3600}),
        "no exp": "Bearer " + _token({"sub": "someone"}),
        "no sub": "Bearer " + _token({"exp": now + 600}),
        "tampered": f"Bearer {tampered}",
    }
    for label, header_value in cases.items():
        headers = {"Authorization": header_value} if header_value else {}
        resp = requests.get(f"{sless.url}/v1/whoami", headers=headers, timeout=30)
        assert resp.status_code == 401, label
        assert resp.json()["error"], label
    ok = requests.get(f"{sless.url}/v1/whoami", headers={"Authorization": f"Bearer {valid}"}, timeout=30)
    assert ok.status_code == 200 and ok.json()["namespace"].startswith("sless-")


def test_unknown_route_and_method_are_json(tenant: Tenant, sless: SlessProcess) -> None:
    assert_json_error(requests.get(f"{sless.url}/nope", timeout=30), 404)
    resp = tenant.api("PATCH", "/functions")
    assert resp.status_code == 405 and resp.json()["error"]
