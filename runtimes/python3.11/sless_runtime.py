"""What the Python HTTP server and the one-shot runner share.

Configuration from the environment, loading the user's handler, building the
event from a request, mapping a handler result to an HTTP response, and the
JSON error bodies. Keeping these in one module means a function behaves the
same behind HTTP and as a job. Standard library only: this file is copied into
the runtime image next to server.py and runner.py.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from urllib.parse import parse_qsl

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing at start-up

# Start-up time is a function's cold start: typing, dataclasses, traceback and base64 are left
# out of the import path (imported where they are needed, or for type checking only).
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    Handler = Callable[[dict[str, Any]], Any]

TEXT_TYPE = "text/plain; charset=utf-8"
HTML_TYPE = "text/html; charset=utf-8"
JSON_TYPE = "application/json"

#: Response headers the server computes itself; a handler cannot set them.
FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive"})


class LoadError(Exception):
    """The handler named by SLESS_ENTRYPOINT cannot be loaded."""


class InvalidResponse(Exception):
    """A handler result that cannot be turned into a response (bad statusCode, headers, JSON)."""


class Config:
    """The runtime's settings; every field comes from one documented environment variable."""

    __slots__ = ("code_dir", "deps_dir", "drain_listen_sec", "drain_sec", "entrypoint", "handler_threads", "host",
                 "max_abandoned", "max_body_bytes", "max_handler_threads", "port", "timeout_sec")

    def __init__(self, port: int = 8080, host: str = "0.0.0.0", code_dir: str = "/app/function",
                 entrypoint: str = "handler.handle", deps_dir: str | None = None, timeout_sec: float = 30.0,
                 max_body_bytes: int = 6291456, drain_sec: float = 25.0, max_abandoned: int = 8,
                 handler_threads: int = 32, max_handler_threads: int = 1000, drain_listen_sec: float = 0.0) -> None:
        self.port = port
        self.host = host
        self.code_dir = code_dir
        self.entrypoint = entrypoint
        self.deps_dir = deps_dir
        self.timeout_sec = timeout_sec
        self.max_body_bytes = max_body_bytes
        self.drain_sec = drain_sec
        #: how long after SIGTERM new connections are still accepted (and answered without keep-alive): a pod's
        #: address stays in the nodes' Service rules a while after it was told to stop
        self.drain_listen_sec = drain_listen_sec
        self.max_abandoned = max_abandoned
        #: handlers that run at once while they keep finishing (the HTTP server's thread pool).
        self.handler_threads = handler_threads
        #: the pool's ceiling while handlers block (sleep, wait on I/O) for longer than a moment.
        self.max_handler_threads = max(handler_threads, max_handler_threads)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """Read the configuration; raises ValueError naming the variable on a bad value."""
        env = os.environ if env is None else env

        def get(name: str, default: str) -> str:
            value = env.get(name, "").strip()
            return value or default

        def number(name: str, default: str, kind: Callable[[str], Any], minimum: float) -> Any:
            raw = get(name, default)
            try:
                value = kind(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a valid number") from None
            if not value >= minimum:  # written so that NaN is rejected too
                raise ValueError(f"{name}={raw!r} must be >= {minimum}")
            return value

        return cls(
            port=number("PORT", "8080", int, 0),
            host=get("SLESS_HOST", "0.0.0.0"),
            code_dir=get("SLESS_CODE_DIR", "/app/function"),
            entrypoint=get("SLESS_ENTRYPOINT", "handler.handle"),
            deps_dir=get("SLESS_DEPS_DIR", "") or None,
            timeout_sec=number("SLESS_TIMEOUT_SEC", "30", float, 0.001),
            max_body_bytes=number("SLESS_MAX_BODY_BYTES", "6291456", int, 0),
            drain_sec=number("SLESS_DRAIN_SEC", "25", float, 0),
            drain_listen_sec=number("SLESS_DRAIN_LISTEN_SEC", "0", float, 0),
            max_abandoned=number("SLESS_MAX_ABANDONED_HANDLERS", "8", int, 1),
            handler_threads=number("SLESS_HANDLER_THREADS", "32", int, 1),
            max_handler_threads=number("SLESS_MAX_HANDLER_THREADS", "1000", int, 1),
        )


def format_seconds(seconds: float) -> str:
    """Seconds as people write them: 30 -> "30", 1.5 -> "1.5" (same text in every runtime)."""
    return str(int(seconds)) if seconds == int(seconds) else repr(seconds)


def timeout_message(seconds: float) -> str:
    """The message of a timed-out invocation (HTTP 504 body and runner stderr)."""
    return f"function timed out after {format_seconds(seconds)}s"


def fetch_code() -> None:
    """On Kubernetes, the function's code first (``sless_fetch``, when SLESS_CODE_URL says where it is; exits 3
    when it cannot). Imported only then, from this folder (the user's modules are not on sys.path yet): where
    the code is in place already (standalone, a built image) it costs a start nothing."""
    if "SLESS_CODE_URL" not in os.environ:
        return
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    try:
        import sless_fetch
    finally:
        sys.path.remove(here)
    sless_fetch.fetch_from_env()


def load_handler(config: Config) -> Handler:
    """Import ``module.func`` from the code directory; raises LoadError with the reason.

    The code directory goes first on sys.path (then the dependency directory), so
    the user's modules win over everything else; the runtime's own directory is
    removed by the entry scripts before this runs, so user modules named like ours
    (``server``, ``runner``) are theirs.
    """
    _LOG_FOLDERS[:] = [config]  # from here on, what the runtime logs names no platform folder (log_exception)
    module_name, _, func_name = config.entrypoint.rpartition(".")
    if not module_name or not func_name:
        raise LoadError(f"SLESS_ENTRYPOINT={config.entrypoint!r} must look like module.function")
    for path in reversed([p for p in (config.code_dir, config.deps_dir) if p]):
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:  # any failure at import time, SystemExit included
        # Short and path-free: the traceback is logged from __cause__ (see log_load_failure).
        raise LoadError(f"{type(exc).__name__}: {public_message(str(exc), config) or '(no message)'}") from exc
    func = getattr(module, func_name, None)
    if func is None:
        raise LoadError(f"module {module_name!r} has no attribute {func_name!r}")
    if not callable(func):
        raise LoadError(f"{config.entrypoint} is not callable")
    return func  # type: ignore[no-any-return]


def build_event(method: str, path: str, query: str, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    """The event for one request (contract: JSON object body, or body text/base64, plus _ keys).

    ``headers`` already has lower-case names with repeated headers joined by ", "; its X-Sless-Params is taken
    out (it becomes ``_params``) and the rest becomes ``_headers``.
    """
    event: dict[str, Any] = {}
    if body:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            import base64

            event = {"body": base64.b64encode(body).decode("ascii"), "isBase64Encoded": True}
        else:
            parsed = _json_object(text)
            event = parsed if parsed is not None else {"body": text}
    event["_method"] = method.upper()
    event["_path"] = path
    event["_query"] = dict(parse_qsl(query, keep_blank_values=True)) if query else {}
    # X-Sless-Params: the platform's (the matched http trigger's path parameters), so never in _headers
    params = headers.pop("x-sless-params", None)
    event["_params"] = {} if params is None else path_params(params)
    event["_headers"] = headers
    event["_accept"] = headers.get("accept", "")
    return event


def path_params(value: str) -> dict[str, str]:
    """The X-Sless-Params header's object of strings (the matched http trigger's path parameters); {} when it
    is anything else. Header values are read as Latin-1: a non-ASCII one is UTF-8 JSON, parsed from its bytes."""
    try:
        params = json.loads(value if value.isascii() else value.encode("latin-1"))
    except (ValueError, RecursionError):  # a UnicodeError is a ValueError
        return {}
    if isinstance(params, dict) and all(isinstance(v, str) for v in params.values()):
        return params
    return {}


def _json_object(text: str) -> dict[str, Any] | None:
    """The body as a JSON object, or None when it is anything else."""
    if not text.lstrip(" \t\r\n").startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def to_json(value: Any) -> bytes:
    """Compact UTF-8 JSON (the same bytes Node's JSON.stringify gives); strict about NaN."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidResponse(f"result is not JSON-serializable: {exc}") from exc


class Response:
    """A response ready to send: status, headers (name, value) and the full body, or a ``stream`` (an iterator
    or async iterator of chunks, sent by sless_stream) with the call's ``context`` to produce it in."""

    __slots__ = ("body", "context", "headers", "status", "stream")

    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes, stream: Any = None) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.stream = stream
        self.context: contextvars.Context | None = contextvars.copy_context() if stream is not None else None


def is_stream(value: Any) -> bool:
    """A generator, async generator or other (async) iterator, whose chunks are streamed: not a str, bytes, list,
    dict or other value (lists and strings are iterable, but they are values)."""
    if isinstance(value, (str, bytes, bytearray, memoryview, dict, list, tuple)):
        return False
    kind = type(value)
    return hasattr(kind, "__anext__") or hasattr(kind, "__aiter__") or (
        hasattr(kind, "__next__") and hasattr(kind, "__iter__"))


def encode_result(result: Any) -> Response:
    """Map a handler result to a response (contract: "Result mapping")."""
    if is_stream(result):
        return Response(200, [], b"", stream=result)
    if isinstance(result, str):
        kind = HTML_TYPE if result.lstrip().startswith("<") else TEXT_TYPE
        return Response(200, [("Content-Type", kind)], result.encode("utf-8", "surrogatepass"))
    if isinstance(result, dict) and _is_int(result.get("statusCode")):
        return _from_description(result)
    if isinstance(result, (bytes, bytearray, memoryview)):
        return Response(200, [("Content-Type", "application/octet-stream")], bytes(result))
    return Response(200, [("Content-Type", JSON_TYPE)], to_json(result))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _from_description(desc: dict[str, Any]) -> Response:
    status: int = desc["statusCode"]
    if not 200 <= status <= 599:
        raise InvalidResponse(f"statusCode {status} is out of range 200-599")
    headers: list[tuple[str, str]] = []
    raw_headers = desc.get("headers")
    if raw_headers is not None:
        if not isinstance(raw_headers, dict):
            raise InvalidResponse("headers must be an object of strings")
        for raw_name, raw_value in raw_headers.items():
            name, value = str(raw_name), str(raw_value)
            if not _valid_header(name, value):
                raise InvalidResponse(f"invalid response header {name!r}")
            if name.lower() not in FRAMING_HEADERS:
                headers.append((name, value))
    has_type = any(name.lower() == "content-type" for name, _ in headers)
    body = desc.get("body")
    if is_stream(body):
        return Response(status, headers, b"", stream=body)
    if body is None:
        data = b""
    elif isinstance(body, str):
        if desc.get("isBase64Encoded") is True:
            import base64

            try:
                data = base64.b64decode(body, validate=True)
            except ValueError as exc:  # binascii.Error is a ValueError
                raise InvalidResponse(f"body is not valid base64: {exc}") from exc
        else:
            data = body.encode("utf-8", "surrogatepass")
        if not has_type:
            headers.append(("Content-Type", TEXT_TYPE))
    else:
        data = to_json(body)
        if not has_type:
            headers.append(("Content-Type", JSON_TYPE))
    return Response(status, headers, data)


def _valid_header(name: str, value: str) -> bool:
    """A header that cannot split or corrupt the response (RFC 9110 token name, latin-1 value)."""
    if not name or not name.isascii() or any(c in _NOT_TOKEN or c < "!" for c in name):
        return False
    if "\r" in value or "\n" in value or "\0" in value:
        return False
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


_NOT_TOKEN = frozenset('"(),/:;<=>?@[\\]{}\x7f')


def error_response(status: int, message: str, type_: str) -> Response:
    """The JSON error body every failure uses: {"error": ..., "type": ...}."""
    return Response(status, [("Content-Type", JSON_TYPE)], to_json({"error": message, "type": type_}))


def exception_response(exc: BaseException, config: Config | None = None) -> Response:
    """500 for a failed invocation: the exception's message and class name, never the traceback
    (and, with ``config``, never the platform's folders: see ``public_message``)."""
    message = str(exc) or type(exc).__name__
    if config is not None:
        message = public_message(message, config)
    return error_response(500, message, type(exc).__name__)


#: Where this runtime's own files are; never shown to a caller.
RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))


