"""uvicorn's private internals, in one place: the only module of sless that reaches past uvicorn's public API.

Why it exists: two parts of the gateway need more of uvicorn than ``uvicorn.run``/``Config`` and the ASGI interface.

- The slow-client guard (``slowclients.GuardedProtocol``) adds a head deadline, a head size cap, a body stall
  deadline and a connection cap to uvicorn's httptools protocol, which has no hook for any of them: it has to
  subclass the protocol, step in around its parser callbacks and replace its keep-alive timer.
- The invoke proxy's writer (``replies.CycleReply``) writes an answer straight onto the connection of uvicorn's
  request cycle, and so has to do the cycle's own bookkeeping (flow control, keep-alive, the next pipelined
  request) as the cycle's ``send`` would.

None of that is uvicorn's public API: a minor release may rename, reshape or drop any of it without notice. So
it all sits here, one class or function per internal, written and checked against uvicorn 0.54
(``UVICORN_RANGE``, the range pyproject.toml pins uvicorn to), and ``tests/unit/test_uvicorn_internals.py`` checks
each internal on the installed uvicorn: a uvicorn that changes them fails that test, not the guard or the proxy
in production. To move to a newer uvicorn: read its ``protocols/http/httptools_impl.py`` against this module,
then widen the pin and ``UVICORN_RANGE`` together.

What is touched, all of ``uvicorn.protocols.http.httptools_impl`` unless said otherwise:

- ``HttpToolsProtocol``, subclassed by ``HookedProtocol``: its constructor, its asyncio callbacks
  (``connection_made``, ``connection_lost``, ``data_received``), the parser callbacks it hands httptools
  (``on_message_begin``, ``on_url``, ``on_header``, ``on_headers_complete``, ``on_body``,
  ``on_message_complete``), and ``on_response_complete``, rewritten without its keep-alive timer and calling
  its ``_unset_keepalive_if_required``, ``pipeline`` and ``_start_asgi_task``;
- that protocol's attributes: ``server_state`` (``uvicorn.server.ServerState``: one per server, open to
  attributes of ours, with ``total_requests``), ``connections``, ``transport``, ``loop``, ``timeout_keep_alive``,
  ``url``, ``scope``, ``cycle``, ``flow`` (``uvicorn.protocols.http.flow_control.FlowControl``: ``read_paused``,
  ``resume_reading``);
- ``RequestResponseCycle``: the ASGI ``send`` uvicorn hands the app being its bound method (``request_cycle``);
  its ``transport``, through which it writes and closes (``set_cycle_transport``, ``cycle_write``); its
  ``scope`` (``cycle_scope``); its write flow control ``flow.write_paused``/``flow.drain`` (``write_blocked``,
  ``drain``); its ``default_headers`` (``cycle_default_headers``); its state ``disconnected``, ``keep_alive``,
  ``response_started``, ``waiting_for_100_continue``, ``response_complete`` (``cycle_disconnected``,
  ``cycle_keep_alive``, ``start_response``, ``cycle_response_complete``); and the end of a response:
  ``message_event``, ``on_response`` (``finish_response``), or its abort (``abort_cycle``);
- ``STATUS_LINE``, its table of status lines (``status_line``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, MutableMapping
from typing import Any, TypeAlias, TypeVar

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

#: The uvicorn versions this module was written against and checked for (pyproject.toml pins the same range).
UVICORN_RANGE = ">=0.54,<0.55"

#: uvicorn's request cycle (one request and its response on a connection). Outside this module an opaque
#: handle: only the functions below look inside it.
RequestCycle: TypeAlias = RequestResponseCycle

_T = TypeVar("_T")


# The protocol


class HookedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (``HttpToolsProtocol``) with hooks around its callbacks, for a subclass that
    guards each connection (``slowclients.GuardedProtocol``), and read access to the protocol state it needs.

    Each override runs uvicorn's own code between the hooks, unchanged, but for ``on_response_complete``: that
    one is uvicorn's without its keep-alive timer (armed and cancelled again for every request), so the idle
    connection's timeout is the subclass's, in ``between_requests``. The hooks here accept everything and do
    nothing: this class is for subclassing only, as alone it would never close an idle connection.
    """

    # Hooks for the subclass

    def connection_opened(self) -> None:
        """A connection was made (uvicorn has counted it in ``open_connections``)."""

    def connection_gone(self) -> None:
        """The connection is lost (uvicorn has not forgotten it yet)."""

    def accepts_data(self) -> bool:
        """Whether bytes that arrive go to the parser at all (False: dropped unread)."""
        return True

    def data_parsed(self) -> None:
        """The parser took the bytes that arrived (and called the parser hooks below for them)."""

    def head_begins(self) -> None:
        """The first byte of a request arrived."""

    def head_grows(self, size: int) -> bool:
        """SIZE more bytes of request target or headers; False drops them (the head is refused)."""
        return True

    def head_completes(self) -> bool:
        """The head is complete; False hides it from uvicorn (and so from the app)."""
        return True

    def head_completed(self, cycle: RequestCycle | None) -> None:
        """uvicorn has taken the complete head: CYCLE is the request cycle it made for it, None when it made none
        (an upgrade to WebSocket)."""

    def body_arrives(self) -> bool:
        """A part of the request body; False drops it."""
        return True

    def message_completes(self) -> bool:
        """The request (head and body) is complete; False hides its end from uvicorn."""
        return True

    def between_requests(self, response_complete: bool) -> None:
        """A response is complete and no pipelined request waits: the connection is idle, or reading the next
        head. RESPONSE_COMPLETE: whether the connection's current cycle is complete."""

    # Protocol state, read

    def open_connections(self) -> int:
        """The server's open HTTP connections (``connections``, a set shared by its protocols)."""
        return len(self.connections)

    def per_server(self, name: str, make: Callable[[], _T]) -> _T:
        """One NAME per server (per uvicorn ``ServerState``, shared by all its connections), made on first use."""
        state = self.server_state
        value: _T | None = getattr(state, name, None)
        if value is None:
            value = make()
            setattr(state, name, value)
        return value

    @property
    def connection_transport(self) -> asyncio.Transport:
        """The connection's transport (``transport``, set by ``connection_made``)."""
        return self.transport

    @property
    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the protocol runs on (``loop``)."""
        return self.loop

    @property
    def keep_alive_timeout(self) -> float:
        """How long an idle connection may wait for its next request (``timeout_keep_alive``, from the config)."""
        return float(self.timeout_keep_alive)

    @property
    def request_target(self) -> bytes:
        """The current request's target as it came (``url``, gathered by ``on_url``)."""
        url: bytes = self.url
        return url

    @property
    def reading_paused(self) -> bool:
        """Whether the protocol stopped reading the connection (``flow.read_paused``: the app has not taken the
        body so far, or a pipelined request waits)."""
        return self.flow is not None and self.flow.read_paused

    # uvicorn's callbacks, with the hooks around them

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.connection_opened()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connection_gone()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.accepts_data():
            return
        super().data_received(data)
        self.data_parsed()

    def on_message_begin(self) -> None:
        self.head_begins()
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        if self.head_grows(len(url)):
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_grows(len(name) + len(value) + 4):
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if not self.head_completes():
            return
        super().on_headers_complete()
        cycle: RequestCycle | None = self.cycle
        # A cycle made for this head has its scope, and the connection's transport as it came; without one
        # (an upgrade) ``cycle`` is still the previous request's.
        if cycle is not None and (cycle.transport is not self.transport or cycle.scope is not self.scope):
            cycle = None
        self.head_completed(cycle)

    def on_body(self, body: bytes) -> None:
        if self.body_arrives():
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self.message_completes():
            super().on_message_complete()

    def on_response_complete(self) -> None:
        # uvicorn's own, but for its keep-alive timer: between_requests instead.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self.between_requests(self.cycle is not None and self.cycle.response_complete)


