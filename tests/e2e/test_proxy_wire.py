"""`/fn` answers on the wire, read byte by byte from a raw socket: the invoke proxy writes them onto uvicorn's
connection itself (`replies.CycleReply`), so keep-alive, pipelining, HTTP/1.0, HEAD, chunked framing and the
request id are checked here as a client sees them, not through a client library that forgives."""

from __future__ import annotations

import re
import socket
import urllib.parse

import pytest

from tests.support.platform import Tenant

pytestmark = pytest.mark.e2e

FUNCTION = """
def handle(event):
    path = event['_path']
    if path == '/own-id':
        return {'statusCode': 200, 'headers': {'X-Request-Id': 'the-function-s-own'}, 'body': 'own'}
    if path == '/stream':
        def parts():
            yield 'one;'
            yield 'two;'
        return {'statusCode': 200, 'headers': {'Content-Type': 'text/plain'}, 'body': parts()}
    if path == '/nothing':
        return {'statusCode': 204, 'body': ''}
    if path == '/length':
        return 'body of ' + str(len(event.get('body') or ''))
    return 'answer to ' + path
"""


@pytest.fixture
def wired(tenant: Tenant) -> Tenant:
    tenant.deploy("wire", "python3.11", {"handler.py": FUNCTION})
    return tenant


class Wire:
    """One raw connection; answers are parsed strictly, framing included."""

    def __init__(self, url: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.path = parsed.path
        self.sock = socket.create_connection((parsed.hostname, parsed.port), timeout=30)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, method: str, tail: str, version: str = "1.1", extra: str = "") -> bytes:
        return f"{method} {self.path}{tail} HTTP/{version}\r\nHost: x\r\n{extra}\r\n".encode()

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buffer += data
        return bool(data)

    def answer(self, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            assert self._fill(), f"connection closed before a head: {self.buffer!r}"
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        names = [line.split(":", 1)[0].lower() for line in lines]
        assert len(names) == len(set(names)), f"a header twice: {lines}"
        headers = {line.split(":", 1)[0].lower(): line.split(":", 1)[1].strip() for line in lines}
        status = int(status_line.split(" ")[1])
        if head_only or status in (204, 304):
            return status, headers, b""
        if "content-length" in headers:
            assert "transfer-encoding" not in headers
            size = int(headers["content-length"])
            while len(self.buffer) < size:
                assert self._fill(), "connection closed inside a body"
            body, self.buffer = self.buffer[:size], self.buffer[size:]
            return status, headers, body
        assert headers.get("transfer-encoding") == "chunked", headers
        body = b""
        while True:
            while b"\r\n" not in self.buffer:
                assert self._fill(), "connection closed inside a chunked body"
            size_line, rest = self.buffer.split(b"\r\n", 1)
            size = int(size_line, 16)
            while len(rest) < size + 2:
                assert self._fill(), "connection closed inside a chunk"
                rest = self.buffer.split(b"\r\n", 1)[1]
            assert rest[size:size + 2] == b"\r\n"
            self.buffer = rest[size + 2:]
            if size == 0:
                return status, headers, body
            body += rest[:size]

    def closed(self) -> bool:
        """True when the server closed the connection (and sent nothing more)."""
        return not self.buffer and not self._fill()


def test_pipelined_requests_are_answered_in_order_on_one_connection(wired: Tenant) -> None:
    wire = Wire(wired.fn_url("wire"))
    wire.send(b"".join(wire.request("GET", f"/p{i}", extra=f"X-Request-Id: pipelined-{i}\r\n") for i in range(3)))
    for i in range(3):
        status, headers, body = wire.answer()
        assert (status, body) == (200, f"answer to /p{i}".encode())
        assert headers["x-request-id"] == f"pipelined-{i}" and "connection" not in headers
    wire.send(wire.request("GET", "/after"))  # still open for the next one
    assert wire.answer()[2] == b"answer to /after"


def test_http_1_0_gets_connection_close_and_the_close(wired: Tenant) -> None:
    wire = Wire(wired.fn_url("wire"))
    wire.send(wire.request("GET", "/old", version="1.0"))
    status, headers, body = wire.answer()
    assert (status, body, headers["connection"]) == (200, b"answer to /old", "close")
    assert wire.closed()


def test_head_gets_the_length_and_no_body_then_the_connection_goes_on(wired: Tenant) -> None:
    wire = Wire(wired.fn_url("wire"))
    wire.send(wire.request("HEAD", "/sized"))
    status, headers, _ = wire.answer(head_only=True)
    assert status == 200 and headers["content-length"] == str(len(b"answer to /sized"))
    wire.send(wire.request("GET", "/next"))
    assert wire.answer()[2] == b"answer to /next"  # nothing of a HEAD body was in between


def test_a_204_has_no_body_and_no_framing(wired: Tenant) -> None:
    wire = Wire(wired.fn_url("wire"))
    wire.send(wire.request("GET", "/nothing"))
    status, headers, _ = wire.answer()
    assert status == 204 and "transfer-encoding" not in headers
    wire.send(wire.request("GET", "/next"))
    assert wire.answer()[2] == b"answer to /next"


def test_a_stream_is_chunked_and_ends_with_the_last_chunk(wired: Tenant) -> None:
    wire = Wire(wired.fn_url("wire"))
    wire.send(wire.request("GET", "/stream"))
    status, headers, body = wire.answer()
    assert (status, body) == (200, b"one;two;") and headers["content-type"].startswith("text/plain")
    wire.send(wire.request("GET", "/next"))
    assert wire.answer()[2] == b"answer to /next"


def test_a_chunked_request_body_reaches_the_function_whole(wired: Tenant) -> None:
    wire = Wire(wired.fn_url("wire"))
    head = wire.request("POST", "/length", extra="Content-Type: text/plain\r\nTransfer-Encoding: chunked\r\n")
    wire.send(head + b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    assert wire.answer()[2] == b"body of 11"
    wire.send(wire.request("POST", "/length", extra="Content-Length: 3\r\n") + b"abc")
    assert wire.answer()[2] == b"body of 3"


def test_the_caller_gets_the_platforms_request_id_not_the_functions(wired: Tenant) -> None:
    wire = Wire(wired.fn_url("wire"))
    wire.send(wire.request("GET", "/own-id"))
    status, headers, body = wire.answer()
    assert (status, body) == (200, b"own")
    assert re.fullmatch("[0-9a-f]{32}", headers["x-request-id"]), headers


def test_errors_of_the_platform_are_framed_json_with_the_request_id(wired: Tenant) -> None:
    wire = Wire(wired.fn_url("wire").replace("/wire", "/no-such-function"))
    wire.send(wire.request("GET", "/", extra="X-Request-Id: asked-for\r\n"))
    status, headers, body = wire.answer()
    assert status == 404 and headers["content-type"] == "application/json" and b"error" in body
    assert headers["x-request-id"] == "asked-for" and headers["content-length"] == str(len(body))
