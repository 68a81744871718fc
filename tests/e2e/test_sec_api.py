"""The API as an attacker meets it on `sless up`: deny by default, names validated, no credential reaches a function.

Paths are sent byte for byte (http.client, no normalisation) because the holes this closes lived in the
spelling: ``//v1/...`` and ``/%2Fv1/...`` used to reach the routes without a token.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
import uuid

import jwt
import pytest
import requests

from tests.support.attack import VICTIM_FUNCTION, VICTIM_JOB, raw_request, walk
from tests.support.platform import SECRET, SlessProcess, Tenant

pytestmark = pytest.mark.e2e

ECHO = """
def handle(event):
    return {'path': event['_path'], 'query': event['_query'], 'headers': event['_headers']}
"""


@pytest.fixture
def victim(tenant: Tenant) -> tuple[Tenant, str]:
    mark = f"mark-{uuid.uuid4()}"
    tenant.deploy(VICTIM_FUNCTION, "python3.11", {"handler.py": ECHO}, env_vars={"SECRET_MARK": mark})
    tenant.api("POST", "/jobs", json={"name": VICTIM_JOB, "function": VICTIM_FUNCTION, "run_id": 0}, expect=201)
    return tenant, mark


def test_every_route_denies_an_attacker_however_the_path_is_spelled(sless: SlessProcess,
                                                                     victim: tuple[Tenant, str]) -> None:
    tenant, mark = victim
    assert walk(sless.url, tenant, mark) > 1000


def test_the_victim_still_reads_its_own_objects(sless: SlessProcess, victim: tuple[Tenant, str]) -> None:
    """The walk's 401s are not a broken API: the right token on the canonical path works."""
    tenant, mark = victim
    record = tenant.api("GET", f"/functions/{VICTIM_FUNCTION}", expect=200).json()
    assert record["env_vars"]["SECRET_MARK"] == mark
    answer = raw_request(sless.url, "GET", f"/v1/namespaces/{tenant.ns}/functions/{VICTIM_FUNCTION}/",
                         {"Authorization": f"Bearer {tenant.token}"})
    assert answer.status == 200  # one trailing slash is the same resource


def admin_headers(sub: str = "root") -> dict[str, str]:
    token = jwt.encode({"sub": sub, "exp": int(time.time()) + 600, "sless_admin": True}, SECRET, algorithm="HS256")
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("namespace", ["default", "kube-system", "sless-system", "functions", "logs", "..",
                                       "SLESS-0123456789ABCDEF", "sless-0123456789abcde", "sless-0123456789abcdef0",
                                       "sless-0123456789abcdef%0A", "%2E%2E", "sless-01234567%2F89abcdef"])
def test_only_tenant_namespaces_exist_even_for_admins(sless: SlessProcess, namespace: str) -> None:
    for suffix in ("/functions", "/ensure", "/triggers", "/functions/x"):
        method = "POST" if suffix == "/ensure" else "GET"
        answer = raw_request(sless.url, method, f"/v1/namespaces/{namespace}{suffix}", admin_headers())
        assert answer.status in (400, 404), (namespace, suffix, answer.status, answer.body[:200])
        assert json.loads(answer.body)["error"]


def test_a_name_with_a_trailing_newline_is_refused(tenant: Tenant) -> None:
    tenant.api("POST", "/ensure", expect=(200, 201))
    resp = tenant.api("POST", "/functions", json={"name": "evil\n", "runtime": "python3.11"})
    assert resp.status_code == 400 and resp.json()["field"] == "name"
    answer = raw_request(tenant.url, "GET", f"/v1/namespaces/{tenant.ns}/functions/evil%0A",
                         {"Authorization": f"Bearer {tenant.token}"})
    assert answer.status == 404


# --- the invoke proxy ---------------------------------------------------------------------------------------

def echo_call(tenant: Tenant, target_tail: str, headers: dict[str, str]) -> tuple[int, dict[str, str], dict]:
    parsed = urllib.parse.urlparse(tenant.fn_url(VICTIM_FUNCTION))
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    try:
        conn.putrequest("GET", parsed.path + target_tail, skip_accept_encoding=True)
        for key, value in headers.items():
            conn.putheader(key, value)
        conn.endheaders()
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, dict(resp.getheaders()), json.loads(raw) if raw else {}
    finally:
        conn.close()


def test_credentials_never_reach_a_function(victim: tuple[Tenant, str]) -> None:
    tenant, _ = victim
    status, _, body = echo_call(tenant, "/", {"Authorization": f"Bearer {tenant.token}", "Cookie": "session=1",
                                              "X-Sless-Sub": "admin", "X-Kept": "yes"})
    assert status == 200
    seen = body["headers"]
    assert seen.get("x-kept") == "yes"
    for header in ("authorization", "cookie", "x-sless-sub"):
        assert header not in seen, header
    assert tenant.token not in json.dumps(body)


def test_a_token_trigger_passes_the_verified_caller(victim: tuple[Tenant, str]) -> None:
    tenant, _ = victim
    tenant.api("PATCH", f"/triggers/{VICTIM_FUNCTION}", json={"auth": "token"}, expect=200)
    status, _, body = echo_call(tenant, "/", {"Authorization": f"Bearer {tenant.token}", "X-Sless-Sub": "forged"})
    assert status == 200
    assert body["headers"]["x-sless-sub"] == tenant.sub
    assert "authorization" not in body["headers"]