def public_message(message: str, config: Config | None) -> str:
    """``message`` as a tenant may see it: the code, dependency and runtime folders (where the
    platform keeps them says nothing to a caller, and everything to an attacker) become
    ``.``, ``<deps>`` and ``<runtime>``. The same holds for the function's log, which its tenant
    reads (``sless logs``, a job's message): a traceback names ``./handler.py``, line 3."""
    code_dir, deps_dir = (config.code_dir, config.deps_dir) if config is not None else (None, None)
    for folder, label in ((code_dir, "."), (deps_dir, "<deps>"), (RUNTIME_DIR, "<runtime>")):
        if folder and len(folder) > 1:
            message = message.replace(folder.rstrip("/") + "/", label + "/").replace(folder.rstrip("/"), label)
    return message


#: The loaded function's folders, once ``load_handler`` knows them: every traceback the runtime logs is
#: told in their labels (``public_message``). Before it, only the runtime's own folder is known.
_LOG_FOLDERS: list[Config] = []


def load_failure_message(exc: LoadError) -> str:
    """The one line a caller may see about a handler that cannot load (the last line on stderr)."""
    return f"the function failed to load: {exc}"


def log_load_failure(config: Config, exc: LoadError) -> None:
    """The full story on stderr (the function's log), then the short, path-free reason as the last line."""
    cause = exc.__cause__
    if cause is not None:
        log_exception(f"cannot load handler {config.entrypoint}", cause)
    log(load_failure_message(exc))


