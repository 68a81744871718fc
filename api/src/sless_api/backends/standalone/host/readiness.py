"""The readiness pipe: a runtime says "listening" with one byte instead of being polled.

The supervisor hands the write end to the child (``SLESS_READY_FD``, see runtimes/README.md) and waits on
the read end in its event loop: no sleep between health probes, so a start costs what the runtime takes and
not that plus up to one polling interval. A runtime that writes nothing (Node, Go) is still polled; EOF means
every holder of the write end is gone, i.e. the process exited.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

#: The variable naming the inherited write end in the child's environment.
READY_FD_ENV = "SLESS_READY_FD"


class ReadyPipe:
    """One child's readiness pipe; the supervisor keeps the read end, the child inherits the write end."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(self.read_fd, False)
        #: True once EOF was seen: nothing will come any more.
        self.ended = False

    def release_write(self) -> None:
        """Close our copy of the write end once the child has its own (so EOF means the child is gone)."""
        fd, self.write_fd = self.write_fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    async def wait(self, timeout: float) -> bool | None:
        """True when a byte came, False on EOF (the child exited), None after ``timeout`` seconds."""
        if self.ended:
            return False
        got = self._read()
        if got is not None:
            return got
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()

        def on_readable() -> None:
            result = self._read()
            if result is not None and not future.done():
                future.set_result(result)

        loop.add_reader(self.read_fd, on_readable)
        try:
            return await asyncio.wait_for(future, max(0.0, timeout))
        except TimeoutError:
            return None
        finally:
            loop.remove_reader(self.read_fd)

    def _read(self) -> bool | None:
        try:
            data = os.read(self.read_fd, 1)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if not data:
            self.ended = True
            return False
        return True

    def close(self) -> None:
        self.release_write()
        fd, self.read_fd = self.read_fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
