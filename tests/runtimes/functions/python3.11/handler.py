"""Shared runtime test function (Python): one case per contract behaviour.

The case comes from event["case"] when present, else from the last segment of
event["_path"], so the same function serves both HTTP and runner tests.
"""

from __future__ import annotations

import os
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
