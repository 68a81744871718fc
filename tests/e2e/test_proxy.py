"""The invoke proxy `/fn/{ns}/{name}`: methods, paths, bodies, headers, timeouts, auth and trigger toggling."""

from __future__ import annotations

import concurrent.futures
import http.client
import time
import urllib.parse

import pytest
import requests

from tests.support.platform import Tenant

pytestmark = pytest.mark.e2e

ECHO = """
import time

def handle(event):
    if event.get('_path') == '/sleep':
        time.sleep(float(event['_query'].get('s', '1')))
    if event.get('_path') == '/fail':
        raise RuntimeError('deliberate')
    body = event.get('body')
    return {'method': event['_method'], 'path': event['_path'], 'query': event['_query'],
            'headers': event['_headers'], 'body_len': len(body) if isinstance(body, str) else None,
            'json_keys': sorted(k for k in event if not k.startswith('_'))}
"""


@pytest.fixture
def echo(tenant: Tenant) -> Tenant:
    tenant.deploy("echo", "python3.11", {"handler.py": ECHO}, timeout_sec=2)
    return tenant


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE"])
def test_methods_subpaths_and_query(echo: Tenant, method: str) -> None:
    resp = requests.request(method, echo.fn_url("echo", "/a/b?x=1&y=two"), timeout=30)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["method"] == method and body["path"] == "/a/b" and body["query"] == {"x": "1", "y": "two"}


def test_one_date_header_on_proxied_responses(echo: Tenant) -> None:
    parsed = urllib.parse.urlparse(echo.fn_url("echo"))
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    conn.request("GET", parsed.path)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    names = [k.lower() for k, _ in resp.getheaders()]
    assert names.count("date") == 1 and names.count("server") <= 1


def test_head_has_no_body(echo: Tenant) -> None:
    resp = requests.head(echo.fn_url("echo"), timeout=30)
    assert resp.status_code == 200 and resp.content == b""


def test_body_and_content_length_reach_the_function(echo: Tenant) -> None:
    payload = "x" * 300_000
    resp = requests.post(echo.fn_url("echo"), data=payload.encode(), headers={"Content-Type": "text/plain"},
                         timeout=30)
    assert resp.json()["body_len"] == 300_000
    assert resp.json()["headers"]["content-length"] == "300000"
    resp = requests.post(echo.fn_url("echo"), json={"a": 1, "b": 2}, timeout=30)
    assert resp.json()["json_keys"] == ["a", "b"]


def test_hop_by_hop_headers_are_stripped(echo: Tenant) -> None:
    parsed = urllib.parse.urlparse(echo.fn_url("echo"))
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    conn.request("GET", parsed.path, headers={"Connection": "keep-alive, X-Secret-Hop", "X-Secret-Hop": "1",
                                              "Keep-Alive": "timeout=5", "TE": "trailers", "X-End": "kept",
                                              "Proxy-Authorization": "Basic abc"})
    headers = __import__("json").loads(conn.getresponse().read())["headers"]
    conn.close()
    assert headers.get("x-end") == "kept"
    for hop in ("x-secret-hop", "keep-alive", "te", "proxy-authorization"):
        assert hop not in headers, hop


def test_function_timeout_is_504_and_errors_are_500(echo: Tenant) -> None:
    resp = requests.get(echo.fn_url("echo", "/sleep?s=4"), timeout=30)
    assert resp.status_code == 504 and resp.json()["error"]
    resp = requests.get(echo.fn_url("echo", "/fail"), timeout=30)
    assert resp.status_code == 500 and resp.json()["type"] == "RuntimeError"
    assert requests.get(echo.fn_url("echo"), timeout=30).status_code == 200


def test_missing_function_and_disabled_trigger_are_404(echo: Tenant) -> None:
    assert requests.get(echo.fn_url("no-such-fn"), timeout=30).status_code == 404
    echo.api("PATCH", "/triggers/echo", json={"enabled": False}, expect=200)
    resp = requests.get(echo.fn_url("echo"), timeout=30)
    assert resp.status_code == 404 and resp.json()["error"]
    echo.api("PATCH", "/triggers/echo", json={"enabled": True}, expect=200)
    assert requests.get(echo.fn_url("echo"), timeout=30).status_code == 200


def test_token_trigger_requires_the_tenants_token(tenant: Tenant, other_tenant: Tenant) -> None:
    tenant.deploy("private", "python3.11", {"handler.py": ECHO}, http=False)
    created = tenant.api("POST", "/triggers", json={"name": "private", "type": "http", "function": "private",
                                                    "auth": "token"}, expect=201).json()
    assert created["url"].endswith(f"/fn/{tenant.ns}/private")
    assert requests.get(tenant.fn_url("private"), timeout=30).status_code == 401
    bad = {"Authorization": "Bearer garbage"}
    assert requests.get(tenant.fn_url("private"), headers=bad, timeout=30).status_code == 401
    foreign = {"Authorization": f"Bearer {other_tenant.token}"}
    assert requests.get(tenant.fn_url("private"), headers=foreign, timeout=30).status_code == 403
    mine = {"Authorization": f"Bearer {tenant.token}"}
    assert requests.get(tenant.fn_url("private"), headers=mine, timeout=30).status_code == 200


def test_oversize_request_body_is_413(echo: Tenant) -> None:
    resp = requests.post(echo.fn_url("echo"), data=b"x" * (7 * 1024 * 1024), timeout=60)
    assert resp.status_code == 413


def test_slow_calls_do_not_block_fast_ones(tenant: Tenant) -> None:
    tenant.deploy("sleepy", "python3.11", {"handler.py": ECHO}, timeout_sec=10)
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        slow = [pool.submit(requests.get, tenant.fn_url("sleepy", "/sleep?s=2"), timeout=30) for _ in range(16)]
        time.sleep(0.3)  # the scenario: the 16 slow calls get into their 2 s handlers first (nothing reports it)
        started = time.monotonic()
        fast = requests.get(tenant.fn_url("sleepy"), timeout=30)
        fast_elapsed = time.monotonic() - started
        assert all(f.result().status_code == 200 for f in slow)
    assert fast.status_code == 200
    assert fast_elapsed < 1.5, fast_elapsed


def test_crashing_runtime_is_restarted(tenant: Tenant) -> None:
    code = ("import os\n\ndef handle(event):\n    if event.get('_path') == '/die':\n        os._exit(3)\n"
            "    return 'alive'\n")
    tenant.deploy("crashy", "python3.11", {"handler.py": code})
    assert requests.get(tenant.fn_url("crashy"), timeout=30).text == "alive"
    assert requests.get(tenant.fn_url("crashy", "/die"), timeout=30).status_code == 502
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        resp = requests.get(tenant.fn_url("crashy"), timeout=30)
        if resp.status_code == 200:
            break
        time.sleep(0.2)
    assert resp.text == "alive"
