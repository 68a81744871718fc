"""sless Python runtime: the HTTP/1.1 server that calls the user's handler once per request.

Started by ``server.py`` (a few lines, so that this module's bytecode can be cached; see there).

Design (why it looks like this):
- Connections wait in one epoll (EPOLLONESHOT). One handler thread at a time waits in epoll_wait on it,
  takes the ready connections and serves them one after the other on its own: reads and parses the
  request, runs the handler inline, writes the answer, re-arms the connection (HandlerThreads). Under load
  a request then wakes no thread and hands the GIL to none; an idle keep-alive connection costs a buffer,
  not a thread. The other handler threads are parked; the watchdog wakes or starts them when requests wait
  while every thread is inside a handler: one per waiting request while the handlers block (sleep, I/O),
  up to SLESS_MAX_HANDLER_THREADS, one more every STUCK_SEC while they compute, up to
  SLESS_HANDLER_THREADS. Exactly one thread owns a connection at a time. The main thread accepts
  connections, times out idle ones and handles signals. The small hand-written HTTP/1.1 parser beats
  http.server's BaseHTTPRequestHandler (line-by-line file reads, several writes per response) several
  times over.
- Timeouts: a watchdog thread answers 504 on behalf of a handler that overran
  SLESS_TIMEOUT_SEC and closes that connection; Python cannot stop a thread, so
  the handler keeps running in the background until it returns on its own.
  ``async def`` handlers run on one shared event loop and are cancelled instead.
- SIGTERM: close idle keep-alive connections (the rest close after their
  answer), keep accepting new connections for SLESS_DRAIN_LISTEN_SEC (0 by
  default; a pod sets it: the nodes' Service rules still send it connections
  a while after it was told to stop, and a closed listener would refuse them),
  then close the listening socket (new connections are refused), let in-flight
  requests finish up to SLESS_DRAIN_SEC (from the signal), exit 0.
- Linux only (epoll), like the platform's images.
"""

from __future__ import annotations

import collections
import contextlib
import gc
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
import sless_stream  # noqa: E402
import sless_ws  # noqa: E402

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable
    from typing import Any

# The user's modules must not be shadowed by this directory (e.g. their own "server.py").
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

RECV_SIZE = 65536
MAX_HEAD_BYTES = 65536
#: Idle keep-alive connections (and stalled clients) are closed after this many seconds.
IDLE_TIMEOUT_SEC = 75.0
#: After a 413, how long to swallow the rest of the upload so the client reads our answer.
LINGER_SEC = 0.5
#: Longest chunk-size or trailer line of a chunked body.
MAX_LINE_BYTES = 8192
#: recv calls for one connection per wake-up before the loop turns to the others (a large upload).
READS_PER_EVENT = 16
#: Requests waiting this long behind handlers that compute get one more thread (up to SLESS_HANDLER_THREADS).
STUCK_SEC = 0.1
#: Handler threads beyond SLESS_HANDLER_THREADS end after this many seconds without a request.
WORKER_IDLE_SEC = 10.0
#: Ready connections the poller takes from epoll at once (the rest stay in the kernel's ready list).
POLL_EVENTS = 64
#: How often the watchdog looks for requests waiting behind handlers while handlers run.
BALANCE_SEC = 0.002
#: The watchdog rests (until the poller nudges it, or the next timeout check) after this long without a
#: handler running; not at once, or every request of a lone keep-alive connection would have to wake it.
REST_AFTER_SEC = 0.5
#: Below this share of one CPU used by the process while requests wait, its handlers count as blocked.
BLOCKED_SHARE = 0.5
#: The futex system call's number on x86-64 and arm64 (what a thread waiting for the GIL or a lock waits in).
_SYS_FUTEX = 202 if os.uname().machine == "x86_64" else 98
#: What HandlerThreads._poll returns instead of a descriptor.
_PARK, _AGAIN = -1, -2
#: Address space reserved per thread. Linux gives a thread the process's stack rlimit (8 MiB) by default, and
#: a sandboxed function's RLIMIT_AS is its memory limit plus a fixed headroom: a pool grown to a hundred
#: threads would reserve 800 MiB of it, and a handler's allocation would then fail with MemoryError before
#: the memory cgroup's limit (which names the cause) is reached. Python frames need far less C stack in 3.11.
THREAD_STACK_BYTES = 2 * 1024 * 1024
_SEND_TIMEOUT = struct.pack("ll", int(IDLE_TIMEOUT_SEC), 0)
#: The largest answer the watchdog sends (a send that does not wait): an idle connection's send buffer takes
#: this much at once (the kernel starts it at 16 KiB, tcp_wmem).
MAX_UNWAITED_ANSWER_BYTES = 8192
#: How a connection waits in epoll: for bytes or EOF, once (whoever handles the event re-arms it).
_ARMED = select.EPOLLIN | select.EPOLLONESHOT

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
    line = _STATUS_LINES.get(resp.status)
    parts = [line if line is not None else _status_line(resp.status)]
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


class Request(rt.Call):
    """One request, complete with its body, as the event loop hands it to a handler thread; also the call its
    handler's output is tagged with and kept for (rt.Call: no object of its own per call)."""

    __slots__ = ("body", "headers", "http10", "keep_alive", "method", "path", "query")

    def __init__(self, method: str, target: str, http10: bool, headers: dict[str, str], keep_alive: bool) -> None:
        self.call_id = None
        self.capturing = False
        self.output = None
        self.method = method
        self.path, _, self.query = _split_target(target)
        self.http10 = http10
        self.headers = headers
        self.keep_alive = keep_alive
        self.body = b""


