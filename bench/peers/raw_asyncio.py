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

from peer_http import body_length, response, wants_close


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
            length = body_length(head)
            close = wants_close(head)
            out.append(response(close))
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
