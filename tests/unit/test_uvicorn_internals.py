"""The uvicorn internals `sless_api.gateway.uvicornglue` relies on, checked on the installed uvicorn.

The glue reaches past uvicorn's public API (a subclass of its httptools protocol, its request cycle's state,
its status line table), which a minor release may change without notice. Each test here pins one internal:
its existence, its shape (methods and their parameters, attributes and their types) and, where the shape says
too little, what it does, on one request run in memory (a fake transport: no socket, no server). A uvicorn
that fails here needs `uvicornglue` read against it before the pin in pyproject.toml may move.
"""

from __future__ import annotations

import asyncio
import inspect
import tomllib
from collections import deque
from collections.abc import Callable, Iterator, MutableMapping
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from uvicorn.config import Config
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from sless_api.gateway import uvicornglue
from sless_api.gateway.limits import ServerLimits
from sless_api.gateway.slowclients import guarded_protocol

ROOT = Path(__file__).resolve().parents[2]

# What HookedProtocol overrides and calls super() for (or, for on_response_complete, rewrites), with the
# parameters uvicorn's own take: a changed signature means uvicorn's callback changed under the override.
OVERRIDDEN = {
    "connection_made": ["self", "transport"],
    "connection_lost": ["self", "exc"],
    "data_received": ["self", "data"],
    "on_message_begin": ["self"],
    "on_url": ["self", "url"],
    "on_header": ["self", "name", "value"],
    "on_headers_complete": ["self"],
    "on_body": ["self", "body"],
    "on_message_complete": ["self"],
    "on_response_complete": ["self"],
}
# What the rewritten on_response_complete calls of uvicorn's.
CALLED = {
    "_unset_keepalive_if_required": ["self"],
    "_start_asgi_task": ["self", "cycle", "app"],
}


def _params(func: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(func).parameters)


# In memory: a protocol on a fake transport, one request through it


class FakeTransport(asyncio.Transport):
    """What uvicorn's protocol calls on a transport, recording the writes."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.app_errors: list[BaseException] = []  # what the app under test raised (uvicorn would only log it)
        self.closed = False
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class Recorder:
    """A stand-in for a cycle's transport (what `set_cycle_transport` puts there), recording what goes through."""

    def __init__(self, transport: FakeTransport) -> None:
        self.transport = transport
        self.calls: list[str] = []

    def write(self, data: bytes) -> None:
        self.calls.append("write")
        self.transport.write(data)

    def close(self) -> None:
        self.calls.append("close")
        self.transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    pending = asyncio.all_tasks(loop)  # the app tasks of requests a test only parsed: never to run
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()


async def _no_app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("not called")  # the protocol's app, for the tests that run their own


