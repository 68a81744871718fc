"""Where an invocation's time went, filled in along the call's path and stored with its record.

The invoke proxy opens a :class:`CallTiming` for each upstream exchange in a context variable; the
backend notes a cold start in it (the standalone supervisor, when the call had to wait for a process to
start) without the platform interface carrying timing through every signature. The runtime reports the
handler's own time in the ``X-Sless-Handler-Ms`` response header, and what the call wrote before its answer in
``X-Sless-Output`` (domain.calloutput); the proxy reads and removes both.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import dataclass

#: The response header a runtime sets (runtimes/README.md); the platform's, never shown to a caller.
HANDLER_MS_HEADER = "x-sless-handler-ms"


@dataclass
class CallTiming:
    """Phases of one call, in seconds; ``forwarded`` stays False when no function process was reached."""

    ready: float  # monotonic time the platform had the whole request
    start_sec: float = 0.0
    cold: bool = False
    queue_sec: float | None = None
    handler_ms: float | None = None
    forwarded: bool = False
    #: What the call wrote before its answer, as the runtime sent it (``X-Sless-Output``, checked by the log's
    #: writer, not here on the call's path); None when it wrote nothing.
    output: bytes | None = None


CURRENT: ContextVar[CallTiming | None] = ContextVar("sless_call_timing", default=None)


def note_start(seconds: float) -> None:
    """The current call waited ``seconds`` for a function process to start: it is a cold call."""
    timing = CURRENT.get()
    if timing is not None:
        timing.cold = True
        timing.start_sec += max(0.0, seconds)


def handler_ms(value: str | bytes | None) -> float | None:
    """The runtime's handler time from its header; None when missing or not a sane number."""
    if value is None:
        return None
    try:
        ms = float(value)
    except ValueError:
        return None
    return ms if math.isfinite(ms) and 0 <= ms < 1e9 else None
