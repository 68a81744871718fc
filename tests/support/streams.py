"""Clients for streamed answers and WebSockets through ``/fn``: shared by the e2e tests on ``sless up`` and the
real-node tests, which check the same streaming and WebSocket behaviour on the Kubernetes backend.
"""

from __future__ import annotations

import asyncio
import http.client
import urllib.parse
from typing import Any

import aiohttp

from tests.support.platform import Tenant


def open_stream(url: str, request_id: str | None = None) -> tuple[http.client.HTTPConnection, Any]:
    """A GET whose answer is read as it arrives (the response's read1), not buffered whole like requests'."""
    parsed = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    conn.request("GET", parsed.path + (f"?{parsed.query}" if parsed.query else ""),
                 headers={"X-Request-Id": request_id} if request_id else {})
    return conn, conn.getresponse()


def read_until(resp: Any, marker: bytes) -> bytes:
    """What arrived up to and including MARKER; fails if the stream ends first."""
    data = b""
    while marker not in data:
        chunk = resp.read1(65536)
        assert chunk, f"the stream ended before {marker!r}: {data!r}"
        data += chunk
    return data


def ws_url(tenant: Tenant, name: str, path: str = "") -> str:
    """The ws:// URL of NAME's /fn path."""
    return tenant.fn_url(name, path).replace("http://", "ws://")


def exchange(url: str, messages: list[str | bytes], headers: dict[str, str] | None = None,
             request_id: str | None = None) -> tuple[list[str | bytes], int | None]:
    """Send each message, read one answer each, until the server closes: (answers, close code)."""

    async def run() -> tuple[list[str | bytes], int | None]:
        answers: list[str | bytes] = []
        extra = {**(headers or {}), **({"X-Request-Id": request_id} if request_id else {})}
        async with aiohttp.ClientSession() as session, session.ws_connect(
                url, headers=extra, timeout=aiohttp.ClientWSTimeout(ws_close=30)) as ws:
            for message in messages:
                await (ws.send_str(message) if isinstance(message, str) else ws.send_bytes(message))
                reply = await ws.receive(timeout=30)
                if reply.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    break
                answers.append(reply.data)
            else:
                await ws.close()
            return answers, ws.close_code

    return asyncio.run(run())
