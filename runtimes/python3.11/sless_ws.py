"""WebSocket connections of the Python runtime (runtimes/README.md, "WebSocket").

A function accepts WebSocket connections by exporting ``websocket(ws, event)`` next to its handler (in the
entrypoint's module). Without it, an upgrade request is refused with 400 ``WebSocketNotAccepted``: deny by
default. The function runs in the connection's thread for as long as the connection lasts::

    def websocket(ws, event):
        for message in ws:      # str (text frame) or bytes (binary frame); ends when the client closes
            ws.send(message)

RFC 6455, server side, standard library only: the handshake, masked client frames, fragmented messages,
ping/pong and the closing handshake. Messages above SLESS_MAX_BODY_BYTES close the connection (1009); a
connection without any message from the client for SLESS_TIMEOUT_SEC is closed (1001, an idle timeout).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import socket
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import sless_runtime as rt

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_CONT, _TEXT, _BINARY, _CLOSE, _PING, _PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA

WsHandler = Callable[["WebSocket", dict[str, Any]], Any]


def handler_of(handler: Callable[..., Any]) -> WsHandler | None:
    """The function's ``websocket`` export, from the module of its HTTP handler; None when it has none."""
    module = sys.modules.get(getattr(handler, "__module__", "") or "")
    found = getattr(module, "websocket", None) if module is not None else None
    return found if callable(found) else None


def is_upgrade(headers: dict[str, str]) -> bool:
    """The request asks for a WebSocket (``Upgrade: websocket``)."""
    return headers.get("upgrade", "").strip().lower() == "websocket"


class Closed(Exception):
    """The connection is closed (by the client, the timeout, or an error)."""


class WebSocket:
    """One accepted connection, as the function's ``websocket(ws, event)`` sees it."""

    def __init__(self, sock: socket.socket, pending: bytes, max_bytes: int, idle_sec: float) -> None:
        self._sock = sock
        self._buf = bytearray(pending)
        self._max = max_bytes
        self._idle = idle_sec
        self._send_lock = threading.Lock()
        self.closed = False
        #: the close code the client sent (or the one the runtime closed with)
        self.close_code: int | None = None

    # ------------------------------------------------------------------ the function's API

    def receive(self) -> str | bytes | None:
        """The next message: ``str`` for a text frame, ``bytes`` for a binary one; None once closed."""
        try:
            return self._next_message()
        except Closed:
            return None

    def send(self, message: str | bytes) -> None:
        """Send one message (a ``str`` as a text frame, bytes as a binary one); raises Closed once closed."""
        if self.closed:
            raise Closed("the WebSocket is closed")
        if isinstance(message, str):
            self._frame(_TEXT, message.encode("utf-8", "surrogatepass"))
        elif isinstance(message, (bytes, bytearray, memoryview)):
            self._frame(_BINARY, bytes(message))
        else:
            raise TypeError(f"a WebSocket message is str or bytes, not {type(message).__name__}")

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Start the closing handshake (idempotent)."""
        if not self.closed:
            self.closed = True
            self.close_code = code
            with contextlib.suppress(OSError):  # the client may be gone already
                self._frame(_CLOSE, struct.pack("!H", code) + reason.encode()[:123])

    def __iter__(self) -> Iterator[str | bytes]:
        while (message := self.receive()) is not None:
            yield message

    # ------------------------------------------------------------------ frames

    def _frame(self, opcode: int, payload: bytes) -> None:
        size = len(payload)
        if size < 126:
            head = struct.pack("!BB", 0x80 | opcode, size)
        elif size < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 126, size)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 127, size)
        with self._send_lock:
            self._sock.sendall(head + payload)

    def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                self._fail(1001, "idle timeout")
            except OSError:
                data = b""
            if not data:
                self.closed = True
                raise Closed("the client went away")
            self._buf += data
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def _fail(self, code: int, reason: str) -> None:
        self.close(code, reason)
        raise Closed(reason)

    def _next_message(self) -> str | bytes:
        if self.closed:
            raise Closed("the WebSocket is closed")
        self._sock.settimeout(self._idle)
        parts: list[bytes] = []
        size = 0
        kind = None
        while True:
            b0, b1 = self._read(2)
            fin, opcode, masked, length = b0 & 0x80, b0 & 0x0F, b1 & 0x80, b1 & 0x7F
            if b0 & 0x70 or not masked:
                self._fail(1002, "protocol error")  # reserved bits, or an unmasked client frame
            if length == 126:
                length = struct.unpack("!H", self._read(2))[0]
            elif length == 127:
                length = struct.unpack("!Q", self._read(8))[0]
            if opcode >= _CLOSE and (length > 125 or not fin):
                self._fail(1002, "protocol error")
            if size + length > self._max:
                self._fail(1009, "message too big")
            mask = self._read(4)
            payload = _unmask(self._read(length), mask) if length else b""
            if opcode == _PING:
                self._frame(_PONG, payload)
                continue
            if opcode == _PONG:
                continue
            if opcode == _CLOSE:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                self.close(1000 if code == 1005 else code)
                self.close_code = code
                raise Closed("the client closed the connection")
            if opcode == _CONT:
                if kind is None:
                    self._fail(1002, "protocol error")
            elif opcode in (_TEXT, _BINARY):
                if kind is not None:
                    self._fail(1002, "protocol error")
                kind = opcode
            else:
                self._fail(1002, "protocol error")
            parts.append(payload)
            size += length
            if fin:
                data = b"".join(parts)
                if kind == _BINARY:
                    return data
                try:
                    return data.decode("utf-8")
                except UnicodeDecodeError:
                    self._fail(1007, "invalid UTF-8")


def _unmask(data: bytes, mask: bytes) -> bytes:
    """XOR with the repeated 4-byte mask, as one big integer (fast without numpy)."""
    n = len(data)
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


def serve(sock: socket.socket, pending: bytes, handler: Callable[..., Any], headers: dict[str, str],
          event: dict[str, Any], config: rt.Config, refuse: Callable[[rt.Response], bytes]) -> None:
    """Answer an upgrade request on ``sock`` and run the function's ``websocket`` until the connection ends.

    ``refuse`` serializes a complete error answer (the connection closes after it).
    """
    ws_handler = handler_of(handler)
    key = headers.get("sec-websocket-key", "").strip()
    if ws_handler is None:
        sock.sendall(refuse(rt.error_response(
            400, "this function does not accept WebSocket connections (it exports no websocket handler)",
            "WebSocketNotAccepted")))
        return
    if headers.get("sec-websocket-version", "").strip() != "13" or len(key) != 24:
        sock.sendall(refuse(rt.error_response(400, "not a WebSocket version 13 handshake", "BadRequest")))
        return
    accept = base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()  # noqa: S324 -- RFC 6455
    sock.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Accept: {accept}\r\n\r\n").encode())
    ws = WebSocket(sock, pending, config.max_body_bytes, config.timeout_sec)
    try:
        outcome = ws_handler(ws, event)
        if hasattr(type(outcome), "__await__"):  # an ``async def websocket``: never run, say so
            getattr(outcome, "close", lambda: None)()
            raise TypeError("the websocket handler must be a plain def (async def is not supported)")
    except Closed:
        pass
    except BaseException as exc:  # a failing function ends its connection, never the server
        rt.log_exception(f"websocket handler failed ({event['_path']})", exc)
        ws.close(1011, "the function failed")
        return
    ws.close(1000)
