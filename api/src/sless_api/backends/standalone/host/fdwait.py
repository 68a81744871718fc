"""Waiting for a descriptor to become readable, whatever its number.

``select.select`` refuses descriptors numbered 1024 and above (FD_SETSIZE), and a long-running ``sless up`` with
many functions has that many open: poll has no such limit.
"""

from __future__ import annotations

import select


def readable_within(fd: int, timeout: float) -> bool:
    """Whether FD has data, or its end, within TIMEOUT seconds."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(timeout, 0.0) * 1000))
