"""``sless calls [NAME]`` and ``sless call ID``: the tenant's asynchronous calls, listed and one by one.

Thin mappings onto ``GET .../calls`` and ``GET .../calls/{id}``, as ``sless ls`` and ``sless get NAME`` are for
functions. A queued call (``sless invoke --async``) answers 202 with only an id; these verbs are how its state,
attempts, last error and result are read without curl.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from sless_api.cli.client import Client, emit, table
from sless_api.cli.verbs import one_line

Verb = Callable[[argparse.Namespace, Client], int]

#: the API's call states (``CallState``), offered and checked by argparse before anything is sent
STATES = ("queued", "running", "succeeded", "dead")
FINISHED = ("succeeded", "dead")
CALLS_HEADER = ("ID", "FUNCTION", "STATE", "ATTEMPTS", "CREATED", "RESULT", "ERROR")


def call_row(call: dict[str, Any]) -> tuple[str, ...]:
    """A call as a row: the full id (it is what ``sless call`` takes), the result's status, the last error."""
    result = call.get("result")
    return (call["id"], call["function"], call["state"], str(call["attempts"]), call.get("created_at") or "-",
            str(result["status"]) if result else "-", one_line(call.get("error"), 60) or "-")


def cmd_calls(args: argparse.Namespace, client: Client) -> int:
    """The newest calls first, at most ``--limit`` of them (following the API's pages)."""
    params: dict[str, Any] = {"limit": min(args.limit, 500)}
    if args.name:
        params["function"] = args.name
    if args.state:
        params["state"] = args.state
    items: list[dict[str, Any]] = []
    while True:
        page = client.request("GET", client.ns_path("/calls"), params=params)
        items.extend(page["items"])
        params["cursor"] = page.get("next_cursor")
        if not params["cursor"] or len(items) >= args.limit:
            break
    items = items[: args.limit]
    emit({"items": items}, args.output == "json", table(CALLS_HEADER, (call_row(c) for c in items)))
    return 0


def call_details(call: dict[str, Any]) -> str:
    """``sless call ID``: the call's state and result, one per line, then the result's body."""
    result = call.get("result")
    callback = call.get("callback")
    rows = [("id", call["id"]), ("function", call["function"]), ("request", f"{call['method']} {call['path']}"),
            ("state", call["state"]), ("attempts", call["attempts"]), ("request_id", call.get("request_id")),
            ("created_at", call.get("created_at")), ("finished_at", call.get("finished_at") or "-"),
            ("next_attempt_at", call.get("next_attempt_at") or "-"), ("error", one_line(call.get("error"), 300) or "-"),
            ("callback", f"{callback['url']} ({callback['state']})" if callback else "-"),
            ("result", result_line(result))]
    text = "\n".join(f"{key + ':':16} {value}" for key, value in rows)
    if result and result.get("body"):
        text += "\n\n" + result["body"]
    return text


def result_line(result: dict[str, Any] | None) -> str:
    if not result:
        return "- (none yet)"
    content_type = next((v for k, v in result.get("headers", {}).items() if k.lower() == "content-type"), "")
    words = [f"HTTP {result['status']}", content_type]
    if "body_base64" in result:
        words.append("(binary body: -o json has it in base64)")
    if result.get("truncated"):
        words.append("(body truncated: only its start is kept)")
    return " ".join(w for w in words if w)


def cmd_call(args: argparse.Namespace, client: Client) -> int:
    """One call; with ``--wait``, once it has finished (or the wait is over: then as it stands)."""
    path = client.ns_path(f"/calls/{quote(args.id, safe='')}")  # the API names a bad id, not another route
    deadline = time.monotonic() + args.wait
    while True:
        call: dict[str, Any] = client.request("GET", path)
        if call["state"] in FINISHED or time.monotonic() >= deadline:
            break
        time.sleep(0.3)
    emit(call, args.output == "json", call_details(call))
    if args.wait and call["state"] not in FINISHED:
        print(f"sless: call {args.id} is still {call['state']} after {args.wait:g} s", file=sys.stderr)
        return 1
    return 0


def register(verbs: Any, with_client: Callable[[argparse.ArgumentParser, Verb], None]) -> None:
    """Add ``calls`` and ``call`` to the ``sless`` parser; WITH_CLIENT adds --url/--output/... and binds the verb."""
    calls = verbs.add_parser("calls", help="list asynchronous calls, newest first (all, or one function's)")
    calls.add_argument("name", nargs="?", help="only this function's calls")
    calls.add_argument("--state", choices=STATES, help="only calls in this state (dead: the dead letters)")
    calls.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    with_client(calls, cmd_calls)
    call = verbs.add_parser("call", help="one asynchronous call: its state, attempts, last error and result")
    call.add_argument("id", help="the call's id, as `sless invoke --async` and `sless calls` print it")
    call.add_argument("--wait", type=float, default=0, help="wait up to this many seconds for it to finish")
    with_client(call, cmd_call)
