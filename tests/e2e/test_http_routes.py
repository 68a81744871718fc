"""An http trigger's path pattern, methods and CORS settings through `sless up`: each pattern its own auth and
methods with its parameters in the event, 404 where no trigger serves a path, the same URLs twice refused, 405
with Allow, preflights answered by the platform (never reaching the function), CORS headers on every answer to an
allowed origin, bad settings 400."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import requests

from tests.support import cors
from tests.support.attack import raw_request
from tests.support.platform import REPO, Tenant

pytestmark = pytest.mark.e2e
APP = "https://app.example.com"
#: Counts its calls in its answer; sets a CORS header of its own, which the trigger's settings replace.
COUNTER = """
calls = []

def handle(event):
    calls.append(event["_method"])
    return {"statusCode": 200, "headers": {"Access-Control-Allow-Origin": "https://function.example"},
            "body": {"calls": calls}}
"""


#: Answers with what the platform passed it of the path (and whether a caller's own parameters header got through).
PATHS = """
def handle(event):
    return {"path": event["_path"], "params": event["_params"], "sub": event["_headers"].get("x-sless-sub"),
            "claimed": event["_headers"].get("x-sless-params")}
"""


def routed(tenant: Tenant, name: str, **trigger: object) -> str:
    tenant.deploy(name, "python3.11", {"handler.py": COUNTER}, http=False)
    tenant.api("POST", "/triggers", json={"name": name, "type": "http", "function": name, **trigger}, expect=201)
    return tenant.fn_url(name)


def test_methods_the_trigger_does_not_allow_are_405_with_allow(tenant: Tenant) -> None:
    url = routed(tenant, "posts-only", methods=["POST", "PUT"])
    refused = requests.get(url, timeout=30)
    assert refused.status_code == 405 and refused.headers["Allow"] == "POST, PUT", refused.text
    assert "GET is not allowed" in refused.json()["error"]
    assert requests.delete(url, timeout=30).status_code == 405
    assert requests.post(url, json={}, timeout=30).json() == {"calls": ["POST"]}  # the refused ones never ran
    tenant.api("PATCH", "/triggers/posts-only", json={"methods": None}, expect=200)
    assert requests.get(url, timeout=30).status_code == 200


def test_cors_preflights_are_answered_by_the_platform_and_answers_carry_the_headers(tenant: Tenant) -> None:
    url = routed(tenant, "browser", cors={"origins": [APP], "methods": ["GET", "POST"], "headers": ["X-Token"],
                                          "credentials": True, "max_age": 120})
    cors.assert_allowed(cors.preflight(url, APP), APP, 120)
    for refused in ({"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
                    {"Origin": APP, "Access-Control-Request-Method": "DELETE"},
                    {"Origin": APP, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "X-No"}):
        answer = requests.options(url, headers=refused, timeout=30)
        assert answer.status_code == 403 and "Access-Control-Allow-Origin" not in answer.headers, refused
    called = requests.post(url, json={}, headers={"Origin": APP}, timeout=30)
    # the function's own CORS header is replaced by the trigger's; the preflights never reached it
    assert called.json() == {"calls": ["POST"]}
    assert called.headers["Access-Control-Allow-Origin"] == APP and called.headers["Vary"] == "Origin"
    assert called.headers["Access-Control-Allow-Credentials"] == "true"
    stranger = requests.post(url, json={}, headers={"Origin": "https://evil.example"}, timeout=30)
    assert stranger.status_code == 200 and "Access-Control-Allow-Origin" not in stranger.headers
    # a plain OPTIONS (no preflight) is the function's; a refusal carries the headers too (the page can read it)
    assert requests.options(url, timeout=30).json()["calls"][-1] == "OPTIONS"
    tenant.api("PATCH", "/triggers/browser", json={"methods": ["POST"]}, expect=200)
    refused = requests.get(url, headers={"Origin": APP}, timeout=30)
    assert refused.status_code == 405 and refused.headers["Access-Control-Allow-Origin"] == APP
    # a preflight is not a call: only the function's own calls are recorded
    records = tenant.api("GET", "/functions/browser/invocations", expect=200).json()["items"]
    assert all(r["status"] != 204 for r in records)


def test_any_origin_without_credentials(tenant: Tenant) -> None:
    url = routed(tenant, "public-api", cors={"origins": ["*"]})
    answer = requests.get(url, headers={"Origin": "https://anyone.example"}, timeout=30)
    assert answer.headers["Access-Control-Allow-Origin"] == "*" and "Vary" not in answer.headers


def test_bad_route_settings_are_400_naming_the_field(tenant: Tenant) -> None:
    tenant.deploy("plain", "python3.11", {"handler.py": COUNTER}, http=False)
    base = {"name": "t", "type": "http", "function": "plain"}
    for fields, field in (({"methods": ["TRACE"]}, "methods"), ({"methods": []}, "methods"),
                          ({"cors": {"origins": ["*"], "credentials": True}}, "cors.credentials"),
                          ({"cors": {"origins": ["https://a.example/x"]}}, "cors.origins"),
                          ({"cors": {"origins": [APP], "max_age": -1}}, "cors.max_age"),
                          ({"cors": {"origins": [APP], "bogus": 1}}, "cors.bogus")):
        body = tenant.api("POST", "/triggers", json={**base, **fields}, expect=400).json()
        assert body["field"] == field, body
    cron = {"name": "c", "type": "cron", "function": "plain", "schedule": "* * * * *"}
    tenant.api("POST", "/triggers", json={**cron, "methods": ["GET"]}, expect=400)
    tenant.api("POST", "/triggers", json={**cron, "cors": {"origins": [APP]}}, expect=400)


def test_the_cli_sets_methods_and_cors_origins(tenant: Tenant) -> None:
    tenant.deploy("from-cli", "python3.11", {"handler.py": COUNTER}, http=False)
    env = {**os.environ, "SLESS_TOKEN": tenant.token, "SLESS_URL": tenant.url}
    done = subprocess.run([sys.executable, "-m", "sless_api", "trigger", "add", "from-cli", "--function", "from-cli",
                           "--methods", "post,PUT", "--cors-origin", APP, "-o", "json"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert tenant.api("GET", "/triggers/from-cli", expect=200).json()["methods"] == ["POST", "PUT"]
    assert requests.get(tenant.fn_url("from-cli"), timeout=30).status_code == 405
    answer = requests.post(tenant.fn_url("from-cli"), headers={"Origin": APP}, timeout=30)
    assert answer.headers["Access-Control-Allow-Origin"] == APP
    bad = subprocess.run([sys.executable, "-m", "sless_api", "trigger", "add", "bad", "--function", "from-cli",
                          "--methods", "FETCH"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
                         check=False)
    assert bad.returncode == 1 and "HTTP 400" in bad.stderr and "Traceback" not in bad.stderr


def path_triggers(tenant: Tenant, function: str, *triggers: dict[str, object]) -> str:
    tenant.deploy(function, "python3.11", {"handler.py": PATHS}, http=False)
    for body in triggers:
        made = tenant.api("POST", "/triggers", json={"type": "http", "function": function, **body}, expect=201).json()
        assert made["url"] == tenant.fn_url(function, str(body.get("path", ""))), made
    return tenant.fn_url(function)


def test_each_path_pattern_is_served_by_its_own_trigger_with_its_parameters(tenant: Tenant) -> None:
    url = path_triggers(tenant, "shop", {"name": "items", "path": "/items/{id}"},
                        {"name": "mine", "path": "/items/mine", "auth": "token"},
                        {"name": "admin", "path": "/admin/{op}", "auth": "token", "methods": ["POST"]})
    bearer = {"Authorization": f"Bearer {tenant.token}"}
    item = requests.get(f"{url}/items/caf%C3%A9?x=1", headers={"X-Sless-Params": '{"id": "forged"}'}, timeout=30)
    assert item.status_code == 200, item.text
    assert item.json() == {"path": "/items/caf%C3%A9", "params": {"id": "café"}, "sub": None, "claimed": None}
    # a literal segment wins over a parameter: /items/mine is the token trigger's, in any spelling
    assert requests.get(f"{url}/items/mine", timeout=30).status_code == 401
    ns_path = f"/fn/{tenant.ns}/shop"
    assert raw_request(tenant.url, "GET", f"{ns_path}/%69tems/mine", {}).status == 401
    mine = requests.get(f"{url}/items/mine/", headers=bearer, timeout=30).json()
    assert mine["params"] == {} and mine["sub"] == tenant.sub
    assert requests.get(f"{url}/admin/reset", headers=bearer, timeout=30).status_code == 405
    assert requests.post(f"{url}/admin/reset", headers=bearer, timeout=30).json()["params"] == {"op": "reset"}
    nowhere = requests.get(f"{url}/elsewhere", timeout=30)
    assert nowhere.status_code == 404 and "no http trigger of function shop" in nowhere.json()["error"]
    assert requests.get(url, timeout=30).status_code == 404  # the function's own URL has no trigger either
    for dotted in (f"{ns_path}/items/%2e%2e/items/mine", f"{ns_path}/x/../items/mine", f"{ns_path}/items/./mine"):
        answer = raw_request(tenant.url, "GET", dotted, {})
        assert answer.status == 400 and b". or .. segment" in answer.body, (dotted, answer)
    # a trigger without a path serves every path no pattern serves; the patterns keep their own auth
    tenant.api("POST", "/triggers", json={"name": "rest", "type": "http", "function": "shop"}, expect=201)
    rest = requests.get(f"{url}/elsewhere/deeper", timeout=30)
    assert rest.json()["params"] == {} and rest.json()["path"] == "/elsewhere/deeper"
    assert requests.get(f"{url}/items/mine", timeout=30).status_code == 401
    tenant.api("PATCH", "/triggers/mine", json={"enabled": False}, expect=200)
    assert requests.get(f"{url}/items/mine", timeout=30).json()["params"] == {"id": "mine"}


def test_two_triggers_for_the_same_urls_are_refused(tenant: Tenant) -> None:
    path_triggers(tenant, "users", {"name": "by-id", "path": "/users/{id}"}, {"name": "me", "path": "/users/me"},
                  {"name": "any"})
    for clash, holder in (({"name": "by-name", "path": "/users/{name}"}, "by-id"),
                          ({"name": "again", "path": "/users/me"}, "me"), ({"name": "second"}, "any")):
        refused = tenant.api("POST", "/triggers", json={"type": "http", "function": "users", **clash},
                             expect=409).json()
        assert f"has the http trigger {holder} already" in refused["error"], refused
    tenant.api("PATCH", "/triggers/me", json={"path": "/users/{who}"}, expect=409)
    tenant.api("PATCH", "/triggers/me", json={"path": "/users/me/avatar"}, expect=200)
    names = {t["name"] for t in tenant.api("GET", "/triggers", expect=200).json()["items"]}
    assert names == {"by-id", "me", "any"}
    for bad in ("users", "/users/", "/a/../b", "/{id}/{id}", "/é", "/" + "/".join("s" * 17), 3):
        body = tenant.api("POST", "/triggers", json={"name": "bad", "type": "http", "function": "users",
                                                     "path": bad}, expect=400).json()
        assert body["field"] == "path", (bad, body)
    cron = {"name": "c", "type": "cron", "function": "users", "schedule": "* * * * *", "path": "/x"}
    assert tenant.api("POST", "/triggers", json=cron, expect=400).json()["field"] == "path"


def test_the_cli_adds_a_path_trigger(tenant: Tenant) -> None:
    tenant.deploy("cli-paths", "python3.11", {"handler.py": PATHS}, http=False)
    env = {**os.environ, "SLESS_TOKEN": tenant.token, "SLESS_URL": tenant.url}
    done = subprocess.run([sys.executable, "-m", "sless_api", "trigger", "add", "orders", "--function", "cli-paths",
                           "--path", "/orders/{order}", "-o", "json"], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["url"] == tenant.fn_url("cli-paths", "/orders/{order}")
    assert requests.get(tenant.fn_url("cli-paths", "/orders/42"), timeout=30).json()["params"] == {"order": "42"}
