"""Request ids, the JSON access log and /metrics, on `sless up` and on `sless-api` (gunicorn, 2 workers)."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import re
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.metricdocs import undocumented_series
from tests.support.metrics import SCRAPE_TOKEN, sample, scrape
from tests.support.platform import SECRET, SlessProcess, Tenant, free_port, running_sless, serving

pytestmark = pytest.mark.e2e

ECHO = "def handle(event):\n    return {'headers': event['_headers']}\n"


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlessProcess]:
    with running_sless(Path(tmp_path_factory.mktemp("observed")), {"SLESS_METRICS_TOKEN": SCRAPE_TOKEN}) as sp:
        yield sp


@pytest.fixture(scope="module")
def echo(observed: SlessProcess) -> Tenant:
    tenant = Tenant(observed.url, "observer")
    tenant.deploy("echo", "python3.11", {"handler.py": ECHO})
    return tenant


def log_lines(sp: SlessProcess) -> list[dict[str, Any]]:
    """The JSON lines of the server's log (uvicorn and the platform print nothing else by default)."""
    lines = []
    for line in sp.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def function_headers(tenant: Tenant, request_id: str | None = None, twice: bool = False) -> tuple[str, Any]:
    """Call the echo function (optionally sending X-Request-Id, or two of them); the answer's id and the
    headers the function saw."""
    parsed = urllib.parse.urlparse(tenant.fn_url("echo"))
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    conn.putrequest("GET", parsed.path)
    if request_id is not None:
        conn.putheader("X-Request-Id", request_id)
        if twice:
            conn.putheader("X-Request-Id", "second")
    conn.endheaders()
    resp = conn.getresponse()
    body = json.loads(resp.read())
    conn.close()
    assert resp.status == 200, body
    return str(resp.getheader("X-Request-Id")), {k.lower(): v for k, v in body["headers"].items()}


def test_a_sane_request_id_is_kept_passed_to_the_function_and_recorded(echo: Tenant) -> None:
    answered, seen = function_headers(echo, "trace-abc.123:x")
    assert answered == "trace-abc.123:x" and seen["x-request-id"] == "trace-abc.123:x"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        items = echo.api("GET", "/functions/echo/invocations?limit=20", expect=200).json()["items"]
        if any(item.get("request_id") == "trace-abc.123:x" for item in items):
            return
        time.sleep(0.2)
    raise AssertionError(f"no invocation record carries the request id: {items}")


@pytest.mark.parametrize("sent", ["", "a b", "x" * 129, "-leading-dash", "new\u00e9line", "<script>"])
def test_an_unusable_request_id_is_replaced_by_a_fresh_one(echo: Tenant, sent: str) -> None:
    answered, seen = function_headers(echo, sent.encode("utf-8").decode("latin-1"))
    assert re.fullmatch(r"[0-9a-f]{32}", answered), answered
    assert seen["x-request-id"] == answered


def test_two_request_ids_become_one_fresh_one(echo: Tenant) -> None:
    answered, seen = function_headers(echo, "first", twice=True)
    assert re.fullmatch(r"[0-9a-f]{32}", answered) and seen["x-request-id"] == answered


def test_rest_answers_and_errors_carry_a_request_id(observed: SlessProcess) -> None:
    ok = requests.get(observed.url + "/health", timeout=10)
    refused = requests.get(observed.url + "/v1/whoami", timeout=10)
    missing = requests.get(observed.url + "/v1/nothing-here", headers={"X-Request-Id": "mine-1"}, timeout=10)
    assert ok.status_code == 200 and re.fullmatch(r"[0-9a-f]{32}", ok.headers["X-Request-Id"])
    assert refused.status_code == 401 and refused.headers["X-Request-Id"] != ok.headers["X-Request-Id"]
    assert missing.status_code == 404 and missing.headers["X-Request-Id"] == "mine-1"


