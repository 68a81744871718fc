"""How the invoke proxy writes an answer: straight onto uvicorn's connection, or as ASGI messages.

An ASGI answer is two messages at least (``http.response.start``, then ``http.response.body``), and uvicorn's
``send`` checks every header with two regular expressions, lower-cases it and parses the framing headers again
before it joins the head. On ``/fn`` that was about a fifth of a proxied call's cost, for a head the proxy has just
filtered from bytes a strict parser (llhttp) accepted. ``CycleReply`` writes head and body with one ``write`` on
the connection of uvicorn's httptools request cycle and keeps the cycle's own bookkeeping (keep-alive, the next
pipelined request, the write flow control), as its ``send`` would. ``AsgiReply`` is the portable form for any other
ASGI server. (The cycle's internals it relies on are ``uvicornglue``'s, where uvicorn's internals are kept and
checked.)

Both frame the body the same way: with a ``Content-Length`` as given, else chunked (not for ``HEAD``, 204 or 304).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from sless_api.gateway.uvicornglue import (
    RequestCycle,
    abort_cycle,
    cycle_default_headers,
    cycle_disconnected,
    cycle_keep_alive,
    cycle_response_complete,
    cycle_write,
    drain,
    finish_response,
    request_cycle,
    start_response,
    status_line,
    write_blocked,
)

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

# What no header line may hold (uvicorn's send refuses the same): it would end the line and start another.
_UNSAFE_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")
_UNSAFE_NAME = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')


class UnsafeHeader(ValueError):
    """An answer's header would break the head's framing; nothing was written."""


class Reply(Protocol):
    """One answer to one request, written in order: ``start`` once, then ``more`` until ``more=False``."""

    status: int  # 0 until started
    sent: int  # body bytes handed on so far

    async def start(self, status: int, headers: Headers, body: bytes = b"", more: bool = False) -> None:
        """The status, the headers (lower-case names; a ``content-length`` among them sets the framing) and the
        first part of the body; ``more`` says whether parts follow."""

    async def more(self, body: bytes, more: bool) -> None:
        """The next part of the body; ``more=False`` ends the answer."""

    def abort(self) -> None:
        """Close the connection under an answer that cannot be completed: the client sees it cut, never ended."""


def reply_for(send: Send, method: str, abort: Callable[[], None] | None = None) -> Reply:
    """The fastest writer this server allows: ``CycleReply`` under uvicorn's httptools protocol, else ASGI."""
    cycle = request_cycle(send)
    if cycle is not None:
        return CycleReply(cycle, method)
    return AsgiReply(send, abort)


class CycleReply:
    """Writes on the transport of a uvicorn ``RequestResponseCycle``, doing what its ``send`` does around it."""

    __slots__ = ("_chunked", "_cycle", "_head_only", "sent", "status")

    def __init__(self, cycle: RequestCycle, method: str) -> None:
        self._cycle = cycle
        self._head_only = method == "HEAD"
        self._chunked = False
        self.status = 0
        self.sent = 0

    async def start(self, status: int, headers: Headers, body: bytes = b"", more: bool = False) -> None:
        cycle = self._cycle
        if write_blocked(cycle):
            await drain(cycle)
        lines = [status_line(status)]
        framed = False
        for name, value in (*cycle_default_headers(cycle), *headers):
            if name == b"content-length":
                framed = True
            lines += (name, b": ", value, b"\r\n")
        # One search over all names and one over all values (joining them cannot make a character either set
        # refuses); a runtime's head passed llhttp's checks already, so this is a second line of defence.
        if _UNSAFE_NAME.search(b"".join(lines[1::4])) or _UNSAFE_VALUE.search(b"".join(lines[3::4])):
            raise UnsafeHeader("a header of the answer holds a character no header may hold")
        self.status = status
        if cycle_disconnected(cycle):
            return
        start_response(cycle)
        if not cycle_keep_alive(cycle):
            lines.append(b"connection: close\r\n")
        if not framed and not self._head_only and status not in (204, 304):
            self._chunked = True
            lines.append(b"transfer-encoding: chunked\r\n")
        lines.append(b"\r\n")
        lines.append(self._framed(body, more))
        self._write(b"".join(lines), more)

    async def more(self, body: bytes, more: bool) -> None:
        cycle = self._cycle
        if write_blocked(cycle):
            await drain(cycle)
        if cycle_disconnected(cycle) or cycle_response_complete(cycle):
            return
        self._write(self._framed(body, more), more)

    def abort(self) -> None:
        abort_cycle(self._cycle)

    def _framed(self, body: bytes, more: bool) -> bytes:
        if self._head_only:
            return b""
        self.sent += len(body)
        if not self._chunked:
            return body
        if more:
            return b"%x\r\n%b\r\n" % (len(body), body) if body else b""
        return (b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)) if body else b"0\r\n\r\n"

    def _write(self, data: bytes, more: bool) -> None:
        if data:
            cycle_write(self._cycle, data)
        if not more:
            finish_response(self._cycle)


class AsgiReply:
    """The same answer as ASGI messages (any ASGI server)."""

    __slots__ = ("_abort", "_send", "sent", "status")

    def __init__(self, send: Send, abort: Callable[[], None] | None) -> None:
        self._send = send
        self._abort = abort
        self.status = 0
        self.sent = 0

    async def start(self, status: int, headers: Headers, body: bytes = b"", more: bool = False) -> None:
        self.status = status
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self.more(body, more)

    async def more(self, body: bytes, more: bool) -> None:
        self.sent += len(body)
        await self._send({"type": "http.response.body", "body": body, "more_body": more})

    def abort(self) -> None:
        # Where the server offers no way to cut the connection, returning with the answer incomplete does the same.
        if self._abort is not None:
            self._abort()