def log(message: str) -> None:
    """One line (or a traceback) on stderr, prefixed so it stands out in mixed logs."""
    try:
        sys.stderr.write(f"sless-runtime: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def log_exception(what: str, exc: BaseException) -> None:
    """Log ``what`` with the exception's traceback on stderr."""
    import traceback

    detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    log(public_message(f"{what}:\n{detail.rstrip()}", _LOG_FOLDERS[0] if _LOG_FOLDERS else None))


# ---------------------------------------------------------------------- per-call output tagging
#
# Every line a handler writes to sys.stdout or sys.stderr while serving a call is written as
# ``@sless:<request id> <text>`` (runtimes/README.md, "Output of a call"), so the platform can file
# it under that call. The call lives in a context variable: each connection thread sets its own, and
# asyncio tasks inherit it, so concurrent calls never borrow each other's id. A line written outside
# any call that starts with the tag marker itself is re-tagged ``@sless:- `` ("no call"): printed text
# can never pass for another call's line.
#
# The lines a call writes before its answer's head goes out are also kept with the call and sent back in
# ``X-Sless-Output``, so the platform keeps them with the call's record after the process is gone.

import contextvars  # noqa: E402 - kept next to the code that uses it
import re  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

TAG = "@sless:"
NO_CALL = "-"
#: The request ids the platform sends (sless_api.gateway.requestid): anything else tags nothing.
_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}")
#: A partial line longer than this is written as a line of its own (a runaway line must not grow forever).
MAX_PARTIAL_CHARS = 65536
#: The response header that carries the handler's own run time to the platform (which removes it).
HANDLER_MS_HEADER = "X-Sless-Handler-Ms"
#: The response header that carries the lines a call wrote before its answer (the platform removes it).
OUTPUT_HEADER = "X-Sless-Output"
#: Response headers only the runtime sets: a handler's own of these names are dropped (lower case).
RUNTIME_HEADERS = frozenset({HANDLER_MS_HEADER.lower(), OUTPUT_HEADER.lower()})
#: Bytes of text (UTF-8) a call's X-Sless-Output holds at most (the contract's cap).
MAX_OUTPUT_BYTES = 16384
#: Lines it holds at most (the contract's cap): empty lines cost no text, so their number is bounded on its own;
#: it also bounds what a call keeps in memory.
MAX_OUTPUT_LINES = 1024


