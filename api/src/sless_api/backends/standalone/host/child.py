"""One runtime process the supervisor started, and what is done to it: its output copied to its log (rotated) and
the calls' lines, its readiness awaited, its limits read after a failure, its kill and reaping."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from sless_api.backends.standalone.host.calllogs import LineRouter
from sless_api.backends.standalone.host.process import kill_group
from sless_api.backends.standalone.host.readiness import ReadyPipe
from sless_api.backends.standalone.host.sandbox import Prepared

#: Pause between health probes during a start; a refused connection costs microseconds.
HEALTH_POLL_SEC = 0.005
#: Longest wait for the readiness byte before probing anyway.
READY_WAIT_SEC = 0.5
#: How long a failed call waits for its sandboxed process to exit, to name the limit that killed it.
LIMIT_NOTE_WAIT_SEC = 4.0
#: How much of a process's stderr is kept in memory for error messages.
STDERR_TAIL_BYTES = 4096
#: How long to wait for output pipes to reach EOF after the process exited
#: (a grandchild may hold them open).
PIPE_DRAIN_SEC = 1.0


class ChildLog:
    """Appends a key's process output to one file, rotating it to ``<name>.1`` past ``max_bytes``.

    Writes are synchronous: they are small appends to a local file (page
    cache), cheaper than a thread hop per chunk, and a failing disk must never
    take a function down, so OSErrors are swallowed.
    """

    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._fh: BinaryIO | None = None
        self._size = 0

    def write(self, data: bytes) -> None:
        try:
            if self._fh is None:
                self._open()
            if self._size and self._size + len(data) > self.max_bytes:
                self.close()
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                self._open()
            assert self._fh is not None
            self._fh.write(data)
            self._size += len(data)
        except OSError:
            self.close()

    def note(self, text: str) -> None:
        """A supervisor line (start, exit), marked so it stands out from the function's output."""
        self.write(f"--- sless {time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n".encode())

    def close(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the slot
        self._size = self._fh.tell()


@dataclass(eq=False)
class Child:
    """One running runtime server."""

    proc: asyncio.subprocess.Process
    port: int
    version: str
    started_at: float
    drain_sec: float
    stderr_tail: bytearray = field(default_factory=bytearray)
    readers: list[asyncio.Task[None]] = field(default_factory=list)
    monitor: asyncio.Task[None] | None = None
    healthy: bool = False
    stopping: bool = False
    inflight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    jail: Prepared | None = None
    probe_failures: int = 0
    #: The readiness pipe while it starts (None: the runtime is polled); closed once healthy.
    ready: ReadyPipe | None = None

    def __post_init__(self) -> None:
        self.idle.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        """Usable for new calls: running and not asked to stop."""
        return self.proc.returncode is None and not self.stopping

    def tail(self) -> str:
        return self.stderr_tail.decode("utf-8", errors="replace").strip()

    def exit_note(self) -> str | None:
        """A limit that ended the process (memory, CPU, file size), if one did."""
        return self.jail.exit_note(self.proc.returncode) if self.jail is not None else None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the runtime itself (inside its sandbox, bwrap does not forward signals)."""
        if self.jail is not None:
            self.jail.signal_main(self.proc.pid, sig)
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)


def with_tail(message: str, tail: str) -> str:
    return f"{message}; stderr:\n{tail}" if tail else f"{message} (no stderr output)"


async def pause_between_probes(proc: Child, remaining: float) -> None:
    """Between two health probes of a start: until the readiness byte when one is still to come, else a poll."""
    pipe = proc.ready
    if pipe is not None and not pipe.ended:
        got = await pipe.wait(min(remaining, READY_WAIT_SEC))
        if got is True:
            pipe.ended = True  # one byte is all a runtime says; from here on, poll
        if got is not False:
            return
    await asyncio.sleep(HEALTH_POLL_SEC)


async def pump(stream: asyncio.StreamReader, log: ChildLog, tail: bytearray | None,
                lines: LineRouter | None = None) -> None:
    """Copy a child's output pipe into the log (and the in-memory stderr tail, and the calls' lines)."""
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            if lines is not None:
                lines.finish(time.time())
            return
        log.write(chunk)
        if lines is not None:
            lines.feed(chunk, time.time())
        if tail is not None:
            tail.extend(chunk)
            if len(tail) > STDERR_TAIL_BYTES:
                del tail[: len(tail) - STDERR_TAIL_BYTES]


async def drain_pipes(proc: Child) -> None:
    """Wait (briefly) until the output of an exited process is fully captured."""
    pending = [t for t in proc.readers if not t.done()]
    if pending:
        await asyncio.wait(pending, timeout=PIPE_DRAIN_SEC)


async def kill_child(proc: Child) -> None:
    """SIGKILL the process and everything in its session's process group, and reap it."""
    if proc.proc.returncode is None:
        if proc.jail is not None:
            proc.jail.kill(proc.proc.pid)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(proc.proc.wait()), 1.0)
        kill_group(proc.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            proc.proc.kill()
    await proc.proc.wait()
    if proc.jail is not None:
        await asyncio.to_thread(proc.jail.cleanup)


async def limit_note(proc: Child) -> str | None:
    """After a failed call: whether the sandbox killed the process for a limit (waits briefly for its exit).

    The kernel's kill and the exit's report can lag the broken connection by more than a second on a busy
    host; without the wait the caller gets a bare 502 instead of the limit that was hit.
    """
    if proc.jail is None:
        return None
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(proc.proc.wait()), LIMIT_NOTE_WAIT_SEC)
    return proc.exit_note()