# The request cycle


def request_cycle(send: Callable[..., Any]) -> RequestCycle | None:
    """The uvicorn request cycle whose ASGI ``send`` SEND is (a bound method of the cycle), or None for another
    ASGI server's (or another uvicorn protocol's)."""
    cycle = getattr(send, "__self__", None)
    return cycle if isinstance(cycle, RequestResponseCycle) else None


def set_cycle_transport(cycle: RequestCycle, transport: object) -> None:
    """Put TRANSPORT (anything with the transport methods the cycle calls) between CYCLE and its connection: the
    cycle writes its response head (or ``100 Continue``), its body and its close through ``cycle.transport``."""
    cycle.transport = transport  # type: ignore[assignment]


def cycle_scope(cycle: RequestCycle) -> MutableMapping[str, Any]:
    """CYCLE's ASGI scope, the very mapping the app is called with."""
    scope: MutableMapping[str, Any] = cycle.scope  # type: ignore[assignment]
    return scope


def cycle_write(cycle: RequestCycle, data: bytes) -> None:
    """Write DATA on CYCLE's connection, as its ``send`` does."""
    cycle.transport.write(data)


def write_blocked(cycle: RequestCycle) -> bool:
    """Whether a write on CYCLE must wait for ``drain`` first (the transport's buffer is full, and the client
    still there), as its ``send`` waits."""
    return cycle.flow.write_paused and not cycle.disconnected


def drain(cycle: RequestCycle) -> Coroutine[Any, Any, None]:
    """Wait until CYCLE's connection takes writes again (uvicorn's write flow control)."""
    return cycle.flow.drain()


def cycle_default_headers(cycle: RequestCycle) -> list[tuple[bytes, bytes]]:
    """The headers uvicorn puts first on every response of the server (``server``, ``date``, per its config)."""
    return cycle.default_headers


def cycle_disconnected(cycle: RequestCycle) -> bool:
    """Whether CYCLE's client went away (or the response was aborted): nothing more is written."""
    return cycle.disconnected


def cycle_keep_alive(cycle: RequestCycle) -> bool:
    """Whether CYCLE's connection stays open after its response (HTTP/1.1 without ``connection: close``, and no
    shutdown under way)."""
    return cycle.keep_alive


def cycle_response_complete(cycle: RequestCycle) -> bool:
    """Whether CYCLE's response was written to its end."""
    return cycle.response_complete


def start_response(cycle: RequestCycle) -> None:
    """Mark CYCLE's response head as written, as its ``send`` does on ``http.response.start`` (no ``100 Continue``
    goes out after it)."""
    cycle.response_started = True
    cycle.waiting_for_100_continue = False


def finish_response(cycle: RequestCycle) -> None:
    """CYCLE's response is written to its end: what its ``send`` does then (wake its ``receive``, close the
    connection unless kept alive, and let the protocol start the next pipelined request or wait for one)."""
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()


def abort_cycle(cycle: RequestCycle) -> None:
    """Close the connection under CYCLE's unfinished response: uvicorn then takes the request for one whose client
    went away, instead of logging "ASGI callable returned without completing response" as the app's error."""
    cycle.disconnected = True
    cycle.transport.close()


# Status lines


def status_line(status: int) -> bytes:
    """The response's first line, from uvicorn's table (100 to 599), else without a reason phrase."""
    return STATUS_LINE.get(status) or b"HTTP/1.1 %d \r\n" % status