class FixedBody:
    """A Content-Length body: complete once that many bytes are buffered."""

    __slots__ = ("length",)

    def __init__(self, length: int) -> None:
        self.length = length

    def take(self, buf: bytearray) -> bytes | None:
        n = self.length
        if len(buf) < n:
            return None
        out = bytes(buf[:n])
        del buf[:n]
        return out


class ChunkedBody:
    """An incremental chunked-body decoder: consumes what is buffered, keeps its place between reads."""

    __slots__ = ("left", "limit", "parts", "total", "trailers")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.total = 0
        self.left = -1  # bytes of the current chunk still expected; -1: a size line is next
        self.trailers = False

    def take(self, buf: bytearray) -> bytes | None:
        """The whole body once its last chunk and trailers are buffered; raises BadRequest (400, 413)."""
        while True:
            if self.left >= 0:
                need = self.left + 2
                if len(buf) < need:
                    return None
                if buf[self.left:need] != b"\r\n":
                    raise BadRequest(400, "bad chunk terminator")
                self.parts.append(bytes(buf[: self.left]))
                del buf[:need]
                self.left = -1
                continue
            idx = buf.find(b"\r\n")
            if idx < 0:
                if len(buf) > MAX_LINE_BYTES:
                    raise BadRequest(400, "line too long")
                return None
            line = bytes(buf[:idx])
            del buf[: idx + 2]
            if self.trailers:  # trailer fields are ignored; an empty line ends the body
                if not line:
                    return b"".join(self.parts)
                continue
            size_text = line.split(b";", 1)[0].strip()
            if not size_text or len(size_text) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in size_text):
                raise BadRequest(400, "bad chunk size")
            size = int(size_text, 16)
            if size == 0:
                self.trailers = True
                continue
            self.total += size
            if self.total > self.limit:
                raise BadRequest(413, _too_large(self.limit), "PayloadTooLarge")
            self.left = size


# Connection states. READ: waiting for (the rest of) a request, owned by epoll while armed there, else by
# the handler thread epoll woke for it; RUN: its request runs in that thread; LINGER: answered with an
# error, the rest of the upload is swallowed; CLOSED.
READ, RUN, LINGER, CLOSED = 0, 1, 2, 3


class Connection:
    """One client connection. Exactly one thread owns it at a time (see the states above)."""

    __slots__ = ("active", "body", "buf", "busy", "call", "deadline", "fd", "head_only", "linger_until", "lock",
                 "request", "sock", "state", "swallowed", "timed_out")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.buf = bytearray()
        self.state = READ
        self.lock = threading.Lock()
        #: True from the first byte of a request until its response is sent (the drain waits for these).
        self.busy = False
        #: monotonic time of the last bytes received or sent (idle keep-alive connections close after a while).
        self.active = time.monotonic()
        #: monotonic deadline of the running sync handler (0: none running).
        self.deadline = 0.0
        #: the call whose handler runs: the watchdog's 504 carries the lines it wrote
        self.call: rt.Call | None = None
        #: The watchdog answered 504; the handler thread still runs.
        self.timed_out = False
        self.head_only = False
        #: the request whose head is parsed and whose body is still arriving
        self.request: Request | None = None
        self.body: FixedBody | ChunkedBody | None = None
        self.linger_until = 0.0
        self.swallowed = 0

    def send_all(self, data: bytes) -> None:
        """Send everything from a handler thread, waiting while the client is slow to read (the socket is
        blocking, with a kernel send timeout of IDLE_TIMEOUT_SEC); raises OSError when it is gone or stalled."""
        self.sock.sendall(data)
        self.active = time.monotonic()

    def send_now(self, data: bytes) -> bool:
        """Send a small answer without waiting (the event loop, the watchdog); False unless all of it went out."""
        try:
            return self.sock.send(data, socket.MSG_DONTWAIT) == len(data)
        except OSError:
            return False


class _Worker:
    """One handler thread; ``since`` (0: not in a handler) and ``conn`` let the watchdog see what it runs, ``wake``
    is the lock it sleeps on while parked (held while it runs; released once to wake it)."""

    __slots__ = ("conn", "since", "tid", "wake")

    def __init__(self) -> None:
        self.since = 0.0
        self.tid = 0
        self.conn: Connection | None = None
        self.wake = threading.Lock()
        self.wake.acquire()