class Call:
    """One call as the output streams see it: the request id its lines are tagged with and, from its first
    line until its answer's head goes out (``capturing``), the lines it wrote. The HTTP server's request is
    one, so a call that writes nothing allocates nothing for its output."""

    __slots__ = ("call_id", "capturing", "output")

    def __init__(self, call_id: str | None = None, capturing: bool = False) -> None:
        self.call_id = call_id
        self.capturing = capturing
        self.output: CallOutput | None = None


#: The call being served; a bare request id where an older server (bench/peers/threaded_server.py, the
#: benchmarks' baseline, run against this module) sets one: its lines are tagged and kept nowhere.
CALL: contextvars.ContextVar[Call | str | None] = contextvars.ContextVar("sless_call", default=None)
CALL_ID = CALL  # that older server's name for it


class CallOutput:
    """The lines one call wrote, (stream, text, Unix time), up to MAX_OUTPUT_BYTES of text and
    MAX_OUTPUT_LINES: the first line that does not fit ends the keeping (``truncated``)."""

    __slots__ = ("lines", "size", "truncated")

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, float]] = []
        self.size = 0
        self.truncated = False

    def add(self, stream: str, texts: list[str], ts: float) -> None:
        if self.truncated:
            return
        lines = self.lines
        for text in texts:
            size = self.size + (len(text) if text.isascii() else len(text.encode("utf-8", "replace")))
            if size > MAX_OUTPUT_BYTES or len(lines) >= MAX_OUTPUT_LINES:
                self.truncated = True
                return
            self.size = size
            lines.append((stream, text, ts))

    def header_value(self) -> str:
        """Padded base64 of the UTF-8 JSON the contract describes."""
        import base64

        document = {"lines": [{"stream": stream, "text": text, "ts": ts} for stream, text, ts in self.lines],
                    "truncated": self.truncated}
        # a lone surrogate (text decoded with surrogateescape) becomes "?": the value must be valid UTF-8
        data = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")
        return base64.b64encode(data).decode("ascii")


