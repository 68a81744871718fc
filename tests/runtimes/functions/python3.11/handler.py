"""Shared runtime test function (Python): one case per contract behaviour.

The case comes from event["case"] when present, else from the last segment of
event["_path"], so the same function serves both HTTP and runner tests.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any


def _case(event: dict[str, Any]) -> str:
    if "case" in event:
        return str(event["case"])
    return str(event.get("_path", "")).rstrip("/").rsplit("/", 1)[-1]


def handle(event: dict[str, Any]) -> Any:
    """Dispatch on the case name; unknown cases echo the event."""
    case = _case(event)
    query = event.get("_query") or {}
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