class HandlerThreads:
    """The bounded set of threads that serve ready connections (SLESS_HANDLER_THREADS, SLESS_MAX_HANDLER_THREADS).

    One thread at a time (the poller) waits in epoll_wait; it takes up to POLL_EVENTS ready connections at
    once, keeps the first and queues the rest in ``ready``, and serves them itself, one after the other:
    read, parse, run the handler inline, answer, re-arm, then the next queued one, and back to epoll_wait
    once the queue is empty. A request thus wakes no thread at all under load (the poller is already
    running) and one when idle, and only one thread holds the GIL: no hand-off between an I/O thread and a
    handler thread, no convoy of threads each releasing the GIL at every recv and send (what made a pool of
    32 threads all waiting in epoll_wait slow at the tail: every ready connection woke a thread of its
    own, and at 32 connections each request cost 3.6 futex calls of GIL hand-offs; now 0.06). The other
    threads are parked, each on a lock of its own, and cost nothing.

    The watchdog (``balance``, every BALANCE_SEC while a handler runs) wakes parked threads, or starts new
    ones, when requests wait, none was served since its last look and no thread polls, i.e. every thread
    is inside a handler:
    - when the thread that took the latest request sleeps in a handler that blocks (``time.sleep``, a
      database, an upstream call: see ``_blocked``), one thread per waiting request, up to ``max_size``, so
      sleeping handlers run side by side as with a thread per connection (a thousand sleeping calls get a
      thousand threads within milliseconds, not one more every STUCK_SEC);
    - otherwise the handlers compute: after STUCK_SEC, one more thread at a time up to ``size`` (more
      threads would only contend for the GIL), so a long CPU-bound handler delays the others by STUCK_SEC
      at most, and CPU-bound handlers never push the pool past ``size``.
    Threads beyond ``size`` end after WORKER_IDLE_SEC parked. EPOLLEXCLUSIVE cannot be combined with
    EPOLLONESHOT (which gives a connection to one thread at a time), and exclusive waiters on one epoll
    still wake one thread per ready connection: hence one poller and a queue.
    """

    def __init__(self, serve: Callable[[_Worker, int], None], epoll: select.epoll, size: int,
                 max_size: int) -> None:
        self.serve = serve
        self.epoll = epoll
        self.size = size
        self.max_size = max(size, max_size)
        #: guards ``workers``, ``parked`` and ``waking``
        self.lock = threading.Lock()
        self.workers: set[_Worker] = set()
        #: parked threads, the most recently parked last (woken first: its stack is still in the cache)
        self.parked: list[_Worker] = []
        #: threads woken by ``balance`` that have not yet taken work
        self.waking = 0
        #: connections the poller took from epoll and has not served yet (appended by the poller only)
        self.ready: collections.deque[int] = collections.deque()
        #: held by the thread waiting in epoll_wait
        self.poller = threading.Lock()
        #: set by the poller when it finds the watchdog resting (see ``rest``)
        self.nudge = threading.Event()
        self.resting = False
        self.spawn_failed_logged = -10.0
        #: whether connections are ready in the epoll (poll, not select: no FD_SETSIZE limit)
        self.pending = select.poll()
        self.pending.register(epoll.fileno(), select.POLLIN)
        #: (monotonic, process CPU time) at the last ``balance``; since when requests wait with no poller
        self.mark = (time.monotonic(), time.process_time())
        self.waiting_since = 0.0
        #: the thread that took the latest request: the one the queue waits for
        self.taker: _Worker | None = None
        #: requests served (each thread adds its own; a lost update only delays a balance by one look)
        self.served = 0
        self.last_served = 0

    def start(self) -> None:
        with self.lock:
            self._spawn()

    def _spawn(self) -> bool:
        """Start one thread (the lock is held); False when the system refuses (a memory or thread limit):
        requests then wait for the running ones."""
        worker = _Worker()
        self.workers.add(worker)
        try:
            threading.Thread(target=self._work, args=(worker,), name="sless-handler", daemon=True).start()
        except RuntimeError as exc:  # "can't start new thread"
            self.workers.discard(worker)
            now = time.monotonic()
            if now >= self.spawn_failed_logged + 10:
                self.spawn_failed_logged = now
                rt.log(f"cannot start a handler thread ({exc}); {len(self.workers)} running")
            return False
        return True

    def _work(self, worker: _Worker) -> None:
        worker.tid = threading.get_native_id()
        ready = self.ready
        take = ready.popleft
        serve = self.serve
        while True:
            if ready:
                try:
                    fd = take()
                except IndexError:  # another thread took the last one
                    continue
            else:
                fd = self._poll()
                if fd < 0:
                    if fd == _PARK and not self._park(worker):
                        return
                    continue
            self.taker = worker
            try:
                serve(worker, fd)
            except Exception as exc:  # a bug in the server itself: keep the thread
                rt.log_exception("request failed", exc)
            worker.since = 0.0
            worker.conn = None
            self.served += 1

    def _poll(self) -> int:
        """Become the poller and wait for ready connections: the first one's fd (the rest queued), _AGAIN when
        there is queued work after all, or _PARK when another thread polls."""
        if not self.poller.acquire(False):
            return _PARK
        try:
            if self.ready:
                return _AGAIN
            events = self.epoll.poll(-1, POLL_EVENTS)
        except OSError:
            return _AGAIN
        finally:
            self.poller.release()
        if self.resting:
            self.resting = False
            self.nudge.set()
        if not events:
            return _AGAIN
        if len(events) > 1:
            self.ready.extend([fd for fd, _ in events[1:]])
        return int(events[0][0])

    def _park(self, worker: _Worker) -> bool:
        """Sleep until ``balance`` wakes this thread; False when it is to end (idle beyond ``size``)."""
        with self.lock:
            if self.ready or not self.poller.locked():
                return True  # work came, or the poller left: try again
            self.parked.append(worker)
            extra = len(self.workers) > self.size
        woken = worker.wake.acquire(timeout=WORKER_IDLE_SEC) if extra else worker.wake.acquire()
        with self.lock:
            if not woken:
                if worker in self.parked:
                    self.parked.remove(worker)
                    if len(self.workers) > self.size:
                        self.workers.discard(worker)
                        return False
                    return True
                worker.wake.acquire()  # woken just as the wait ended: take the wake-up
            self.waking -= 1
        return True

    def busy(self) -> bool:
        """Whether a thread is in a handler (or on its way to one): the watchdog then balances often."""
        return len(self.workers) - len(self.parked) - (1 if self.poller.locked() else 0) > 0

    def balance(self, now: float) -> None:
        """Wake or start threads when requests wait while every thread is in a handler (class docstring)."""
        cpu = time.process_time()
        then, cpu_then = self.mark
        self.mark = (now, cpu)
        served, self.last_served = self.last_served, self.served
        if self.poller.locked() or served != self.last_served or not (self.ready or self.pending.poll(0)):
            self.waiting_since = 0.0  # a thread waits in epoll, or requests are being served, or none waits
            return
        if not self.waiting_since:
            self.waiting_since = now  # a thread may be on its way back to epoll: look again next time
            return
        blocked = _blocked(self.taker, cpu - cpu_then < BLOCKED_SHARE * (now - then))
        if not blocked and now - self.waiting_since < STUCK_SEC:
            return
        with self.lock:
            if self.waking:
                return  # threads woken last time have not taken their work yet
            active = len(self.workers) - len(self.parked)
            room = (self.max_size if blocked else self.size) - active
            wanted = min(len(self.ready) + 1 if blocked else 1, room)
            while wanted > 0 and self.parked:
                self.parked.pop().wake.release()
                self.waking += 1
                wanted -= 1
            while wanted > 0 and len(self.workers) < self.max_size and self._spawn():
                wanted -= 1
        self.waiting_since = now