#: Guards every call's ``output`` (a call may write from several threads: its own, a stream's producer).
_OUTPUT_LOCK = threading.Lock()


def keep_lines(call: Call, stream: str, texts: list[str]) -> None:
    """Keep complete lines ``call`` wrote to ``stream`` ("stdout" or "stderr") for its X-Sless-Output."""
    ts = round(time.time(), 3)
    with _OUTPUT_LOCK:
        if not call.capturing:  # its head went out meanwhile
            return
        output = call.output
        if output is None:
            output = call.output = CallOutput()
        output.add(stream, texts, ts)


def take_output(call: Call) -> str | None:
    """The X-Sless-Output value of what ``call`` wrote so far (None when it wrote nothing), once: the
    call's answer is being made, and its later lines go to the streams only."""
    call.capturing = False
    if call.output is None:  # a call that wrote nothing: no lock, nothing built
        return None
    with _OUTPUT_LOCK:  # a line being kept by another of the call's threads is in, or left out, whole
        output, call.output = call.output, None
    return output.header_value() if output is not None else None


def call_id_from(value: str | None) -> str | None:
    """The request id a call's lines are tagged with: the header's value when it is one the platform makes."""
    return value if value and _REQUEST_ID.fullmatch(value) else None


def tag_line(call_id: str | None, line: str) -> str:
    """One output line in the documented format (without its newline)."""
    if call_id is not None:
        return f"{TAG}{call_id} {line}"
    if line.startswith(TAG):
        return f"{TAG}{NO_CALL} {line}"
    return line


class TaggedStream:
    """A text stream in front of sys.stdout/sys.stderr that tags each complete line with the current call
    and keeps it for the call's X-Sless-Output while the call's answer is not out yet.

    Partial lines wait per call (``print("a", end="")`` then ``print("b")`` is one line), so two calls
    writing at once never end up on the same line. Anything else (``fileno``, ``buffer``, ``encoding``)
    is the real stream's: bytes written to ``sys.stdout.buffer`` or the file descriptor are not tagged.
    """

    def __init__(self, raw: Any, stream_name: str) -> None:
        self._raw = raw
        #: "stdout" or "stderr", as X-Sless-Output names the stream
        self._stream_name = stream_name
        self._lock = threading.Lock()
        #: the pending partial line of each call (None: outside any call)
        self._partial: dict[Call | str | None, str] = {}

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        call = CALL.get()
        call_id = call.call_id if isinstance(call, Call) else call
        with self._lock:
            pending = self._partial.pop(call, "") + text if self._partial else text
            lines = pending.split("\n")
            rest = lines.pop()
            if len(rest) > MAX_PARTIAL_CHARS:
                lines.append(rest)
                rest = ""
            if rest:
                self._partial[call] = rest
            if lines:
                self._raw.write("".join(tag_line(call_id, line) + "\n" for line in lines))
                if isinstance(call, Call) and call.capturing:  # under the lock: kept in the order written
                    keep_lines(call, self._stream_name, lines)
        return len(text)

    def end_call(self, call: Call | str | None) -> None:
        """Write what a finished call left without a newline (a line of its own, kept like the others)."""
        if not self._partial:  # the common case, read without the lock: nothing waits for any call
            return
        with self._lock:
            rest = self._partial.pop(call, None)
            if not rest:
                return
            if not isinstance(call, Call):
                self._raw.write(tag_line(call, rest) + "\n")
                return
            self._raw.write(tag_line(call.call_id, rest) + "\n")
            if call.capturing:
                keep_lines(call, self._stream_name, [rest])

    def flush(self) -> None:
        self._raw.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def install_call_tagging() -> tuple[TaggedStream, TaggedStream]:
    """Put tagging streams in front of sys.stdout and sys.stderr (the HTTP server does; the runner does not)."""
    out, err = TaggedStream(sys.stdout, "stdout"), TaggedStream(sys.stderr, "stderr")
    sys.stdout, sys.stderr = out, err  # type: ignore[assignment]
    return out, err
