"""The runtimes' output format for one call's lines (runtimes/README.md, "Output of a call").

A runtime writes each line a handler prints while serving a call as ``@sless:<request id> <text>``;
``@sless:- <text>`` and lines without the marker belong to no call. Both backends read a function's
output back with :func:`parse_line`, the standalone supervisor as it pumps a process's pipes, the
Kubernetes backend from a pod's log.
"""

from __future__ import annotations

import re
from datetime import datetime

TAG = "@sless:"
NO_CALL = "-"
#: The ids the platform makes or accepts (sless_api.gateway.requestid): a tag with anything else is no call's.
_CALL_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}")


def parse_line(line: str) -> tuple[str | None, str]:
    """``(request id, text)`` of one output line (without its newline); the id is None for no call."""
    if not line.startswith(TAG):
        return None, line
    ident, sep, text = line[len(TAG):].partition(" ")
    if not sep or ident == NO_CALL or not _CALL_ID.fullmatch(ident):
        return None, line
    return ident, text


def timestamped(line: str) -> tuple[float | None, str]:
    """``2026-01-01T00:00:00.123456789Z text`` (a pod log read with ``timestamps=true``) -> (epoch seconds, text);
    ``(None, line)`` for a line without such a time in front."""
    stamp, sep, text = line.partition(" ")
    if not sep:
        return None, line
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    try:
        return datetime.fromisoformat(whole + "+00:00").timestamp() + float(f"0.{fraction or '0'}"), text
    except ValueError:
        return None, line
