"""The access log and the request id, as an ASGI wrapper around the app (REST and console; the invoke proxy on
``/fn`` does the same itself, with ``log_access``, to keep its hot path free of a wrapper around every message).

Every answer carries ``X-Request-Id``; one ``sless.access`` line per request records method, path (without
the query string, which may hold tokens), status, bytes sent and duration. The id is visible to every log
line written while the request is served (``logsetup.current_request_id``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from json.encoder import encode_basestring
from typing import Any

from sless_api import metrics
from sless_api.gateway.requestid import HEADER, SCOPE_KEY, accept_or_new
from sless_api.logsetup import current_request_id, json_stream_handler, json_ts

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

access = logging.getLogger("sless.access")
_DIRECT = ('{"ts": "%s", "level": "info", "logger": "sless.access", "msg": %s, "pid": %d, "method": %s, "path": %s, '
           '"status": %d, "bytes": %d, "duration_ms": %r, %s"request_id": %s}')
_quoted = encode_basestring  # json's string escaping with ensure_ascii=False (C when available)
# os.getpid() is a system call each time (glibc keeps no copy); a forked worker learns its own at the fork.
_pid = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))
_HEADER = HEADER.encode()


class AccessLog:
    """Wraps APP: assigns the request id, adds it to the response, logs the request when it ends."""

    def __init__(self, app: App, enabled: bool = True) -> None:
        self.app = app
        self.enabled = enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = accept_or_new(v.decode("latin-1") for k, v in scope["headers"] if k.lower() == _HEADER)
        scope[SCOPE_KEY] = request_id
        token = current_request_id.set(request_id)
        started = time.monotonic()
        status, sent = 0, 0

        async def send_with_id(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != _HEADER]
                headers.append((_HEADER, request_id.encode()))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            metrics.count_request("api", status)  # /fn's requests are the invoke proxy's to count
            if self.enabled:
                client = scope.get("client")
                log_access(scope["method"], scope.get("path", ""), status, sent, started,
                           client[0] if client else None, request_id)
            current_request_id.reset(token)


def log_access(method: str, path: str, status: int, sent: int, started: float, client: str | None,
               request_id: str) -> None:
    """The request's ``sless.access`` line (``AccessLog`` writes it for every request but ``/fn``'s, which the
    invoke proxy writes itself)."""
    if not access.isEnabledFor(logging.INFO):
        return
    duration_ms = round((time.monotonic() - started) * 1000, 3)
    handler = json_stream_handler(access)
    if handler is not None:
        # The line JsonFormatter would make of the record below (json.dumps's separators, field order and float
        # repr), written as StreamHandler.emit would; formatted here, since a dict and an encoder per line were most
        # of the line's cost. Every string that is not the platform's own constant goes through JSON's escaping.
        text = _DIRECT % (json_ts(time.time()), _quoted(f"{method} {path} {status}"), _pid[0], _quoted(method),
                          _quoted(path), status, sent, duration_ms,
                          "" if client is None else f'"client": {_quoted(client)}, ', _quoted(request_id))
        _turn_lines.add(handler, text + handler.terminator)
        return
    fields = {"method": method, "path": path, "status": status, "bytes": sent, "duration_ms": duration_ms,
              "client": client}
    # Logger.info would also walk the stack for the caller's file and line, which no format shows.
    access.handle(access.makeRecord(access.name, logging.INFO, __file__, 0, "%s %s %d", (method, path, status),
                                    None, extra=fields))


class _TurnLines:
    """The access lines of one event-loop turn, written with one ``write`` and one flush when the turn ends.

    Under load a turn finishes several requests; a write and a flush each (a system call apiece, with the GIL
    let go and taken back around it) were a large part of a proxied call's cost. The lines still leave within
    the turn that ended their requests, in order; without a running loop (a test, a thread) a line is written
    at once.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.handler: logging.StreamHandler[Any] | None = None

    def add(self, handler: logging.StreamHandler[Any], text: str) -> None:
        if self.lines and handler is not self.handler:
            self.flush()
        self.handler = handler
        self.lines.append(text)
        if len(self.lines) == 1:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:
                self.flush()

    def flush(self) -> None:
        lines, self.lines = self.lines, []
        handler = self.handler
        if not lines or handler is None:
            return
        handler.acquire()
        try:  # as logging does: a log line that cannot be written never fails the request
            with contextlib.suppress(OSError, ValueError):
                handler.stream.write("".join(lines))
                handler.flush()
        finally:
            handler.release()


_turn_lines = _TurnLines()


def flush_access_lines() -> None:
    """Write the access lines still held for this turn (at shutdown)."""
    _turn_lines.flush()
