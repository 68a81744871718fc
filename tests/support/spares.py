"""What the runtimes' warm-spare tests share: the readiness byte (their ``spawn`` fixture is in
tests/runtimes/conftest.py)."""

from __future__ import annotations

import os
import select
import subprocess

Procs = list[subprocess.Popen[bytes]]


def wait_byte(fd: int, timeout: float = 20.0) -> bytes:
    """What the runtime wrote on its readiness pipe, once it wrote something."""
    readable, _, _ = select.select([fd], [], [], timeout)
    assert readable, "no readiness byte"
    return os.read(fd, 16)