def test_the_access_log_is_one_json_line_per_request_without_the_query(observed: SlessProcess, echo: Tenant) -> None:
    requests.get(echo.fn_url("echo", "/p?token=do-not-log-me"), headers={"X-Request-Id": "access-1"}, timeout=30)
    deadline = time.monotonic() + 10
    lines: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        lines = [line for line in log_lines(observed) if line.get("request_id") == "access-1"]
        if lines:
            break
        time.sleep(0.1)
    access = [line for line in lines if line["logger"] == "sless.access"]
    assert len(access) == 1, lines
    entry = access[0]
    assert entry["method"] == "GET" and entry["status"] == 200 and entry["path"] == f"/fn/{echo.ns}/echo/p"
    assert entry["duration_ms"] > 0 and entry["bytes"] > 0 and entry["level"] == "info"
    assert "do-not-log-me" not in observed.log_path.read_text(errors="replace")


def test_metrics_are_off_without_a_scrape_token(tenant: Tenant) -> None:
    """The session's shared `sless up` has no SLESS_METRICS_TOKEN: /metrics does not exist for anyone."""
    assert requests.get(tenant.url + "/metrics", timeout=10).status_code == 404
    for token in (SCRAPE_TOKEN, tenant.token):
        resp = requests.get(tenant.url + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert resp.status_code == 404 and "SLESS_METRICS_TOKEN" in resp.json()["error"]


@pytest.mark.parametrize("token", [None, "", "wrong", SCRAPE_TOKEN + "x", SCRAPE_TOKEN[:-1]])
def test_metrics_refuse_anything_but_the_scrape_token(observed: SlessProcess, token: str | None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    resp = requests.get(observed.url + "/metrics", headers=headers, timeout=10)
    assert resp.status_code == 401 and resp.json()["error"] and "sless_" not in resp.text


def test_a_tenant_token_does_not_open_metrics(observed: SlessProcess) -> None:
    tenant = Tenant(observed.url, "nosy")
    resp = requests.get(observed.url + "/metrics", headers={"Authorization": f"Bearer {tenant.token}"}, timeout=10)
    assert resp.status_code == 401


def test_metrics_count_calls_cold_starts_and_builds(observed: SlessProcess, echo: Tenant) -> None:
    before = scrape(observed.url)
    for _ in range(3):
        assert requests.get(echo.fn_url("echo"), timeout=30).status_code == 200
    after = scrape(observed.url)
    labels = {"namespace": echo.ns, "function": "echo", "trigger": "http", "status": "200"}
    assert sample(after, "sless_invocations_total", **labels) == sample(before, "sless_invocations_total", **labels) + 3
    fn_answers = {"area": "fn", "status": "200"}  # counted by the invoke proxy itself, not the REST access log
    assert sample(after, "sless_http_requests_total", **fn_answers) == \
        sample(before, "sless_http_requests_total", **fn_answers) + 3
    assert sample(after, "sless_invocation_duration_seconds_count", namespace=echo.ns, function="echo",
                  trigger="http", status_class="2xx") >= 3
    assert sample(after, "sless_builds_total", runtime="python3.11", result="ready") >= 1
    assert sample(after, "sless_cold_starts_total", runtime="python3.11") >= 1


SLOW = """\
import time

def handle(event):
    time.sleep(float(event.get("s", 0)))
    return {"slept": event.get("s", 0)}
"""


def test_the_exposition_is_what_the_readme_says(observed: SlessProcess) -> None:
    """Calls of every trigger the platform makes on `sless up` (http, async, job), a call held in flight:
    every series, label and listed label value of the scrape is in the README's metrics table."""
    tenant = Tenant(observed.url, "observer-docs")
    tenant.deploy("slow", "python3.11", {"handler.py": SLOW})
    assert requests.post(tenant.fn_url("slow"), json={"s": 0}, timeout=30).status_code == 200
    queued = requests.post(tenant.fn_url("slow"), json={"s": 0}, headers={"Prefer": "respond-async"}, timeout=30)
    assert queued.status_code == 202, queued.text
    call_path = queued.json()["status_url"].removeprefix(f"/v1/namespaces/{tenant.ns}")
    tenant.api("POST", "/jobs", json={"name": "once", "function": "slow", "event": {"s": 0}}, expect=201)
    assert tenant.wait_job("once")["phase"] == "Succeeded"
    deadline = time.monotonic() + 60
    while tenant.api("GET", call_path, expect=200).json()["state"] != "succeeded":
        assert time.monotonic() < deadline, "the async call did not finish"
        time.sleep(0.1)
    in_flight = {"namespace": tenant.ns, "function": "slow"}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(requests.post, tenant.fn_url("slow"), json={"s": 3}, timeout=30)
        deadline = time.monotonic() + 10
        while sample(scrape(observed.url), "sless_invocations_in_flight", **in_flight) != 1:
            assert time.monotonic() < deadline and not held.done(), "the held call never showed as in flight"
            time.sleep(0.05)
        assert held.result().status_code == 200
    text = scrape(observed.url)
    assert sample(text, "sless_invocations_in_flight", **in_flight) == 0
    for trigger in ("http", "async", "job"):
        assert sample(text, "sless_invocations_total", **in_flight, trigger=trigger, status="200") >= 1, trigger
    # the finest bucket is 0.1 ms: a warm call's latency is resolved, not lumped under 5 ms
    assert 'le="0.0001"' in text
    assert undocumented_series(text) == []


def test_metrics_count_an_unreachable_function(observed: SlessProcess, echo: Tenant) -> None:
    """A function whose process dies mid-call: the proxy answers 502 and counts it."""
    before = sample(scrape(observed.url), "sless_proxy_upstream_errors_total", kind="unreachable")
    dying = Tenant(observed.url, "observer-dying")
    dying.deploy("dying", "python3.11", {"handler.py": "import os\ndef handle(event):\n    os._exit(3)\n"})
    assert requests.get(dying.fn_url("dying"), timeout=60).status_code == 502
    assert sample(scrape(observed.url), "sless_proxy_upstream_errors_total", kind="unreachable") == before + 1


def test_gunicorn_workers_sum_their_metrics(tmp_path: Path) -> None:
    """`sless-api` with two worker processes: one scrape sees every worker's calls (multiprocess mode)."""
    port = free_port()
    env = {**os.environ, "SLESS_JWT_SECRET": SECRET, "SLESS_DATA_DIR": str(tmp_path), "SLESS_WORKERS": "2",
           "SLESS_BIND": f"127.0.0.1:{port}", "SLESS_METRICS_TOKEN": SCRAPE_TOKEN}
    env.pop("SLESS_DATABASE_URL", None)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = tmp_path / "sless-api.log"
    sent = 0
    with serving([sys.executable, "-m", "sless_api.main.serve"], env, log, f"http://127.0.0.1:{port}") as url:
        # Parallel new connections until both workers have answered some (an idle kernel may wake the same
        # worker for a while): bounded rounds, every request counted.
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            for _ in range(40):  # a loaded machine can leave one worker asleep for several rounds
                answers = list(pool.map(lambda _: requests.get(url + "/nothing", headers={"Connection": "close"},
                                                               timeout=10).status_code, range(64)))
                assert answers == [404] * 64
                sent += 64
                if len(access_pids(log)) == 2:
                    break
        text = scrape(url)
        assert requests.get(url + "/metrics", timeout=10).status_code == 401
    assert len(access_pids(log)) == 2, "both workers should have served"
    assert sample(text, "sless_http_requests_total", area="api", status="404") == sent
    assert undocumented_series(text) == []


def access_pids(log: Path) -> set[int]:
    """The processes that wrote access-log lines so far."""
    lines = [json.loads(line) for line in log.read_text(errors="replace").splitlines() if line.startswith("{")]
    return {line["pid"] for line in lines if line.get("logger") == "sless.access"}
