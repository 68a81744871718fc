"""Whether a runtime answers: one ``GET /_/health`` over a fresh loopback connection."""

from __future__ import annotations

import asyncio
import contextlib

HEALTH_PATH = "/_/health"


async def health_ok(port: int, timeout: float) -> bool:
    """One GET /_/health probe; any failure is just "not yet"."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    except (OSError, TimeoutError):
        return False
    try:
        request = f"GET {HEALTH_PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
        writer.write(request.encode())
        line = await asyncio.wait_for(reader.readline(), timeout)
        parts = line.split()
        return len(parts) >= 2 and parts[0].startswith(b"HTTP/1.") and parts[1] == b"200"
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