def test_a_second_http_trigger_cannot_open_a_protected_url(victim: tuple[Tenant, str]) -> None:
    """A function has one URL: a public http trigger beside a token one made it public (200 without a token).
    The second http trigger is refused, by POST and by a PATCH that would move another function's one to it."""
    tenant, _ = victim
    tenant.api("PATCH", f"/triggers/{VICTIM_FUNCTION}", json={"auth": "token"}, expect=200)
    refused = tenant.api("POST", "/triggers", json={"name": "open-door", "type": "http",
                                                    "function": VICTIM_FUNCTION}, expect=409).json()
    assert f"has the http trigger {VICTIM_FUNCTION} already" in refused["error"]
    tenant.api("POST", "/functions", json={"name": "other", "runtime": "python3.11"}, expect=201)
    tenant.api("POST", "/triggers", json={"name": "other-web", "type": "http", "function": "other"}, expect=201)
    tenant.api("PATCH", "/triggers/other-web", json={"function": VICTIM_FUNCTION}, expect=409)
    assert requests.get(tenant.fn_url(VICTIM_FUNCTION), timeout=30).status_code == 401
    mapped = {t["name"]: t["function"] for t in tenant.api("GET", "/triggers", expect=200).json()["items"]}
    assert mapped == {"other-web": "other", VICTIM_FUNCTION: VICTIM_FUNCTION}
    tenant.api("PATCH", f"/triggers/{VICTIM_FUNCTION}", json={"auth": "public"}, expect=200)  # its own PATCH: fine
    assert requests.get(tenant.fn_url(VICTIM_FUNCTION), timeout=30).status_code == 200


def test_forwarded_headers_are_appended_to_not_replaced(victim: tuple[Tenant, str]) -> None:
    tenant, _ = victim
    status, _, body = echo_call(tenant, "/", {"X-Forwarded-For": "6.6.6.6", "X-Forwarded-Proto": "gopher",
                                              "X-Forwarded-Host": "evil.example"})
    assert status == 200
    seen = body["headers"]
    assert seen["x-forwarded-for"] == "6.6.6.6, 127.0.0.1"
    assert seen["x-forwarded-proto"] == "gopher, http"
    host = urllib.parse.urlparse(tenant.url).netloc
    assert seen["x-forwarded-host"] == f"evil.example, {host}"
    status, _, body = echo_call(tenant, "/", {})
    assert body["headers"]["x-forwarded-for"] == "127.0.0.1" and body["headers"]["x-forwarded-proto"] == "http"


def test_the_path_reaches_the_function_as_sent(victim: tuple[Tenant, str]) -> None:
    tenant, _ = victim
    status, _, body = echo_call(tenant, "/a%3Fb/c%2Fd/%25?x=1", {})
    assert status == 200
    assert body["path"] == "/a%3Fb/c%2Fd/%25" and body["query"] == {"x": "1"}


@pytest.mark.parametrize("tail", ["/_/health", "/_", "//_/health", "/%5F/health", "/%5f/health", "/./_/health",
                                  "/x/../_/health", "/%2E/_/health", "/%255F/health", "/_%2Fhealth",
                                  "/\\_/health"])
def test_the_runtime_endpoints_are_not_reachable(victim: tuple[Tenant, str], tail: str) -> None:
    tenant, _ = victim
    status, _, body = echo_call(tenant, tail, {})
    assert status == 404, (tail, body)


def test_function_responses_are_sandboxed_from_the_console(victim: tuple[Tenant, str]) -> None:
    tenant, _ = victim
    resp = requests.get(tenant.fn_url(VICTIM_FUNCTION), timeout=30)
    assert resp.status_code == 200
    assert resp.headers["content-security-policy"].startswith("sandbox")
    assert "allow-same-origin" not in resp.headers["content-security-policy"]


@pytest.mark.parametrize("path", ["/fn/default/victim", "/fn/kube-system/x", "/fn/../victim", "/fn/%2E%2E/x",
                                  "//fn/sless-0123456789abcdef/victim", "/%66n/sless-0123456789abcdef/victim"])
def test_invoke_paths_outside_tenant_namespaces_are_404(sless: SlessProcess, path: str) -> None:
    answer = raw_request(sless.url, "GET", path, {})
    assert answer.status == 404, (path, answer.body[:200])


# --- failures of a function's own process --------------------------------------------------------------------

@pytest.mark.parametrize(("runtime", "files"), [
    ("python3.11", {"handler.py": "import no_such_module_here\n\ndef handle(event):\n    return 1\n"}),
    ("nodejs20", {"handler.js": "require('no-such-module-here');\nexports.handle = async () => 1;\n"}),
])
def test_a_function_that_does_not_load_fails_its_deploy_in_one_line_without_paths(sless: SlessProcess, tenant: Tenant,
                                                                       runtime: str, files: dict[str, str]) -> None:
    tenant.api("POST", "/ensure", expect=(200, 201))
    tenant.api("POST", "/functions", json={"name": "noload", "runtime": runtime}, expect=201)
    tenant.upload("noload", files)
    tenant.api("POST", "/triggers", json={"name": "noload", "type": "http", "function": "noload"}, expect=201)
    record = tenant.wait_phase("noload", ("Ready", "Failed"))
    # The build loads the entrypoint: a function that cannot load is Failed at deploy time, not Ready.
    assert record["phase"] == "Failed", record
    assert "the function does not load: " in record["message"], record["message"]
    assert "no-such-module-here" in record["message"].replace("_", "-")
    assert record["message"].count("load") == 1, record["message"]  # it said "does not load: ... failed to load"
    resp = requests.get(tenant.fn_url("noload"), timeout=60)
    assert resp.status_code == 404 and "not ready" in resp.json()["error"]
    texts = [record["message"], resp.text]
    for text in texts:
        assert "Traceback" not in text and "File \"" not in text and " at " not in text, text
        assert str(sless.data_dir) not in text and "/runtimes/" not in text, text
