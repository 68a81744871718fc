"""Ceiling for the Python runtime: the least an asyncio HTTP/1.1 keep-alive server does per request.

Usage: ``python raw_asyncio.py PORT`` (listens on 127.0.0.1, standard library only).

It answers every request with the same short text body, with the headers the sless runtime sends for
a string result (Content-Type, Content-Length, Date), honours keep-alive, ``Connection: close`` and
HTTP/1.0, skips request bodies by Content-Length and answers pipelined requests in one write. It parses
no more than that: it is the cost of Python's event loop plus the socket calls, no framework, no event
object, no handler call.
"""

from __future__ import annotations

import asyncio
import sys
import time
from email.utils import formatdate

BODY = b"ok"


class _Date:
    """The Date header value, formatted at most once a second (as the sless runtime does)."""

    second = 0
    value = b""


def _response(close: bool) -> bytes:
    now = int(time.time())
    if now != _Date.second:
        _Date.second, _Date.value = now, formatdate(now, usegmt=True).encode()
    return b"".join((
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nDate: " % len(BODY),
        _Date.value,
        b"\r\nConnection: close\r\n\r\n" if close else b"\r\n\r\n",
        BODY,
    ))


def _body_length(head: bytes) -> int:
    """Content-Length of a lower-cased request head (0 without one)."""
    at = head.find(b"\r\ncontent-length:")
    if at < 0:
        return 0
    stop = head.find(b"\r\n", at + 2)
    return int(head[at + 17: stop if stop >= 0 else len(head)])


def _wants_close(head: bytes) -> bool:
    if head.split(b"\r\n", 1)[0].endswith(b"/1.0"):
        return b"\r\nconnection: keep-alive" not in head
    return b"\r\nconnection: close" in head


class HttpProtocol(asyncio.Protocol):
    """One connection: buffer bytes, answer each complete request head."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.skip = 0  # request body bytes still to discard

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        if self.skip:
            dropped = min(self.skip, len(buf))
            self.skip -= dropped
            buf = buf[dropped:]
        out: list[bytes] = []
        close = False
        while not self.skip:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end].lower()
            length = _body_length(head)
            close = _wants_close(head)
            out.append(_response(close))
            buf = buf[end + 4:]
            dropped = min(length, len(buf))
            buf, self.skip = buf[dropped:], length - dropped
            if close:
                break
        self.buf = buf
        if out and self.transport is not None:
            self.transport.write(b"".join(out))
            if close:
                self.transport.close()


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(HttpProtocol, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
