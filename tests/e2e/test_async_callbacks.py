"""Callback URLs of async calls on `sless up`: the outcome POSTed when the call ends, private addresses refused
unless the operator opened their network, redirects not followed, failed deliveries retried then recorded."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.async_calls import ECHO, FAILING, FAST_RETRIES, wait_call
from tests.support.platform import SlessProcess, Tenant, running_sless

pytestmark = pytest.mark.e2e
HEADERS = "def handle(event):\n    return sorted(k.lower() for k in event['_headers'])\n"


class Receiver:
    """A callback receiver on loopback: ``/ok`` answers 204, ``/fail`` 500, ``/redirect`` 302 to ``/ok``."""

    def __init__(self) -> None:
        self.hits: list[dict[str, Any]] = []
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status = {"/ok": 204, "/fail": 500, "/redirect": 302}.get(self.path.split("?", 1)[0], 404)
                self.send_response(status)
                if status == 302:
                    self.send_header("Location", "/ok")
                self.send_header("Content-Length", "0")
                self.end_headers()
                with receiver.arrived:
                    receiver.hits.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
                    receiver.arrived.notify_all()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, count: int, path_prefix: str, timeout: float = 30) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        with self.arrived:
            while len(found := [h for h in self.hits if h["path"].startswith(path_prefix)]) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{count} callback(s) to {path_prefix} did not arrive: {self.hits}")
                self.arrived.wait(left)
        return found


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    rec = Receiver()
    yield rec
    rec.server.shutdown()


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlessProcess]:
    env = FAST_RETRIES | {"SLESS_CALLBACK_ALLOWED_NETS": "127.0.0.0/8", "SLESS_CALLBACK_ATTEMPTS": "2",
                          "SLESS_CALLBACK_TIMEOUT_SEC": "5"}
    with running_sless(Path(tmp_path_factory.mktemp("callbacks")), env) as sp:
        yield sp


@pytest.fixture(scope="module")
def owner(platform: SlessProcess) -> Tenant:
    tenant = Tenant(platform.url, "callback-owner")
    tenant.deploy("echo", "python3.11", {"handler.py": ECHO})
    tenant.deploy("broken", "python3.11", {"handler.py": FAILING})
    return tenant


def submit(tenant: Tenant, function: str, callback: str, asynchronous: bool = True) -> requests.Response:
    headers = {"X-Sless-Callback-Url": callback} | ({"Prefer": "respond-async"} if asynchronous else {})
    return requests.post(tenant.fn_url(function), json={"x": 7}, headers=headers, timeout=30)


def wait_callback_state(tenant: Tenant, call_id: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    call = wait_call(tenant, call_id)
    while call["callback"]["state"] in ("pending", "sending") and time.monotonic() < deadline:
        time.sleep(0.1)
        call = tenant.api("GET", f"/calls/{call_id}", expect=200).json()
    return call


def test_the_outcome_is_posted_to_the_callback_when_the_call_ends(owner: Tenant, receiver: Receiver) -> None:
    accepted = submit(owner, "echo", f"{receiver.url}/ok?token=receiver-secret")
    assert accepted.status_code == 202, accepted.text
    call_id = accepted.json()["id"]
    hit = next(h for h in receiver.wait(1, "/ok?token=") if h["body"]["id"] == call_id)
    assert hit["headers"]["X-Sless-Call-Id"] == call_id
    assert hit["headers"]["X-Request-Id"] == accepted.json()["request_id"]
    assert hit["body"]["state"] == "succeeded" and json.loads(hit["body"]["result"]["body"])["got"] == 7
    call = wait_callback_state(owner, call_id)
    assert call["callback"] == {"url": f"{receiver.url}/ok", "state": "delivered: HTTP 204"}  # no token shown


def test_a_dead_call_is_posted_too(owner: Tenant, receiver: Receiver) -> None:
    call_id = submit(owner, "broken", f"{receiver.url}/ok?dead").json()["id"]
    hit = receiver.wait(1, "/ok?dead")[0]
    assert hit["body"]["id"] == call_id and hit["body"]["state"] == "dead" and hit["body"]["attempts"] == 3


def test_a_failing_receiver_is_tried_again_then_the_failure_recorded(owner: Tenant, receiver: Receiver) -> None:
    call_id = submit(owner, "echo", f"{receiver.url}/fail").json()["id"]
    assert len(receiver.wait(2, "/fail")) == 2  # SLESS_CALLBACK_ATTEMPTS=2
    call = wait_callback_state(owner, call_id)
    assert call["callback"]["state"] == "failed: HTTP 500 after 2 attempt(s)"
    assert call["state"] == "succeeded"  # the call itself went fine


def test_redirects_are_not_followed(owner: Tenant, receiver: Receiver) -> None:
    before = len([h for h in receiver.hits if h["path"] == "/ok"])
    call_id = submit(owner, "echo", f"{receiver.url}/redirect").json()["id"]
    call = wait_callback_state(owner, call_id)
    assert call["callback"]["state"] == "failed: HTTP 302 after 1 attempt(s) (redirects are not followed)"
    assert len([h for h in receiver.hits if h["path"] == "/ok"]) == before


def test_refused_callbacks_store_nothing(owner: Tenant) -> None:
    for url, why in [("http://169.254.169.254/latest/meta-data/", "not a public address"),
                     ("ftp://127.0.0.1/x", "http:// or https://"), ("http://u:p@127.0.0.1/x", "credentials")]:
        refused = submit(owner, "echo", url)
        assert refused.status_code == 400 and why in refused.json()["error"], refused.text
    plain = submit(owner, "echo", "http://127.0.0.1/x", asynchronous=False)
    assert plain.status_code == 400 and "needs an asynchronous call" in plain.json()["error"]
    listed = owner.api("GET", "/calls?function=echo&limit=500", expect=200).json()["items"]
    assert all(c["callback"] is None or c["callback"]["url"].startswith("http://127.0.0.1:") for c in listed)


def test_without_an_allowed_network_loopback_is_refused(tmp_path: Path) -> None:
    with running_sless(tmp_path, FAST_RETRIES) as sp:
        tenant = Tenant(sp.url, "callback-closed")
        tenant.deploy("echo", "python3.11", {"handler.py": ECHO})
        refused = submit(tenant, "echo", "http://127.0.0.1:9/hook")
        assert refused.status_code == 400 and "SLESS_CALLBACK_ALLOWED_NETS" in refused.json()["error"]
        assert tenant.api("GET", "/calls", expect=200).json()["items"] == []


def test_the_callback_header_never_reaches_the_function(owner: Tenant, receiver: Receiver) -> None:
    owner.deploy("headers", "python3.11", {"handler.py": HEADERS})
    call_id = submit(owner, "headers", f"{receiver.url}/ok?hdr").json()["id"]
    call = wait_call(owner, call_id)
    names = json.loads(call["result"]["body"])
    assert "x-request-id" in names and "x-sless-callback-url" not in names
    assert receiver.wait(1, "/ok?hdr")[0]["body"]["id"] == call_id
