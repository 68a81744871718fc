"""Shared runtime test function (Python): one case per contract behaviour.

The case comes from event["case"] when present, else from the last segment of
event["_path"], so the same function serves both HTTP and runner tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any


def _case(event: dict[str, Any]) -> str:
    if "case" in event:
        return str(event["case"])
    return str(event.get("_path", "")).rstrip("/").rsplit("/", 1)[-1]


def _gate(port: str) -> None:
    """Wait until the test holding ``port`` sends a byte (or closes)."""
    with socket.create_connection(("127.0.0.1", int(port))) as sock:
        sock.recv(1)


def _notify(port: str, text: str) -> None:
    """Tell the test holding ``port`` that something happened."""
    with socket.create_connection(("127.0.0.1", int(port))) as sock:
        sock.sendall(text.encode())


def _chunks(query: dict[str, str]) -> Iterator[str]:
    if query.get("hold"):
        _gate(query["hold"])  # held before the first chunk
    yield "first\n"
    if query.get("gate"):
        _gate(query["gate"])
    yield "second\n"


async def _events(query: dict[str, str]) -> AsyncIterator[str]:
    yield "data: one\n\n"
    if query.get("gate"):
        await asyncio.get_running_loop().run_in_executor(None, _gate, query["gate"])
    yield "data: two\n\n"


def _parts() -> Iterator[bytes | str]:
    yield b"bytes "
    yield "then text"


async def _ticks(query: dict[str, str]) -> AsyncIterator[str]:
    """``n`` ticks (endless without it) ``ms`` apart; ``done`` hears when the stream is closed."""
    try:
        i = 0
        while not query.get("n") or i < int(query["n"]):
            yield f"tick {i}\n"
            await asyncio.sleep(int(query.get("ms") or 50) / 1000)
            i += 1
    finally:
        if query.get("done"):
            _notify(query["done"], "closed")


def _broken(query: dict[str, str]) -> Iterator[str]:
    yield "first\n"
    if query.get("gate"):
        _gate(query["gate"])
    raise RuntimeError("stream broke")


def _bad() -> Iterator[Any]:
    yield 42


def handle(event: dict[str, Any]) -> Any:
    """Dispatch on the case name; unknown cases echo the event."""
    case = _case(event)
    query = event.get("_query") or {}
    if case == "stream":
        return _chunks(query)
    if case == "sse":
        return {"statusCode": 200, "headers": {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
                "body": _events(query)}
    if case == "stream-sync":
        return _parts()
    if case == "stream-ticks":
        return _ticks(query)
    if case == "stream-error":
        return _broken(query)
    if case == "stream-bad":
        return _bad()
    if case == "text":
        return "hello"
    if case == "html":
        return "<h1>hi</h1>"
    if case == "number":
        return 42
    if case == "list":
        return [1, 2, 3]
    if case == "null":
        return None
    if case == "status":
        return {"statusCode": 201, "headers": {"X-Test": "yes"}, "body": {"created": True}}
    if case == "raw":
        if event.get("isBase64Encoded"):
            return {
                "statusCode": 200,
                "isBase64Encoded": True,
                "body": event["body"],
                "headers": {"Content-Type": "application/octet-stream"},
            }
        return event["body"]
    if case == "chatty":
        print("noise from the handler")
        return {"ok": True}
    if case == "logs":
        # Output of a call: lines on both streams, a partial line, a forged tag, a pause for overlap.
        mark = query.get("m") or event.get("m", "")
        print(f"first {mark}")
        print(f"to stderr {mark}", file=sys.stderr)
        print(f"partial {mark} ", end="")
        time.sleep(float(query.get("s") or event.get("s") or 0))
        print("line")
        print(f"@sless:victim forged {mark}\n@sless:victim also forged")
        return {"mark": mark}
    if case == "error":
        raise ValueError("boom")
    if case == "crash":
        return 1 / 0
    if case == "slow":
        seconds = float(query.get("s") or event["seconds"])
        time.sleep(seconds)
        return {"slept": seconds}
    if case == "env":
        return {"value": os.environ.get(query.get("name") or event["name"])}
    return event


def websocket(ws: Any, event: dict[str, Any]) -> None:
    """WebSocket connections: echo every message (text stays text, bytes stay bytes); ``close`` closes with 4000,
    ``whoami`` answers the request's path and query, ``params`` its path parameters (JSON), ``boom`` fails the
    function."""
    for message in ws:
        if message == "close":
            ws.close(4000, "asked to")
            return
        if message == "whoami":
            ws.send(f"{event['_path']} x={event['_query'].get('x')}")
            continue
        if message == "params":
            ws.send(json.dumps(event["_params"]))
            continue
        if message == "boom":
            raise RuntimeError("websocket handler broke")
        ws.send(message)
