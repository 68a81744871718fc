"""Baseline for bench/connections.py: the Python runtime's previous server, one thread per connection.

Kept unchanged (apart from this paragraph) from runtimes/python3.11/server.py before it moved to epoll with
handler threads; the benchmark copies it into a temporary directory next to the current
sless_runtime.py and runs it there. Not used by the platform.

Its original description follows.

Design (why it looks like this):
- One thread per connection with blocking sockets and a small hand-written
  HTTP/1.1 parser. A request never hops between threads, so a keep-alive
  request costs one recv, one handler call and one send; http.server's
  BaseHTTPRequestHandler (line-by-line file reads, several writes per response)
  is several times slower. A slow handler occupies only its own connection.
- Timeouts: a watchdog thread answers 504 on behalf of a handler that overran
  SLESS_TIMEOUT_SEC and closes that connection; Python cannot stop a thread, so
  the handler keeps running in the background until it returns on its own.
  ``async def`` handlers run on one shared event loop and are cancelled instead.
- SIGTERM: close the listening socket (new connections are refused), close
  idle keep-alive connections, let in-flight requests finish up to
  SLESS_DRAIN_SEC, exit 0.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from http import HTTPStatus
from types import FrameType

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing at start-up

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import sless_runtime as rt  # noqa: E402

if TYPE_CHECKING:
    import asyncio
    from typing import Any

# The user's modules must not be shadowed by this directory (e.g. their own "server.py").
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

RECV_SIZE = 65536
MAX_HEAD_BYTES = 65536
#: Idle keep-alive connections (and stalled clients) are closed after this many seconds.
IDLE_TIMEOUT_SEC = 75.0
#: After a 413, how long to swallow the rest of the upload so the client reads our answer.
LINGER_SEC = 0.5

_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode("latin-1") for s in HTTPStatus}


# Exit status after recycling the process because too many handlers overran (EX_TEMPFAIL).
RECYCLE_EXIT = 75


class BadRequest(Exception):
    """The request cannot be parsed; answered with ``status`` and the connection closed."""

    def __init__(self, status: int, message: str, type_: str = "BadRequest") -> None:
        super().__init__(message)
        self.status = status
        self.type = type_


class ClientGone(Exception):
    """The client closed the connection in the middle of a request."""


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    return line if line is not None else f"HTTP/1.1 {status} Status {status}\r\n".encode()


class _Clock:
    """The Date header, formatted at most once a second."""

    def __init__(self) -> None:
        self.second = -1
        self.header = b""

    def date(self) -> bytes:
        now = int(time.time())
        if now != self.second:
            self.header = b"Date: " + _http_date(now) + b"\r\n"
            self.second = now
        return self.header


_clock = _Clock()
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_CO_COROUTINE = 0x80  # inspect.CO_COROUTINE, read without importing inspect at start-up


def _http_date(now: int) -> bytes:
    """RFC 9110 IMF-fixdate, independent of the handler's locale (and of email.utils' import cost)."""
    t = time.gmtime(now)
    return (f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT").encode()


def _is_coroutine_function(fn: Any) -> bool:
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:  # a callable object or a partial: rare, so pay for inspect here
        import inspect

        return inspect.iscoroutinefunction(fn)
    return bool(code.co_flags & _CO_COROUTINE)


def serialize(resp: rt.Response, keep_alive: bool, head_only: bool, http10: bool = False) -> bytes:
    """The complete response as one buffer (one send: no Nagle/delayed-ACK stall)."""
    parts = [_status_line(resp.status)]
    for name, value in resp.headers:
        parts.append(f"{name}: {value}\r\n".encode("latin-1"))
    bodyless = resp.status in (204, 304)
    if not bodyless:
        parts.append(b"Content-Length: %d\r\n" % len(resp.body))
    parts.append(_clock.date())
    if not keep_alive:
        parts.append(b"Connection: close\r\n")
    elif http10:
        parts.append(b"Connection: keep-alive\r\n")
    parts.append(b"\r\n")
    if not head_only and not bodyless:
        parts.append(resp.body)
    return b"".join(parts)


class Connection:
    """One client connection, served by its own thread."""

    __slots__ = ("buf", "busy", "deadline", "head_only", "lock", "sock", "timed_out")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.lock = threading.Lock()
        #: True from the first byte of a request until its response is sent.
        self.busy = False
        #: monotonic deadline of the running sync handler (0: none running).
        self.deadline = 0.0
        #: The watchdog answered 504; the handler thread still runs.
        self.timed_out = False
        self.head_only = False

    def fill(self) -> None:
        """Read more bytes into the buffer; raises ClientGone at EOF."""
        data = self.sock.recv(RECV_SIZE)
        if not data:
            raise ClientGone()
        self.buf += data

    def read_line(self, limit: int = 8192) -> bytes:
        """One CRLF-terminated line (without the CRLF)."""
        buf = self.buf
        idx = buf.find(b"\r\n")
        while idx < 0:
            if len(buf) > limit:
                raise BadRequest(400, "line too long")
            self.fill()
            idx = buf.find(b"\r\n")
        line = bytes(buf[:idx])
        del buf[: idx + 2]
        return line

    def read_exact(self, n: int) -> bytes:
        """Exactly ``n`` bytes (reading straight into one buffer: no quadratic copying)."""
        buf = self.buf
        if len(buf) >= n:
            out = bytes(buf[:n])
            del buf[:n]
            return out
        target = bytearray(n)
        have = len(buf)
        target[:have] = buf
        buf.clear()
        view = memoryview(target)
        while have < n:
            got = self.sock.recv_into(view[have:], n - have)
            if not got:
                raise ClientGone()
            have += got
        return bytes(target)


class Server:
    """Accepts connections and runs the handler; see the module docstring."""

    def __init__(self, config: rt.Config, handler: rt.Handler) -> None:
        self.config = config
        self.handler = handler
        self.is_async = _is_coroutine_function(handler)
        self.connections: set[Connection] = set()
        self.draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()
        #: sync handler threads still running after their 504 (Python cannot stop a thread)
        self.abandoned = 0
        self._abandoned_lock = threading.Lock()
        self.exit_code = 0
        #: The tagging streams in front of sys.stdout/sys.stderr (see sless_runtime.TaggedStream).
        self.tagged = [s for s in (sys.stdout, sys.stderr) if isinstance(s, rt.TaggedStream)]
        self.listener = self._listen()

    # ------------------------------------------------------------------ life cycle

    def _listen(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.config.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.config.host, self.config.port))
        sock.listen(1024)
        return sock

    def serve(self) -> None:
        """Accept until SIGTERM/SIGINT, then drain and exit 0 (never returns)."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        threading.Thread(target=self._watchdog, name="sless-watchdog", daemon=True).start()
        host, port = self.listener.getsockname()[:2]
        rt.log(f"python runtime listening on {host}:{port}, handler {self.config.entrypoint}")
        # The kernel may deliver SIGTERM to any thread, and Python runs its handler only
        # when the main thread executes bytecode: a main thread blocked in accept() would
        # never notice. The wakeup fd makes the signal wake the select() below instead.
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        self.listener.setblocking(False)
        while not self.draining:
            ready, _, _ = select.select([self.listener, wake_r], [], [])
            if wake_r in ready:
                with contextlib.suppress(OSError):
                    wake_r.recv(4096)
            while not self.draining:
                try:
                    sock, _ = self.listener.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:  # e.g. EMFILE: keep serving the connections we have
                    rt.log(f"accept failed: {exc}")
                    time.sleep(0.1)
                    break
                self._start(sock)
        self._drain()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.draining = True

    def _start(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Kernel-level timeouts keep the socket blocking (no poll() per recv, unlike settimeout).
        timeval = struct.pack("ll", int(IDLE_TIMEOUT_SEC), 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
        conn = Connection(sock)
        self.connections.add(conn)
        threading.Thread(target=self._serve_connection, args=(conn,), daemon=True).start()

    def _drain(self) -> None:
        """Refuse new connections, close idle ones, wait for in-flight requests, exit 0."""
        self.listener.close()
        arrived: set[Connection] = set()  # a request arrived just before SIGTERM: serve it
        for conn in list(self.connections):
            if conn.busy:
                continue
            if _has_pending_input(conn.sock):
                arrived.add(conn)
            else:
                _shutdown(conn.sock)
        deadline = time.monotonic() + self.config.drain_sec
        while time.monotonic() < deadline:
            if not any((c.busy or c in arrived) and not c.timed_out for c in list(self.connections)):
                break
            time.sleep(0.02)
        else:
            rt.log(f"drain deadline of {rt.format_seconds(self.config.drain_sec)}s reached; exiting")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(self.exit_code)

    # ------------------------------------------------------------------ requests

    def _serve_connection(self, conn: Connection) -> None:
        try:
            while self._serve_one(conn):
                pass
        except (ClientGone, OSError):
            pass
        except BadRequest as exc:
            self._reject(conn, exc.status, str(exc), exc.type)
        except Exception as exc:  # a bug in the server itself: log it, drop the connection
            rt.log_exception("connection failed", exc)
        finally:
            self.connections.discard(conn)
            with conn.lock, contextlib.suppress(OSError):
                conn.sock.close()

    def _serve_one(self, conn: Connection) -> bool:
        """Read, run and answer one request; False when the connection must close."""
        conn.busy = False
        buf = conn.buf
        while buf[:2] == b"\r\n":  # stray CRLFs between requests are allowed (RFC 9112 2.2)
            del buf[:2]
        end = buf.find(b"\r\n\r\n")
        while end < 0:
            if self.draining and not buf and not _has_pending_input(conn.sock):
                return False
            if len(buf) > MAX_HEAD_BYTES:
                raise BadRequest(431, "request header too large", "HeaderTooLarge")
            conn.fill()
            conn.busy = True
            while buf[:2] == b"\r\n":
                del buf[:2]
            end = buf.find(b"\r\n\r\n")
        conn.busy = True
        if end > MAX_HEAD_BYTES:
            raise BadRequest(431, "request header too large", "HeaderTooLarge")
        head = bytes(buf[:end])
        del buf[: end + 4]
        method, target, http10, headers = _parse_head(head)
        conn.head_only = method == "HEAD"

        keep_alive = _keep_alive(http10, headers.get("connection", ""))
        body = self._read_body(conn, headers)
        path, _, query = _split_target(target)
        if path.startswith("/_/"):
            resp = _reserved(method, path)
        else:
            event = rt.build_event(method, path, query, headers, body)
            call_id = rt.call_id_from(headers.get("x-request-id"))
            token = rt.CALL_ID.set(call_id)
            began = time.perf_counter()
            try:
                maybe = self._invoke(conn, event)
            finally:
                rt.CALL_ID.reset(token)
                for stream in self.tagged:
                    stream.end_call(call_id)
            if maybe is None:  # timed out: the watchdog answered and closed the connection
                return False
            resp = maybe
            resp.headers = [h for h in resp.headers if h[0].lower() != "x-sless-handler-ms"]
            resp.headers.append((rt.HANDLER_MS_HEADER, f"{(time.perf_counter() - began) * 1000:.3f}"))
        if self.draining or ("transfer-encoding" in headers and "content-length" in headers):
            keep_alive = False
        conn.sock.sendall(serialize(resp, keep_alive, conn.head_only, http10))
        return keep_alive

    def _read_body(self, conn: Connection, headers: dict[str, str]) -> bytes:
        limit = self.config.max_body_bytes
        te = headers.get("transfer-encoding")
        if te is not None:
            if te.rsplit(",", 1)[-1].strip().lower() != "chunked":
                raise BadRequest(501, f"unsupported transfer-encoding {te!r}", "NotImplemented")
            self._continue(conn, headers)
            return self._read_chunked(conn, limit)
        cl = headers.get("content-length")
        if cl is None:
            return b""
        length = _content_length(cl)
        if length > limit:
            raise BadRequest(413, _too_large(limit), "PayloadTooLarge")
        if length == 0:
            return b""
        self._continue(conn, headers)
        return conn.read_exact(length)

    def _continue(self, conn: Connection, headers: dict[str, str]) -> None:
        if headers.get("expect", "").lower() == "100-continue" and not conn.buf:
            conn.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _read_chunked(self, conn: Connection, limit: int) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            line = conn.read_line()
            size_text = line.split(b";", 1)[0].strip()
            if not size_text or len(size_text) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in size_text):
                raise BadRequest(400, "bad chunk size")
            size = int(size_text, 16)
            if size == 0:
                while conn.read_line():  # trailer fields, ignored
                    pass
                return b"".join(parts)
            total += size
            if total > limit:
                raise BadRequest(413, _too_large(limit), "PayloadTooLarge")
            parts.append(conn.read_exact(size))
            if conn.read_exact(2) != b"\r\n":
                raise BadRequest(400, "bad chunk terminator")

    def _reject(self, conn: Connection, status: int, message: str, type_: str) -> None:
        """Answer a request we will not run, then close without resetting the connection."""
        try:
            conn.sock.sendall(serialize(rt.error_response(status, message, type_), False, conn.head_only))
            conn.sock.shutdown(socket.SHUT_WR)
            # Swallow what the client is still sending for a moment: closing with unread
            # data would send a TCP reset that can destroy our answer in flight.
            conn.sock.settimeout(LINGER_SEC)
            deadline = time.monotonic() + LINGER_SEC
            swallowed = 0
            while time.monotonic() < deadline and swallowed < 16 * RECV_SIZE:
                data = conn.sock.recv(RECV_SIZE)
                if not data:
                    break
                swallowed += len(data)
        except OSError:
            pass

    # ------------------------------------------------------------------ invocation

    def _invoke(self, conn: Connection, event: dict[str, Any]) -> rt.Response | None:
        """Run the handler; the response, or None when the watchdog already answered 504."""
        timeout = self.config.timeout_sec
        if self.is_async:
            return self._run_async(self.handler(event), timeout)
        conn.deadline = time.monotonic() + timeout
        try:
            result = self.handler(event)
        except BaseException as exc:  # SystemExit from a handler must not end the thread either
            if self._disarm(conn):
                self._release()
                return None
            rt.log_exception(f"handler failed ({event['_method']} {event['_path']})", exc)
            return rt.exception_response(exc, self.config)
        remaining = conn.deadline - time.monotonic()
        if self._disarm(conn):
            self._release()
            return None
        if hasattr(type(result), "__await__"):  # e.g. a sync wrapper around an async function
            return self._run_async(result, max(0.001, remaining))
        return _encode(result)

    def _disarm(self, conn: Connection) -> bool:
        """Stop the watchdog for this request; True if it already answered 504."""
        with conn.lock:
            conn.deadline = 0.0
            return conn.timed_out

    def _run_async(self, awaitable: Any, timeout: float) -> rt.Response:
        import asyncio

        future = asyncio.run_coroutine_threadsafe(_as_coroutine(awaitable), self._event_loop())
        try:
            result = future.result(timeout)
        except TimeoutError:  # concurrent.futures.TimeoutError is this builtin since 3.11
            future.cancel()
            rt.log(rt.timeout_message(self.config.timeout_sec) + " (async handler cancelled)")
            return rt.error_response(504, rt.timeout_message(self.config.timeout_sec), "Timeout")
        except BaseException as exc:
            rt.log_exception("handler failed", exc)
            return rt.exception_response(exc, self.config)
        return _encode(result)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """The shared loop for async handlers, started on first use."""
        import asyncio  # on first use: most handlers are sync, and asyncio costs ~40 ms of cold start

        with self._loop_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="sless-async", daemon=True).start()
                self._loop = loop
            return self._loop

    def _watchdog(self) -> None:
        """Answer 504 for sync handlers that overran their deadline."""
        interval = min(0.05, max(0.005, self.config.timeout_sec / 20))
        while True:
            time.sleep(interval)
            now = time.monotonic()
            for conn in list(self.connections):
                deadline = conn.deadline
                if deadline and now >= deadline:
                    self._expire(conn, now)

    def _expire(self, conn: Connection, now: float) -> None:
        message = rt.timeout_message(self.config.timeout_sec)
        with conn.lock:
            if not conn.deadline or now < conn.deadline:
                return  # finished in the meantime
            conn.deadline = 0.0
            conn.timed_out = True
            with contextlib.suppress(OSError):
                resp = rt.error_response(504, message, "Timeout")
                conn.sock.sendall(serialize(resp, False, conn.head_only))
            _shutdown(conn.sock)
        rt.log(f"{message}; the handler thread keeps running until it returns")
        self._abandon()

    def _abandon(self) -> None:
        """Count a handler left running; past the limit, recycle the process (its supervisor starts a new one).

        Each abandoned thread holds memory and may spin a core; the only way to stop them is to end the
        process. In-flight requests on other connections still finish (the usual drain), then the exit
        code says why.
        """
        with self._abandoned_lock:
            self.abandoned += 1
            recycle = self.abandoned >= self.config.max_abandoned and self.exit_code == 0
            if recycle:
                self.exit_code = RECYCLE_EXIT
        if recycle:
            rt.log(f"{self.abandoned} handler threads still running after their timeouts: recycling the process "
                   f"(exit {RECYCLE_EXIT} after the drain)")
            os.kill(os.getpid(), signal.SIGTERM)  # wakes the accept loop like a real SIGTERM

    def _release(self) -> None:
        with self._abandoned_lock:
            self.abandoned -= 1