def _blocked(worker: _Worker | None, idle: bool) -> bool:
    """Whether the thread that took the latest request sleeps in a handler that blocks.

    A thread that runs or waits for a CPU (state R in ``/proc/self/task/<tid>/stat``: on a busy machine a
    thread serving requests may wait for one for milliseconds, even inside a system call) does not. Of a
    sleeping one, its system call says (``.../syscall``): a futex is the GIL, a lock, or a wait for the async
    loop or a stream's producer: blocked only while the process is ``idle`` (using little CPU), else it
    waits for the GIL another thread holds; any other call (sleep, recv, poll, connect) is a handler that
    waits. Unreadable: ``idle`` decides.
    """
    if worker is None or not worker.tid:
        return idle
    task = f"/proc/self/task/{worker.tid}/"
    try:
        stat = _read(task + "stat")
        if stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] == b"R":
            return False
        word = _read(task + "syscall").split(b" ", 1)[0]
    except (OSError, ValueError):
        return idle
    if not word.isdigit():
        return False  # running, or not in a system call ("-1 ...")
    return idle if int(word) == _SYS_FUTEX else True


def _read(path: str) -> bytes:
    """A small /proc file, without Python's buffered file objects (the watchdog reads them every 2 ms)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 512)
    finally:
        os.close(fd)


class Server:
    """Accepts connections and runs the handler; see the module docstring."""

    def __init__(self, config: rt.Config, handler: rt.Handler, listener: socket.socket | None = None) -> None:
        self.config = config
        self.handler = handler
        self.is_async = _is_coroutine_function(handler)
        #: every open connection by file descriptor; an entry is removed before its socket is closed
        self.connections: dict[int, Connection] = {}
        self.lingering: set[Connection] = set()
        self.draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_lock = threading.Lock()
        #: sync handler threads still running after their 504 (Python cannot stop a thread)
        self.abandoned = 0
        self._abandoned_lock = threading.Lock()
        self.exit_code = 0
        #: The tagging streams in front of sys.stdout/sys.stderr (see sless_runtime.TaggedStream).
        self.tagged = [s for s in (sys.stdout, sys.stderr) if isinstance(s, rt.TaggedStream)]
        #: the connections waiting for bytes (EPOLLONESHOT), waited on by the idle handler threads
        self.conn_epoll = select.epoll()
        #: the listening socket and the signal wake-up, waited on by the main thread
        self.main_epoll = select.epoll()
        self.pool = HandlerThreads(self._serve_fd, self.conn_epoll, config.handler_threads,
                                   config.max_handler_threads)
        self.listener = listener if listener is not None else listen(config.host, config.port)
        self._accept_paused_until = 0.0

    # ------------------------------------------------------------------ life cycle

    def serve(self, ready_fd: int | None = None) -> None:
        """Serve until SIGTERM/SIGINT, then drain and exit 0 (never returns).

        ``ready_fd``: told (one byte, then closed) once connections are accepted: the supervisor waits for it
        instead of polling the health endpoint.
        """
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        threading.Thread(target=self._watchdog, name="sless-watchdog", daemon=True).start()
        self.pool.start()
        host, port = self.listener.getsockname()[:2]
        rt.log(f"python runtime listening on {host}:{port}, handler {self.config.entrypoint}")
        # The kernel may deliver SIGTERM to any thread, and Python runs its handler only when the main
        # thread executes bytecode: the wakeup fd makes the signal wake the main thread's poll instead.
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        self.listener.setblocking(False)
        self.main_epoll.register(self.listener.fileno(), select.EPOLLIN)
        self.main_epoll.register(wake_r.fileno(), select.EPOLLIN)
        if ready_fd is not None:
            signal_ready(ready_fd)
            with contextlib.suppress(OSError):
                os.close(ready_fd)
        self._main_loop(wake_r)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(self.exit_code)

    def _main_loop(self, wake_r: socket.socket) -> None:
        """The main thread: accept connections, time out idle ones, notice signals; return when drained."""
        listen_fd, wake_fd = self.listener.fileno(), wake_r.fileno()
        connections = self.connections
        next_sweep = time.monotonic() + 1.0
        drain_deadline = listen_until = 0.0
        while True:
            timeout = 0.02 if self.draining else (0.1 if self.lingering or self._accept_paused_until else 1.0)
            for fd, _ in self.main_epoll.poll(timeout):
                if fd == listen_fd:
                    self._accept()
                elif fd == wake_fd:
                    with contextlib.suppress(OSError):
                        wake_r.recv(4096)
            now = time.monotonic()
            if self.draining:
                if not drain_deadline:
                    drain_deadline = now + self.config.drain_sec
                    listen_until = now + min(self.config.drain_listen_sec, self.config.drain_sec)
                    self._close_idle()
                if listen_until and now >= listen_until:
                    listen_until = 0.0
                    self._stop_listening()
                if not listen_until and not self._in_flight():
                    return
                if now >= drain_deadline:
                    rt.log(f"drain deadline of {rt.format_seconds(self.config.drain_sec)}s reached; exiting")
                    return
            if self.lingering:
                for conn in list(self.lingering):
                    if now >= conn.linger_until:
                        self.lingering.discard(conn)
                        _shutdown(conn.sock)  # wakes the loop with EOF, which closes it
            if self._accept_paused_until and now >= self._accept_paused_until and self.listener.fileno() != -1:
                self._accept_paused_until = 0.0
                self.main_epoll.register(listen_fd, select.EPOLLIN)
            if now >= next_sweep:
                next_sweep = now + 1.0
                idle_since = now - IDLE_TIMEOUT_SEC
                for conn in list(connections.values()):
                    if conn.state == READ and conn.active < idle_since:
                        _shutdown(conn.sock)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.draining = True

    def _accept(self) -> None:
        for _ in range(256):  # then let the loop serve the connections it has
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: keep serving the connections we have, retry in 0.1 s
                rt.log(f"accept failed: {exc}")
                self.main_epoll.unregister(self.listener.fileno())
                self._accept_paused_until = time.monotonic() + 0.1
                return
            # Blocking, with a kernel send timeout (no poll() per call, unlike settimeout): reads pass
            # MSG_DONTWAIT (epoll says when to read), while a handler thread may wait in send.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _SEND_TIMEOUT)
            conn = Connection(sock)
            self.connections[conn.fd] = conn
            self.conn_epoll.register(conn.fd, _ARMED)

    def _stop_listening(self) -> None:
        """Refuse new connections from now on (those already in the backlog are taken: closing the listener
        would reset them), and close the idle ones."""
        if not self._accept_paused_until:
            self._accept()
        if not self._accept_paused_until:  # (a failed accept has paused it: unregistered already)
            self.main_epoll.unregister(self.listener.fileno())
        self._accept_paused_until = 0.0
        self.listener.close()
        self._close_idle()

    def _close_idle(self) -> None:
        """Close the connections waiting for a request; one whose request arrived just now is served."""
        for conn in list(self.connections.values()):
            if conn.state == READ and not conn.buf and not conn.busy:
                if _has_pending_input(conn.sock):
                    conn.busy = True
                else:
                    _shutdown(conn.sock)

    def _in_flight(self) -> bool:
        return any((c.state == RUN and not c.timed_out) or (c.state == READ and c.busy)
                   for c in list(self.connections.values()))

    def _close(self, conn: Connection) -> None:
        """Close a connection this thread owns (its entry goes first: the fd number may be reused at once)."""
        if self.connections.get(conn.fd) is conn:
            del self.connections[conn.fd]
        self.lingering.discard(conn)
        conn.state = CLOSED
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _rearm(self, conn: Connection) -> None:
        """Put the connection back in epoll: one idle handler thread is woken once bytes (or EOF) arrive."""
        try:
            self.conn_epoll.modify(conn.fd, _ARMED)
        except OSError:
            self._close(conn)

    # ------------------------------------------------------------------ reading and running requests

    def _serve_fd(self, worker: _Worker, fd: int) -> None:
        """Serve a connection epoll reported ready (in a handler thread, which now owns it)."""
        conn = self.connections.get(fd)
        if conn is None:
            return
        if conn.state == LINGER:
            self._swallow(conn)
            return
        sock = conn.sock
        for _ in range(READS_PER_EVENT):  # then rearm: other connections get their turn
            try:
                data = sock.recv(RECV_SIZE, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._close(conn)
                return
            if not data:  # EOF: the client is gone (a half-closed client has had its buffered requests)
                self._close(conn)
                return
            conn.buf += data
            conn.active = time.monotonic()
            request = self._advance(conn)
            if request is True:
                return
            if request is not False:
                self._run(worker, conn, request)
                return
        self._rearm(conn)

    def _advance(self, conn: Connection) -> Request | bool:
        """Act on what is buffered: the next complete request (to run), True once the connection is
        handed on (linger, closed), False when it needs more bytes (the caller rearms it)."""
        while True:
            try:
                request = self._next_request(conn)
            except BadRequest as exc:
                self._reject(conn, exc.status, str(exc), exc.type)
                return True
            if request is None:
                return False
            path = request.path
            if path.startswith("/_/"):  # the platform's own endpoints: no handler, no event
                keep_alive = request.keep_alive and not self.draining
                if not conn.send_now(serialize(_reserved(request.method, path), keep_alive, conn.head_only,
                                               request.http10)) or not keep_alive:
                    self._close(conn)
                    return True
                conn.busy = False
                continue
            conn.state = RUN
            return request

    def _next_request(self, conn: Connection) -> Request | None:
        """The next complete request in the buffer, or None while bytes are missing; raises BadRequest."""
        buf = conn.buf
        request = conn.request
        if request is None:
            while buf[:2] == b"\r\n":  # stray CRLFs between requests are allowed (RFC 9112 2.2)
                del buf[:2]
            if not buf:
                return None
            conn.busy = True
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise BadRequest(431, "request header too large", "HeaderTooLarge")
                return None
            if end > MAX_HEAD_BYTES:
                raise BadRequest(431, "request header too large", "HeaderTooLarge")
            head = bytes(buf[:end])
            del buf[: end + 4]
            method, target, http10, headers = _parse_head(head)
            conn.head_only = method == "HEAD"
            connection = headers.get("connection")
            keep_alive = not http10 if connection is None else _keep_alive(http10, connection)
            if "transfer-encoding" in headers and "content-length" in headers:
                keep_alive = False
            request = Request(method, target, http10, headers, keep_alive)
            if "content-length" not in headers and "transfer-encoding" not in headers:
                return request  # no body: the common case, without a call
            conn.body = self._body_framing(headers)
            if conn.body is None:
                return request
            conn.request = request
            if headers.get("expect", "").lower() == "100-continue" and not buf:
                conn.send_now(b"HTTP/1.1 100 Continue\r\n\r\n")
        assert conn.body is not None
        body = conn.body.take(buf)
        if body is None:
            return None
        request.body = body
        conn.request = None
        conn.body = None
        return request

    def _body_framing(self, headers: dict[str, str]) -> FixedBody | ChunkedBody | None:
        """How the body is framed (None: no body); raises BadRequest for bad or too large bodies."""
        limit = self.config.max_body_bytes
        te = headers.get("transfer-encoding")
        if te is not None:
            if te.rsplit(",", 1)[-1].strip().lower() != "chunked":
                raise BadRequest(501, f"unsupported transfer-encoding {te!r}", "NotImplemented")
            return ChunkedBody(limit)
        cl = headers.get("content-length")
        if cl is None:
            return None
        length = _content_length(cl)
        if length > limit:
            raise BadRequest(413, _too_large(limit), "PayloadTooLarge")
        return FixedBody(length) if length else None

    def _reject(self, conn: Connection, status: int, message: str, type_: str) -> None:
        """Answer a request we will not run, then close without resetting the connection: for a moment,
        swallow what the client is still sending (closing with unread data would send a TCP reset that can
        destroy our answer in flight)."""
        conn.send_now(serialize(rt.error_response(status, message, type_), False, conn.head_only))
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.buf.clear()
        conn.busy = False
        conn.state = LINGER
        conn.linger_until = time.monotonic() + LINGER_SEC
        self.lingering.add(conn)
        self._rearm(conn)

    def _swallow(self, conn: Connection) -> None:
        while True:
            try:
                data = conn.sock.recv(RECV_SIZE, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data = b""
            conn.swallowed += len(data)
            if not data or conn.swallowed >= 16 * RECV_SIZE or time.monotonic() >= conn.linger_until:
                self._close(conn)
                return
        self._rearm(conn)

    # ------------------------------------------------------------------ running requests (handler threads)

    def _run(self, worker: _Worker, conn: Connection, request: Request) -> None:
        """Run a request's handler in this thread and answer it (and any pipelined one), then put the
        connection back in epoll."""
        worker.conn = conn
        while True:
            worker.since = time.monotonic()
            if not self._answer(conn, request):
                return
            worker.since = 0.0
            if not conn.buf:  # the connection back in epoll (_rearm, inline: every request passes here)
                if self.draining and not _has_pending_input(conn.sock):
                    # SIGTERM came while this answer went out, after the main thread closed the idle ones: this
                    # connection is idle now, so it closes too (else it would wait for the end of the drain)
                    self._close(conn)
                    return
                try:
                    self.conn_epoll.modify(conn.fd, _ARMED)
                except OSError:
                    self._close(conn)
                return
            nxt = self._advance(conn)  # a pipelined request may be buffered already
            if nxt is False:
                self._rearm(conn)
                return
            if nxt is True:
                return
            request = nxt

    def _answer(self, conn: Connection, request: Request) -> bool:
        """Run the handler for one request and write its answer; True when the connection stays open."""
        headers = request.headers
        if "upgrade" in headers and sless_ws.is_upgrade(headers):
            self._websocket(conn, request)
            self._close(conn)  # the connection was the WebSocket's: it ends with it
            return False
        event = rt.build_event(request.method, request.path, request.query, headers, request.body)
        request.body = b""  # the event has it; the call may outlive the answer (a thread the handler started)
        request.call_id = rt.call_id_from(headers.get("x-request-id"))
        request.capturing = True
        conn.call = request
        token = rt.CALL.set(request)
        began = time.perf_counter()
        maybe = None
        try:
            maybe = self._invoke(conn, event)
        finally:
            rt.CALL.reset(token)
            conn.call = None
            if maybe is None or maybe.stream is None:  # (_end_call, inline) a stream's call goes on with it
                for stream in self.tagged:
                    stream.end_call(request)
        if maybe is None:  # timed out: the watchdog answered and shut the connection down
            self._close(conn)
            return False
        resp = maybe
        headers_out = resp.headers
        if len(headers_out) > 1 or (headers_out and headers_out[0][0] != "Content-Type"):  # the handler's own
            resp.headers = [h for h in resp.headers if h[0].lower() not in rt.RUNTIME_HEADERS]
        resp.headers.append((rt.HANDLER_MS_HEADER, f"{(time.perf_counter() - began) * 1000:.3f}"))
        keep_alive = request.keep_alive and not self.draining
        try:
            if resp.stream is not None:
                keep_alive = self._send_stream(conn, resp, keep_alive, request.http10, request)
            else:  # the one place answers are written: the whole of it in one send (no Nagle stall)
                if request.output is None:  # the call wrote nothing (take_output, inline: nothing to build)
                    request.capturing = False
                else:
                    _add_output(resp, request)
                conn.sock.sendall(serialize(resp, keep_alive, conn.head_only, request.http10))
        except OSError:
            keep_alive = False
        if not keep_alive:
            self._close(conn)
            return False
        conn.busy = False
        conn.state = READ
        return True

    def _websocket(self, conn: Connection, request: Request) -> None:
        """An upgrade request: sless_ws answers it and runs the function's ``websocket`` in this thread (its
        lines are tagged, not kept: a WebSocket's answer carries no X-Sless-Output)."""
        event = rt.build_event(request.method, request.path, request.query, request.headers, b"")
        request.call_id = rt.call_id_from(request.headers.get("x-request-id"))
        token = rt.CALL.set(request)
        try:
            sless_ws.serve(conn.sock, bytes(conn.buf), self.handler, request.headers, event, self.config,
                           lambda r: serialize(r, False, False))
        except OSError:
            pass  # the client went away
        finally:
            rt.CALL.reset(token)
            self._end_call(request)

    def _end_call(self, call: rt.Call) -> None:
        """The call is over: what it left without a newline is written (and kept, while its answer is not out)."""
        for stream in self.tagged:
            stream.end_call(call)

    def _send_stream(self, conn: Connection, resp: rt.Response, keep_alive: bool, http10: bool,
                     call: Request) -> bool:
        """A streamed result: sless_stream writes it from this thread; a cut stream raises OSError (closed).
        The head carries the lines written until it goes out; the call ends with the stream."""

        def failed(answer: rt.Response) -> bytes:  # before the head: the call is over, its lines go with it
            self._end_call(call)
            _add_output(answer, call)
            return serialize(answer, keep_alive, conn.head_only, http10)

        try:
            return sless_stream.send_stream(
                conn.send_all, resp, keep_alive, conn.head_only, http10, _clock.date(), _status_line,
                self._event_loop, self.config.timeout_sec, failed, lambda: rt.take_output(call))
        finally:
            self._end_call(call)

    def _invoke(self, conn: Connection, event: dict[str, Any]) -> rt.Response | None:
        """Run the handler; the response, or None when the watchdog already answered 504."""
        timeout = self.config.timeout_sec
        if self.is_async:
            resp = self._run_async(self.handler(event), timeout)
            conn.active = time.monotonic()  # what the idle sweep reads (the recv set it before)
            return resp
        conn.deadline = time.monotonic() + timeout
        try:
            result = self.handler(event)
        except BaseException as exc:  # SystemExit from a handler must not end the thread either
            conn.active = time.monotonic()
            if self._disarm(conn):
                self._release()
                return None
            rt.log_exception(f"handler failed ({event['_method']} {event['_path']})", exc)
            return rt.exception_response(exc, self.config)
        now = conn.active = time.monotonic()
        with conn.lock:  # stop the watchdog for this request (_disarm, inline: every request passes here)
            remaining = conn.deadline - now
            conn.deadline = 0.0
            timed_out = conn.timed_out
        if timed_out:  # the watchdog answered 504 already
            self._release()
            return None
        if hasattr(type(result), "__await__"):  # e.g. a sync wrapper around an async function
            return self._run_async(result, max(0.001, remaining))
        try:
            return rt.encode_result(result)
        except rt.InvalidResponse as exc:
            rt.log(f"bad handler result: {exc}")
            return rt.exception_response(exc)

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
        """Answer 504 for sync handlers that overran their deadline (every ``interval``); balance the pool
        (every BALANCE_SEC while a handler runs, so a handler that blocks holds up the requests behind it for
        a few milliseconds; while none runs the watchdog rests until the poller takes a request)."""
        interval = min(0.05, max(0.005, self.config.timeout_sec / 20))
        pool = self.pool
        next_scan = quiet_until = time.monotonic()
        while True:
            now = time.monotonic()
            if pool.busy():
                quiet_until = now + REST_AFTER_SEC
            if now < quiet_until:
                time.sleep(BALANCE_SEC)
            else:
                pool.resting = True
                pool.nudge.wait(interval)
                pool.nudge.clear()
                pool.resting = False
            now = time.monotonic()
            if now >= next_scan:
                next_scan = now + interval
                for worker in list(pool.workers):
                    conn = worker.conn
                    if conn is not None and conn.deadline and now >= conn.deadline:
                        self._expire(conn, now)
            pool.balance(now)

    def _expire(self, conn: Connection, now: float) -> None:
        message = rt.timeout_message(self.config.timeout_sec)
        with conn.lock:
            if not conn.deadline or now < conn.deadline:
                return  # finished in the meantime
            conn.deadline = 0.0
            conn.timed_out = True
            with contextlib.suppress(OSError):
                conn.send_now(self._timeout_answer(conn, message))
            _shutdown(conn.sock)
        rt.log(f"{message}; the handler thread keeps running until it returns")
        self._abandon()

    def _timeout_answer(self, conn: Connection, message: str) -> bytes:
        """The watchdog's 504, with the lines the handler wrote until now (it keeps running) while the answer
        stays small enough to go out in one send that does not wait (else without them)."""
        resp = rt.error_response(504, message, "Timeout")
        data = serialize(resp, False, conn.head_only)
        call = conn.call
        if call is not None:
            output = rt.take_output(call)
            if output is not None and len(data) + len(output) <= MAX_UNWAITED_ANSWER_BYTES:
                resp.headers.append((rt.OUTPUT_HEADER, output))
                data = serialize(resp, False, conn.head_only)
        return data

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
            os.kill(os.getpid(), signal.SIGTERM)  # wakes the event loop like a real SIGTERM

    def _release(self) -> None:
        with self._abandoned_lock:
            self.abandoned -= 1


