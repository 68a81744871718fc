"""Slow and idle clients cannot exhaust the server: a deadline for request heads and a connection cap.

uvicorn (0.54) closes an idle connection only between two requests (``timeout_keep_alive``), and has no
deadline for the head of a request: a client that sends ``GET / HTTP/1.1\\r\\n`` and nothing more, or
nothing at all, keeps its socket open for ever, and a few thousand of them exhaust the process's file
descriptors. Its ``limit_concurrency`` does not help either: it is checked only once a head is complete
(a slow client never gets there), and then answers 503 to everyone, legitimate clients included.

``guarded_protocol`` returns a subclass of uvicorn's httptools protocol (the one uvicorn picks itself,
``httptools`` being a dependency) that adds, per server process:

- a head deadline: from the moment a connection opens, or a new request's first byte arrives, its
  request line and headers must be complete within ``header_timeout_sec``, else 408 and close (just
  close, when not a byte of a request came);
- a head size cap: request line plus headers above ``max_header_bytes`` answer 431 and close (the
  httptools parser itself buffers them without bound);
- a body stall deadline: once a head is complete, the body must keep coming: a gap longer than
  ``header_timeout_sec`` between two of its chunks closes the connection (a slow upload that makes
  progress is fine; one that stops is not held for ever);
- a keep-alive limit: a connection idle between requests for ``timeout_keep_alive`` (``SLESS_KEEPALIVE_SEC``) is
  closed, as uvicorn does, but by the same per-connection timer as the head deadline rather than uvicorn's own,
  which it arms and cancels for every request;
- a connection cap: a connection beyond ``max_connections`` first evicts the connection that has
  been waiting longest for a request head (idle, slow or keep-alive: none of them is being served),
  and is refused with 503 only when every connection is busy with a request. A flood of slow clients
  therefore cannot lock out a fast one; it only pushes out the oldest of its own connections.

This is a transport-level guard, independent of the ASGI app: it works the same under ``sless up``
and under each ``sless-api`` (gunicorn) worker.

The same protocol also sends a response's head and the first part of its body in one write: uvicorn
writes the head on ``http.response.start`` and the body on ``http.response.body``, two system calls and
two wake-ups of the client for every small answer. The head is held until the body's first write, the
connection's close or the event loop's next turn, whichever is first. (Not on ``/fn``: the invoke proxy joins
head and body itself, ``replies.CycleReply``.)

What this takes of uvicorn beyond its public API (the protocol class, its callbacks and state, the request cycle's
transport) is reached through ``uvicornglue``, where uvicorn's internals are kept and checked.
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

from sless_api.gateway.limits import ServerLimits
from sless_api.gateway.uvicornglue import HookedProtocol, RequestCycle, abort_cycle, cycle_scope, set_cycle_transport

#: ASGI scope extension (``scope["extensions"]``): a callable that closes the connection under a response that
#: cannot be completed, such as a stream whose function broke off. What was sent goes out, the final chunk never
#: does, so the client sees a cut response; uvicorn then takes the request for a disconnected one instead of
#: logging "ASGI callable returned without completing response" as an error of the application.
ABORT_EXTENSION = "sless.abort"

_REASONS = {408: "Request Timeout", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}


def _response(status: int, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("ascii") + body


class _Waiting:
    """Per server: the connections waiting for a request head, oldest first (dicts keep insertion order)."""

    def __init__(self) -> None:
        self.since: dict[GuardedProtocol, None] = {}

    def add(self, proto: GuardedProtocol) -> None:
        self.since.pop(proto, None)
        self.since[proto] = None

    def discard(self, proto: GuardedProtocol) -> None:
        self.since.pop(proto, None)

    def oldest_other_than(self, proto: GuardedProtocol) -> GuardedProtocol | None:
        for other in self.since:
            if other is not proto:
                return other
        return None


class _HeadWithBody:
    """A request cycle's view of the connection: its first write (the response head, or ``100 Continue``)
    waits for the next one, the close, or the loop's next turn, so head and a small body leave together.

    Everything but ``write``/``close`` is the transport's own.
    """

    __slots__ = ("_held", "_loop", "_transport", "_used")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._used = False

    def write(self, data: bytes) -> None:
        if self._held is not None:
            data, self._held = self._held + data, None
        elif not self._used:
            self._used = True
            self._held = data
            self._loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        if self._held is not None:
            data, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


# A connection's phases, for its deadline (GuardedProtocol._enter): open without a byte of a request, inside a
# request head, serving a request, idle between requests (keep-alive).
_FRESH, _HEAD, _BUSY, _IDLE = range(4)


class GuardedProtocol(HookedProtocol):
    """uvicorn's httptools protocol with a head deadline, a head size cap and a connection cap.

    It acts in ``HookedProtocol``'s hooks, around uvicorn's own callbacks.
    """

    limits: ServerLimits  # set on the subclass ``guarded_protocol`` makes

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting: _Waiting = self.per_server("sless_waiting", _Waiting)
        self._timer: asyncio.TimerHandle | None = None  # the connection's one deadline timer: see _enter
        self._due = 0.0  # when it fires (loop time)
        self._phase = _FRESH
        self._since = 0.0  # when the connection entered its phase (loop time)
        self._body_timer: asyncio.TimerHandle | None = None
        self._awaiting_body = False
        self._head_bytes = 0
        self._head_started = False
        self._rejected = False

    # Connection life
    def connection_opened(self) -> None:
        if self.open_connections() > self.limits.max_connections:
            victim = self._waiting.oldest_other_than(self)
            if victim is None:
                self._reject(503, "the server is at its connection limit; retry later")
                return
            victim._close()
        self._await_head()

    def connection_gone(self) -> None:
        self._stop_timer()
        self._stop_body_timer()
        self._waiting.discard(self)

    # Request heads
    def accepts_data(self) -> bool:
        return not self._rejected

    def data_parsed(self) -> None:
        if self._rejected and not self.connection_transport.is_closing():
            self._reject(431, f"the request line and headers exceed {self.limits.max_header_bytes} bytes")
        elif self._awaiting_body and self._body_timer is None:
            # A head complete, its body not: from now on the body must keep coming. Armed here rather than
            # with the head, since most requests (no body) complete in the same data_received: no timer at all.
            self._arm_body_timer()

    def head_begins(self) -> None:
        self._head_bytes = 0
        self._head_started = True
        self._enter(_HEAD)

    def head_grows(self, size: int) -> bool:
        """Add to the head's size; False (and the connection marked for 431) once it is over the cap."""
        if self._rejected:
            return False
        self._head_bytes += size
        if self._head_bytes > self.limits.max_header_bytes:
            self._rejected = True
            return False
        return True

    def head_completes(self) -> bool:
        if self._rejected:
            return False  # the app never sees a head that was cut short
        self._enter(_BUSY)
        self._head_started = False
        self._waiting.discard(self)
        return True

    def head_completed(self, cycle: RequestCycle | None) -> None:
        if cycle is not None and not self.request_target.startswith(b"/fn/"):
            # (not on /fn: the invoke proxy writes head and body at once itself)
            set_cycle_transport(cycle, _HeadWithBody(self.connection_transport, self.event_loop))
            extensions: dict[str, Any] = cycle_scope(cycle).setdefault("extensions", {})
            extensions[ABORT_EXTENSION] = functools.partial(abort_cycle, cycle)
        self._awaiting_body = True  # on_message_complete follows at once for a request without a body

    def body_arrives(self) -> bool:
        if self._rejected:
            return False
        self._arm_body_timer()
        return True

    def message_completes(self) -> bool:
        self._awaiting_body = False
        self._stop_body_timer()
        return not self._rejected

    def between_requests(self, response_complete: bool) -> None:
        # In place of uvicorn's keep-alive timer (armed and cancelled again for every request): the connection's
        # one timer closes an idle connection after ``timeout_keep_alive``.
        if not self._head_started:  # (a next head begun already keeps its own deadline)
            self._enter(_IDLE)
        if response_complete:
            self._waiting.add(self)  # idle again: evictable until the next head is complete

    # Helpers
    def _await_head(self) -> None:
        self._waiting.add(self)
        self._enter(_FRESH)

    def _enter(self, phase: int) -> None:
        """The connection is now in PHASE (since now), and its deadline follows from it.

        One timer per connection, not one made and cancelled per request (two per request were a measurable
        part of a proxied call): it is moved only to fire earlier; when it fires it finds the phase the
        connection is in by then, and acts, or waits on for what is left of that phase's limit.
        """
        now = self.event_loop.time()
        self._phase, self._since = phase, now
        if phase == _BUSY:
            return  # serving: nothing is late (a stalled body has its own timer)
        due = now + self._limit(phase)
        if self._timer is not None:
            if self._due <= due:
                return
            self._timer.cancel()
        self._due = due
        self._timer = self.event_loop.call_at(due, self._deadline)

    def _limit(self, phase: int) -> float:
        return self.keep_alive_timeout if phase == _IDLE else self.limits.header_timeout_sec

    def _deadline(self) -> None:
        self._timer = None
        phase = self._phase
        if phase == _BUSY or self._rejected or self.connection_transport.is_closing():
            return
        left = self._since + self._limit(phase) - self.event_loop.time()
        if left > 0:
            self._due = self.event_loop.time() + left
            self._timer = self.event_loop.call_at(self._due, self._deadline)
        elif phase == _IDLE:
            self._close()  # uvicorn's keep-alive timeout
        else:
            self._head_timed_out()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm_body_timer(self) -> None:
        self._stop_body_timer()
        self._body_timer = self.event_loop.call_later(self.limits.header_timeout_sec, self._body_stalled)

    def _stop_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_stalled(self) -> None:
        self._body_timer = None
        if self.reading_paused:
            # We stopped reading (the app has not taken the body so far, or a pipelined request
            # waits): the stall is ours, not the client's.
            self._arm_body_timer()
            return
        # The app may have begun its answer already: no response of ours, just the close it will see.
        self._close()

    def _head_timed_out(self) -> None:
        if not self._head_started:
            # Not a byte of a request yet (a client's pre-opened connection): close like an idle
            # keep-alive connection, since a 408 would be read as the answer to its next request.
            self._close()
        elif not self.connection_transport.is_closing():
            self._reject(408, f"the request head did not arrive within {self.limits.header_timeout_sec:g} s")

    def _reject(self, status: int, message: str) -> None:
        self._rejected = True
        self._stop_timer()
        self._stop_body_timer()
        self._waiting.discard(self)
        transport = self.connection_transport
        if not transport.is_closing():
            transport.write(_response(status, message))
            transport.close()

    def _close(self) -> None:
        self._rejected = True
        self._stop_timer()
        self._stop_body_timer()
        self._waiting.discard(self)
        transport = self.connection_transport
        if not transport.is_closing():
            transport.close()


def guarded_protocol(limits: ServerLimits) -> type[GuardedProtocol]:
    """A protocol class for uvicorn's ``http=`` option, bound to these limits."""
    return type("SlessGuardedProtocol", (GuardedProtocol,), {"limits": limits})
