"""What both raw Python peers share: the fixed response and the two request-head checks.

Imported by ``raw_asyncio.py`` and ``raw_threaded.py``, so the two ceilings differ only in their I/O model.
"""

from __future__ import annotations

import time
from email.utils import formatdate

BODY = b"ok"


class _Date:
    """The Date header value, formatted at most once a second (as the sless runtime does)."""

    second = 0
    value = b""


def response(close: bool) -> bytes:
    now = int(time.time())
    if now != _Date.second:
        _Date.second, _Date.value = now, formatdate(now, usegmt=True).encode()
    return b"".join((
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nDate: " % len(BODY),
        _Date.value,
        b"\r\nConnection: close\r\n\r\n" if close else b"\r\n\r\n",
        BODY,
    ))


def body_length(head: bytes) -> int:
    """Content-Length of a lower-cased request head (0 without one)."""
    at = head.find(b"\r\ncontent-length:")
    if at < 0:
        return 0
    stop = head.find(b"\r\n", at + 2)
    return int(head[at + 17: stop if stop >= 0 else len(head)])


def wants_close(head: bytes) -> bool:
    if head.split(b"\r\n", 1)[0].endswith(b"/1.0"):
        return b"\r\nconnection: keep-alive" not in head
    return b"\r\nconnection: close" in head