def _add_output(resp: rt.Response, call: rt.Call) -> None:
    """The answer carries the lines its call wrote until now in X-Sless-Output (none: no header)."""
    output = rt.take_output(call)
    if output is not None:
        resp.headers.append((rt.OUTPUT_HEADER, output))


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


def listen(host: str, port: int) -> socket.socket:
    """The server's listening socket."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4096)
    return sock


def take_ready_fd() -> int | None:
    """The descriptor named by SLESS_READY_FD (removed from the environment: the handler has no use for it)."""
    raw = os.environ.pop("SLESS_READY_FD", "").strip()
    return int(raw) if raw.isdigit() else None


def signal_ready(fd: int) -> None:
    """One byte on the readiness descriptor; a supervisor that stopped listening is no reason to fail."""
    with contextlib.suppress(OSError):
        os.write(fd, b"r")


def _read_claim() -> dict[str, Any] | None:
    """The claim on stdin, up to EOF; None when stdin closed without one (the spare is not wanted)."""
    import json

    chunks = []
    while chunk := os.read(0, 65536):
        chunks.append(chunk)
    data = b"".join(chunks)
    if not data:
        return None
    claim = json.loads(data)
    if not isinstance(claim, dict):
        raise ValueError("the claim is not a JSON object")
    return claim


def _write_secret_files(folder: str, files: list[list[str]]) -> None:
    """The function's secrets referenced as files, into FOLDER of the private /tmp, readable by this uid only."""
    for name, _ in files:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"bad secret file name {name!r}")
    os.mkdir(folder, 0o700)
    for name, hex_content in files:
        fd = os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
        try:
            view = memoryview(bytes.fromhex(hex_content))
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    os.chmod(folder, 0o500)


