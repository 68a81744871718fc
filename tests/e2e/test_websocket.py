"""WebSocket through `sless up`'s `/fn`: an upgrade passes through to a function that exports a websocket handler,
frames are relayed both ways with their close codes, the same auth as HTTP calls applies, and a function that did
not ask for WebSockets refuses them (deny by default)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.parse
from typing import Any

import aiohttp
import pytest

from tests.support.platform import Tenant
from tests.support.platform import invocation_record as record
from tests.support.streams import exchange, ws_url

pytestmark = pytest.mark.e2e

ECHO = """
ended = 0

def handle(event):
    if event['_path'] == '/ended':
        return {'ended': ended}
    return 'plain HTTP'

def websocket(ws, event):
    global ended
    try:
        for message in ws:
            if message == 'close':
                ws.close(4000, 'asked to')
                return
            if message == 'whoami':
                ws.send(event['_path'] + ' ' + event['_headers'].get('x-sless-sub', '-'))
                continue
            ws.send(message)
    finally:
        ended += 1
"""
PLAIN = "def handle(event):\n    return 'no websockets here'\n"


@pytest.fixture
def echo(tenant: Tenant) -> Tenant:
    tenant.deploy("wsecho", "python3.11", {"handler.py": ECHO}, timeout_sec=2)
    return tenant


def handshake(url: str) -> socket.socket:
    """A raw WebSocket handshake through /fn that succeeded (101); the socket, to drop without a close frame."""
    parsed = urllib.parse.urlparse(url)
    sock = socket.create_connection((parsed.hostname, parsed.port), timeout=30)
    sock.sendall((f"GET {parsed.path} HTTP/1.1\r\nHost: {parsed.hostname}:{parsed.port}\r\nUpgrade: websocket\r\n"
                  "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                  "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 101 "), head
    return sock


def refused(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """A raw upgrade request: the HTTP status and JSON body of a refusal."""
    parsed = urllib.parse.urlparse(url)
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    request = (f"GET {parsed.path} HTTP/1.1\r\nHost: {parsed.hostname}:{parsed.port}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
               f"Sec-WebSocket-Version: 13\r\n{extra}\r\n").encode()
    with socket.create_connection((parsed.hostname, parsed.port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data or not data.endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


def test_websocket_echo_through_fn(echo: Tenant) -> None:
    answers, code = exchange(ws_url(echo, "wsecho", "/room/1"), ["hello", b"\x00\xffbytes", "whoami"],
                             request_id="ws-echo-1")
    assert answers == ["hello", b"\x00\xffbytes", "/room/1 -"]
    assert code == 1000
    rec = record(echo, "wsecho", "ws-echo-1")
    assert rec["status"] == 101 and rec["error"] is None
    assert rec["request_bytes"] == len("hello") + 7 + len("whoami")
    assert rec["response_bytes"] == len("hello") + 7 + len("/room/1 -")


def test_the_functions_close_code_reaches_the_client(echo: Tenant) -> None:
    answers, code = exchange(ws_url(echo, "wsecho"), ["one", "close"])
    assert answers == ["one"] and code == 4000


def test_plain_http_still_works_beside_the_websocket(echo: Tenant) -> None:
    import requests

    assert requests.get(echo.fn_url("wsecho"), timeout=30).text == "plain HTTP"


def test_function_without_a_websocket_handler_refuses_the_upgrade(tenant: Tenant) -> None:
    tenant.deploy("plain", "python3.11", {"handler.py": PLAIN})
    status, body = refused(ws_url(tenant, "plain"))
    assert status == 400 and body == {"error": "this function does not accept WebSocket connections"}


def test_unknown_function_and_runtime_paths_are_404(tenant: Tenant) -> None:
    tenant.api("POST", "/ensure", expect=(200, 201))
    assert refused(ws_url(tenant, "nothing-here"))[0] == 404
    assert refused(tenant.url.replace("http://", "ws://") + "/fn/x")[0] == 404


def test_websocket_needs_the_token_of_a_token_trigger(echo: Tenant, other_tenant: Tenant) -> None:
    echo.api("PATCH", "/triggers/wsecho", json={"auth": "token"}, expect=200)
    url = ws_url(echo, "wsecho")
    assert refused(url)[0] == 401
    assert refused(url, {"Authorization": f"Bearer {other_tenant.token}"})[0] == 403
    answers, code = exchange(url, ["whoami"], {"Authorization": f"Bearer {echo.token}"})
    assert answers == [f"/ {echo.sub}"] and code == 1000


def test_idle_websocket_is_closed(echo: Tenant) -> None:
    async def run() -> tuple[aiohttp.WSMsgType, int | None, float]:
        async with aiohttp.ClientSession() as session, session.ws_connect(ws_url(echo, "wsecho")) as ws:
            started = time.monotonic()
            reply = await ws.receive(timeout=30)  # nothing sent: the function's 2 s idle timeout closes it
            return reply.type, ws.close_code, time.monotonic() - started

    kind, code, waited = asyncio.run(run())
    assert kind in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED) and code == 1001
    assert 1.5 <= waited < 15


NODE_ECHO = """
exports.handle = async () => 'plain HTTP';
exports.websocket = async (ws, event) => {
  for await (const message of ws) ws.send(typeof message === 'string' ? `${event._path}: ${message}` : message);
};
"""


def test_nodejs_websocket_echo_through_fn(tenant: Tenant) -> None:
    tenant.deploy("nodews", "nodejs20", {"handler.js": NODE_ECHO}, timeout_sec=2)
    answers, code = exchange(ws_url(tenant, "nodews", "/chat"), ["hi", b"\x01\x02"])
    assert answers == ["/chat: hi", b"\x01\x02"] and code == 1000


def test_client_vanishing_ends_the_functions_connection(echo: Tenant) -> None:
    import requests

    before = requests.get(echo.fn_url("wsecho", "/ended"), timeout=30).json()["ended"]
    sock = handshake(ws_url(echo, "wsecho"))
    sock.close()  # no close frame: the TCP connection just goes
    deadline = time.monotonic() + 15
    while requests.get(echo.fn_url("wsecho", "/ended"), timeout=30).json()["ended"] == before:
        assert time.monotonic() < deadline, "the function's websocket handler kept running after its client left"
        time.sleep(0.1)


GO_ECHO = """package function

import "context"

func Handle(ctx context.Context, event map[string]any) (any, error) {
	if headers, _ := event["_headers"].(map[string]any); headers["upgrade"] != "websocket" {
		return "plain HTTP", nil
	}
	return func(ctx context.Context, receive <-chan any, send chan<- any) error {
		for message := range receive {
			if text, ok := message.(string); ok {
				message = "go: " + text
			}
			select {
			case send <- message:
			case <-ctx.Done():
				return nil
			}
		}
		return nil
	}, nil
}
"""


def test_go_websocket_session_through_fn(tenant: Tenant) -> None:
    tenant.deploy("gows", "go1.23", {"handler.go": GO_ECHO}, timeout_sec=2, wait=600)
    answers, code = exchange(ws_url(tenant, "gows"), ["hi", b"\x01\x02"])
    assert answers == ["go: hi", b"\x01\x02"] and code == 1000