async def _as_coroutine(awaitable: Any) -> Any:
    return await awaitable


def _encode(result: Any) -> rt.Response:
    try:
        return rt.encode_result(result)
    except rt.InvalidResponse as exc:
        rt.log(f"bad handler result: {exc}")
        return rt.exception_response(exc)


def _has_pending_input(sock: socket.socket) -> bool:
    """True when request bytes wait unread in the kernel (without consuming or blocking)."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:  # nothing there (EAGAIN) or a broken socket
        return False


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _too_large(limit: int) -> str:
    return f"request body exceeds {limit} bytes"


def _reserved(method: str, path: str) -> rt.Response:
    """The platform's own /_/ endpoints; the handler never sees these paths."""
    if path == "/_/health":
        if method in ("GET", "HEAD"):
            return rt.Response(200, [("Content-Type", rt.JSON_TYPE)], b'{"status":"ok"}')
        return rt.error_response(405, f"method {method} not allowed on {path}", "MethodNotAllowed")
    return rt.error_response(404, f"no such endpoint: {path}", "NotFound")


def _parse_head(head: bytes) -> tuple[str, str, bool, dict[str, str]]:
    """Request line and headers; names lower-case, repeated headers joined with ", "."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise BadRequest(400, "malformed request line")
    method_b, target_b, version = parts
    if version == b"HTTP/1.1":
        http10 = False
    elif version == b"HTTP/1.0":
        http10 = True
    else:
        raise BadRequest(505, "only HTTP/1.0 and HTTP/1.1 are supported", "VersionNotSupported")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name[-1:] in b" \t" or line[:1] in b" \t":
            raise BadRequest(400, "malformed header line")
        key = name.decode("latin-1").lower()
        text = value.strip(b" \t").decode("latin-1")
        previous = headers.get(key)
        headers[key] = text if previous is None else f"{previous}, {text}"
    return method_b.decode("latin-1").upper(), target_b.decode("latin-1"), http10, headers


def _keep_alive(http10: bool, connection: str) -> bool:
    tokens = {t.strip().lower() for t in connection.split(",")} if connection else set()
    if http10:
        return "keep-alive" in tokens
    return "close" not in tokens


def _content_length(value: str) -> int:
    values = {v.strip() for v in value.split(",")}
    if len(values) != 1:
        raise BadRequest(400, "conflicting Content-Length values")
    text = values.pop()
    if not text.isdigit() or not text.isascii():
        raise BadRequest(400, "invalid Content-Length")
    return int(text)


def _split_target(target: str) -> tuple[str, str, str]:
    """(path, "?", query) of the request target; absolute-form targets lose scheme and host."""
    if not target.startswith("/") and target != "*":
        scheme_end = target.find("://")
        if scheme_end > 0:
            slash = target.find("/", scheme_end + 3)
            target = target[slash:] if slash >= 0 else "/"
    return target.partition("?")


def main() -> None:
    """Load the configuration and the handler (exit 1 on failure), then serve forever."""
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    try:
        config = rt.Config.from_env()
    except ValueError as exc:
        rt.log(f"bad configuration: {exc}")
        sys.exit(1)
    rt.install_call_tagging()  # before the handler's import: loggers it makes there write through it
    try:
        handler = rt.load_handler(config)
    except rt.LoadError as exc:
        rt.log_load_failure(config, exc)
        sys.exit(1)
    try:
        server = Server(config, handler)
    except OSError as exc:
        rt.log(f"cannot listen on {config.host}:{config.port}: {exc}")
        sys.exit(1)
    server.serve()


if __name__ == "__main__":
    main()