def wait_for_claim(ready_fd: int | None) -> socket.socket:
    """A warm spare (SLESS_SPARE=1): listen, say so, then become the function the claim on stdin names.

    The interpreter and this server's modules are loaded already, which is what a cold start spends most of its
    time on. The claim (JSON: ``env``, the function's complete environment, ``cwd``, and ``files``, its secrets
    referenced as files, with ``secrets_dir``) comes over stdin, a pipe only the supervisor holds; no tenant code
    has run before it. Exits 0 when stdin closes without a claim.
    """
    sock = listen(os.environ.get("SLESS_HOST", "127.0.0.1"), int(os.environ.get("PORT", "0")))
    if ready_fd is not None:
        signal_ready(ready_fd)
    try:
        claim = _read_claim()
    except (OSError, ValueError) as exc:
        rt.log(f"bad claim: {exc}")
        sys.exit(1)
    if claim is None:
        os._exit(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in claim.get("env", {}).items()})
    os.environ.pop("SLESS_READY_FD", None)
    try:
        if claim.get("files"):
            _write_secret_files(str(claim["secrets_dir"]), claim["files"])
        os.chdir(str(claim.get("cwd") or "/"))
    except (OSError, ValueError) as exc:
        rt.log(f"cannot take the claim: {exc}")
        sys.exit(1)
    return sock


