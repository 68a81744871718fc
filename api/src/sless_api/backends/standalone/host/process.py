"""What running a child process takes of the OS, in one place: a free loopback port, the child's death with the
platform's (a parent-death signal), and the SIGKILL of what is left of its process group."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import socket
import sys
from collections.abc import Callable


def free_port(exclude: set[int] | frozenset[int] = frozenset()) -> int:
    """A loopback port nothing listens on right now, and not one we handed out already.

    The kernel may give the same ephemeral port to two bind(0) calls in a row
    once the first socket is closed; ``exclude`` keeps two of our own starts
    from racing for one port. Races with other programs are caught later by
    the child failing with "address in use".
    """
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in exclude:
            return port
    raise OSError("no free loopback port found")


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _libc()
_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int) -> None:
    """Ask Linux to send ``sig`` to this process when the thread that forked it dies (preexec use)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(sig))


def _terms_with_platform() -> Callable[[], None] | None:
    """A preexec hook asking Linux to SIGTERM the child when the platform process dies (None off Linux)."""
    if _LIBC is None:
        return None
    return lambda: set_parent_death_signal(signal.SIGTERM)


#: preexec_fn of a runtime started outside a sandbox: it gets SIGTERM when the platform dies
TERM_WITH_PLATFORM = _terms_with_platform()


def kill_group(pgid: int) -> None:
    """SIGKILL what is left of a child's process group (stray grandchildren).

    Linux does not reuse a pid while it still names a process group; once the
    group is empty the number could only name a new group after pids wrapped
    around, which does not happen in the moment between reaping and this call.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