def _protocol(loop: asyncio.AbstractEventLoop, cls: type[HttpToolsProtocol] = HttpToolsProtocol,
              app: Any = _no_app) -> tuple[HttpToolsProtocol, FakeTransport]:
    transport = FakeTransport()

    async def checked(scope: Any, receive: Any, send: Any) -> None:
        try:
            await app(scope, receive, send)
        except BaseException as exc:  # the test's assertions inside the app, among others
            transport.app_errors.append(exc)
            raise

    config = Config(app=checked, log_config=None, proxy_headers=False, timeout_keep_alive=7)
    proto = cls(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    proto.connection_made(transport)
    return proto, transport


def _run(loop: asyncio.AbstractEventLoop, proto: HttpToolsProtocol, transport: FakeTransport, request: bytes) -> None:
    """Feed REQUEST and let the app's task run to its end (which it must reach without an exception)."""
    proto.data_received(request)
    loop.run_until_complete(asyncio.gather(*proto.tasks))
    assert not transport.app_errors, transport.app_errors


GET = b"GET /x?y=1 HTTP/1.1\r\nhost: a\r\n\r\n"


# The pin


def test_pinned_range_is_the_glues_and_holds_the_installed_uvicorn() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = [Requirement(d) for d in dependencies if Requirement(d).name == "uvicorn"]
    assert len(pins) == 1
    assert pins[0].specifier == SpecifierSet(uvicornglue.UVICORN_RANGE)
    assert version("uvicorn") in SpecifierSet(uvicornglue.UVICORN_RANGE)


# HttpToolsProtocol, subclassed


def test_protocol_class_and_its_constructor() -> None:
    assert issubclass(HttpToolsProtocol, asyncio.Protocol)
    assert issubclass(uvicornglue.HookedProtocol, HttpToolsProtocol)
    assert _params(HttpToolsProtocol.__init__) == ["self", "config", "server_state", "app_state", "_loop"]


@pytest.mark.parametrize("name", sorted(OVERRIDDEN))
def test_protocol_callbacks_the_glue_overrides(name: str) -> None:
    uvicorns = getattr(HttpToolsProtocol, name)
    assert callable(uvicorns)
    assert _params(uvicorns) == OVERRIDDEN[name]
    assert name in vars(uvicornglue.HookedProtocol)  # and the glue still overrides it


@pytest.mark.parametrize("name", sorted(CALLED))
def test_protocol_helpers_the_glue_calls(name: str) -> None:
    helper = getattr(HttpToolsProtocol, name)
    assert callable(helper)
    assert _params(helper) == CALLED[name]


def test_on_response_complete_is_uvicorns_but_for_the_keep_alive_timer() -> None:
    """The glue rewrites on_response_complete after uvicorn's; this is the body it was rewritten from."""
    source = inspect.getsource(HttpToolsProtocol.on_response_complete)
    code = [line.strip() for line in source.splitlines()[1:] if line.strip() and not line.strip().startswith("#")]
    assert code == [
        "self.server_state.total_requests += 1",
        "if self.transport.is_closing():",
        "return",
        "self._unset_keepalive_if_required()",
        "self.flow.resume_reading()",
        "if self.pipeline:",
        "cycle, app = self.pipeline.pop()",
        "self._start_asgi_task(cycle, app)",
        "else:",
        "self.timeout_keep_alive_task = self.loop.call_later(",
        "self.timeout_keep_alive, self.timeout_keep_alive_handler",
        ")",
    ]


def test_protocol_state(loop: asyncio.AbstractEventLoop) -> None:
    """server_state, connections, transport, loop, timeout_keep_alive, flow, pipeline, cycle: as the glue reads them."""
    proto, transport = _protocol(loop)
    state = proto.server_state
    assert isinstance(state, ServerState)
    assert isinstance(state.total_requests, int)
    state.sless_probe = object()  # type: ignore[attr-defined]  # open to attributes of ours (per_server)
    assert proto.connections is state.connections
    assert proto in proto.connections  # counted by connection_made
    assert proto.transport is transport
    assert proto.loop is loop
    assert proto.timeout_keep_alive == 7
    assert isinstance(proto.flow, FlowControl)
    assert proto.flow.read_paused is False
    assert isinstance(proto.pipeline, deque)
    assert proto.cycle is None
    proto.connection_lost(None)
    assert proto not in state.connections


def test_flow_control() -> None:
    """Read side (the glue's reading_paused, on_response_complete) and write side (write_blocked, drain)."""
    assert _params(FlowControl.resume_reading) == ["self"]
    assert inspect.iscoroutinefunction(FlowControl.drain)
    assert _params(FlowControl.drain) == ["self"]
    flow = FlowControl(FakeTransport())
    assert flow.read_paused is False
    assert flow.write_paused is False


def test_a_request_makes_url_scope_and_a_fresh_cycle(loop: asyncio.AbstractEventLoop) -> None:
    """What HookedProtocol.on_headers_complete and request_target read once uvicorn has taken a head."""
    proto, transport = _protocol(loop)
    proto.data_received(GET)
    assert proto.url == b"/x?y=1"
    assert isinstance(proto.scope, dict)
    assert proto.scope["path"] == "/x"
    cycle = proto.cycle
    assert isinstance(cycle, RequestResponseCycle)
    assert cycle.scope is proto.scope
    assert cycle.transport is transport
    assert cycle.on_response == proto.on_response_complete


def test_server_state_is_one_per_server_for_per_server(loop: asyncio.AbstractEventLoop) -> None:
    config = Config(app=_no_app, log_config=None)
    state = ServerState()
    one = uvicornglue.HookedProtocol(config=config, server_state=state, app_state={}, _loop=loop)
    other = uvicornglue.HookedProtocol(config=config, server_state=state, app_state={}, _loop=loop)
    assert one.per_server("sless_probe", object) is other.per_server("sless_probe", object)


def test_our_names_shadow_nothing_of_uvicorns(loop: asyncio.AbstractEventLoop) -> None:
    """The glue's class and the guard's add methods and attributes to uvicorn's protocol: none of them may be a
    name uvicorn uses itself (it would silently be ours), but for the callbacks the glue overrides on purpose."""
    proto, _ = _protocol(loop)
    proto.data_received(GET)
    uvicorns = set(dir(HttpToolsProtocol)) | set(vars(proto))
    guarded_cls = guarded_protocol(ServerLimits(header_timeout_sec=5.0, max_connections=10, max_header_bytes=8192,
                                                keep_alive_sec=5))
    guarded, _ = _protocol(loop, guarded_cls)
    ours = set(vars(uvicornglue.HookedProtocol)) | set(vars(guarded_cls.__mro__[1])) | set(vars(guarded_cls))
    ours |= set(vars(guarded)) - set(vars(proto))
    ours -= set(dir(object)) | {"__dict__", "__weakref__", "__annotations__", "__module__", "__doc__", "limits"}
    assert ours & uvicorns == set(OVERRIDDEN)
    guarded.connection_lost(None)


class Hooks(uvicornglue.HookedProtocol):
    """HookedProtocol recording its hooks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hooks: list[Any] = []

    def connection_opened(self) -> None:
        self.hooks.append("opened")

    def head_begins(self) -> None:
        self.hooks.append("begins")

    def head_grows(self, size: int) -> bool:
        self.hooks.append(size)
        return True

    def head_completes(self) -> bool:
        self.hooks.append("completes")
        return True

    def head_completed(self, cycle: uvicornglue.RequestCycle | None) -> None:
        self.hooks.append(("completed", cycle is self.cycle))

    def body_arrives(self) -> bool:
        self.hooks.append("body")
        return True

    def message_completes(self) -> bool:
        self.hooks.append("message")
        return True

    def data_parsed(self) -> None:
        self.hooks.append("parsed")

    def between_requests(self, response_complete: bool) -> None:
        self.hooks.append(("between", response_complete))

    def connection_gone(self) -> None:
        self.hooks.append("gone")


def test_uvicorn_calls_the_callbacks_the_hooks_hang_on(loop: asyncio.AbstractEventLoop) -> None:
    """One request with a body through HookedProtocol: every hook in order, and no keep-alive timer of uvicorn's."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["body"] == b"hi"
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    proto, transport = _protocol(loop, Hooks, app)
    assert isinstance(proto, Hooks)
    _run(loop, proto, transport, b"POST /p HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\nhi")
    proto.connection_lost(None)
    assert proto.hooks == ["opened", "begins", 2, 4 + 1 + 4, 4 + len("content-length") + 1, "completes",
                           ("completed", True), "body", "message", "parsed", ("between", True), "gone"]
    assert proto.request_target == b"/p"
    assert proto.keep_alive_timeout == 7.0
    assert proto.timeout_keep_alive_task is None
    assert proto.server_state.total_requests == 1
    assert transport.written[0].startswith(b"HTTP/1.1 204 No Content\r\n")


# RequestResponseCycle


def test_cycle_state(loop: asyncio.AbstractEventLoop) -> None:
    """The cycle's attributes the glue reads and sets, with the types it takes them for."""
    proto, _ = _protocol(loop)
    proto.data_received(GET)
    cycle = proto.cycle
    assert cycle.flow is proto.flow
    assert cycle.default_headers is proto.server_state.default_headers
    for flag, value in [("disconnected", False), ("keep_alive", True), ("response_started", False),
                        ("waiting_for_100_continue", False), ("response_complete", False)]:
        assert getattr(cycle, flag) is value, flag
    assert isinstance(cycle.message_event, asyncio.Event)
    assert isinstance(cycle.scope, MutableMapping)


def test_send_is_the_cycles_bound_method_and_writes_through_its_transport(loop: asyncio.AbstractEventLoop) -> None:
    """request_cycle finds the cycle behind the app's ``send``; set_cycle_transport sees every write and the close
    (head and body as two writes: what slowclients._HeadWithBody joins)."""
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        cycle = uvicornglue.request_cycle(send)
        seen.append(cycle)
        assert cycle is not None
        recorder = Recorder(cycle.transport)
        uvicornglue.set_cycle_transport(cycle, recorder)
        seen.append(recorder)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    proto, transport = _protocol(loop, app=app)
    _run(loop, proto, transport, GET.replace(b"host: a", b"host: a\r\nconnection: close"))
    cycle, recorder = seen
    assert isinstance(cycle, RequestResponseCycle)
    assert cycle is proto.cycle
    assert recorder.calls == ["write", "write", "close"]
    assert b"".join(transport.written).startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.closed
    assert uvicornglue.request_cycle(_no_app) is None


def test_100_continue_goes_through_the_cycles_transport(loop: asyncio.AbstractEventLoop) -> None:
    """``receive`` writes ``100 Continue`` on cycle.transport unless start_response's flag says the head went out."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        cycle = uvicornglue.request_cycle(send)
        assert cycle is not None and cycle.waiting_for_100_continue
        recorder = Recorder(cycle.transport)
        uvicornglue.set_cycle_transport(cycle, recorder)
        await receive()
        assert recorder.calls == ["write"]
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    proto, transport = _protocol(loop, app=app)
    _run(loop, proto, transport, b"POST / HTTP/1.1\r\nhost: a\r\nexpect: 100-continue\r\ncontent-length: 1\r\n\r\nx")
    assert transport.written[0] == b"HTTP/1.1 100 Continue\r\n\r\n"


def test_the_glues_own_response_ends_the_cycle_as_send_does(loop: asyncio.AbstractEventLoop) -> None:
    """start_response, cycle_write, finish_response on a live cycle: the protocol counts the request, takes the
    connection for idle (uvicorn's keep-alive timer armed: the one HookedProtocol leaves out) and ``receive``
    wakes with a disconnect."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        cycle = uvicornglue.request_cycle(send)
        assert cycle is not None
        assert not uvicornglue.write_blocked(cycle)
        await uvicornglue.drain(cycle)
        assert uvicornglue.cycle_keep_alive(cycle) and not uvicornglue.cycle_disconnected(cycle)
        uvicornglue.start_response(cycle)
        assert cycle.response_started and not cycle.waiting_for_100_continue
        uvicornglue.cycle_write(cycle, uvicornglue.status_line(204) + b"\r\n")
        uvicornglue.finish_response(cycle)
        assert uvicornglue.cycle_response_complete(cycle)
        assert await receive() == {"type": "http.disconnect"}

    proto, transport = _protocol(loop, app=app)
    _run(loop, proto, transport, GET)
    assert transport.written == [b"HTTP/1.1 204 No Content\r\n\r\n"]
    assert proto.server_state.total_requests == 1
    assert isinstance(proto.timeout_keep_alive_task, asyncio.TimerHandle)
    assert not transport.closed
    proto.connection_lost(None)


def test_abort_cycle_is_taken_for_a_gone_client(loop: asyncio.AbstractEventLoop,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """After abort_cycle, an app that returns with its response unfinished is no error of uvicorn's log."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        cycle = uvicornglue.request_cycle(send)
        assert cycle is not None
        uvicornglue.abort_cycle(cycle)

    proto, transport = _protocol(loop, app=app)
    with caplog.at_level("ERROR", logger="uvicorn.error"):
        _run(loop, proto, transport, GET)
    assert transport.closed
    assert proto.cycle.disconnected
    assert not caplog.records


def test_status_line_table() -> None:
    assert isinstance(httptools_impl.STATUS_LINE, dict)
    assert set(STATUS_LINE) == set(range(100, 600))
    assert STATUS_LINE[200] == b"HTTP/1.1 200 OK\r\n"
    assert uvicornglue.status_line(299) == b"HTTP/1.1 299 \r\n"
    assert uvicornglue.status_line(700) == b"HTTP/1.1 700 \r\n"