def _raise_open_files_limit() -> None:
    """Allow as many connections as the hard limit allows (Go's runtime does the same): the usual soft
    limit of 1024 open files would refuse the 1,000th keep-alive connection."""
    import resource

    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def main() -> None:
    """Load the configuration and the handler (exit 1 on failure), then serve forever."""
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    ready_fd = take_ready_fd()
    listener = None
    if os.environ.get("SLESS_SPARE") == "1":
        # what does not depend on the function is done before the claim, off the first call's path
        _raise_open_files_limit()
        threading.stack_size(THREAD_STACK_BYTES)
        listener = wait_for_claim(ready_fd)
    rt.fetch_code()  # the code first: nothing listens (the pod is not Ready) until it is there
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
    _raise_open_files_limit()
    # What the runtime and the handler's imports made lives as long as the process: out of every collection
    # from here on. A full collection walks every tracked object, and a handler that loads a library or a
    # table at import has hundreds of thousands (420,000 took a full collection 870 ms on a busy machine,
    # a stall for every request in flight); frozen, the same collection takes microseconds.
    gc.freeze()
    threading.stack_size(THREAD_STACK_BYTES)  # every thread started from here on (handlers, watchdog, loop)
    try:
        server = Server(config, handler, listener)
    except OSError as exc:
        rt.log(f"cannot listen on {config.host}:{config.port}: {exc}")
        sys.exit(1)
    server.serve(ready_fd)


if __name__ == "__main__":
    main()
