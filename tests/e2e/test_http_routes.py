"""An http trigger's methods and CORS settings through `sless up`: 405 with Allow, preflights answered by the
platform (never reaching the function), CORS headers on every answer to an allowed origin, bad settings 400."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import requests

from tests.support import cors
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
