"""``sless publish QUEUE`` and ``sless dlq ls|show|redrive|purge QUEUE``: a tenant's event queues from the shell.

Thin mappings onto ``POST .../queues/{queue}/messages`` and ``.../queues/{queue}/dead-letters[...]``, so a user
or a script emits events and handles dead letters with only a token, no broker client or account.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from sless_api.cli.client import Client, emit, table
from sless_api.cli.invoke import parse_header, read_body
from sless_api.cli.verbs import one_line

Verb = Callable[[argparse.Namespace, Client], int]
DLQ_HEADER = ("ID", "MESSAGE ID", "KIND", "ATTEMPTS", "STATUS", "FAILED AT", "REASON")


def queue_path(client: Client, queue: str, rest: str = "") -> str:
    return client.ns_path(f"/queues/{quote(queue, safe='')}{rest}")  # a '../' in a name is no other route


def cmd_publish(args: argparse.Namespace, client: Client) -> int:
    body, content_type = read_body(args.data if args.data is not None else "{}")
    headers = {"Content-Type": content_type or "application/json"}
    for text in args.ce:
        parsed = parse_header(text.replace("=", ":", 1))
        if parsed is None:
            args.usage_error(f"--ce expects ATTRIBUTE=VALUE (e.g. type=order.created), not {text!r}")
            return 2  # usage_error exits
        headers[f"ce-{parsed[0].lower()}"] = parsed[1]
    if args.id is not None:
        headers["X-Sless-Message-Id"] = args.id
    answer = client.request("POST", queue_path(client, args.queue, "/messages"), data=body, headers=headers)
    emit(answer, args.output == "json", f"published {answer['message_id']} to {answer['queue']}")
    return 0


def dead_row(item: dict[str, Any]) -> tuple[str, ...]:
    return (item["id"], item.get("message_id") or "-", item["kind"], str(item["attempts"]),
            str(item.get("status") or "-"), item.get("failed_at") or "-", one_line(item.get("reason"), 60) or "-")


def cmd_dlq_ls(args: argparse.Namespace, client: Client) -> int:
    page = client.request("GET", queue_path(client, args.queue, "/dead-letters"), params={"limit": args.limit})
    emit(page, args.output == "json", table(DLQ_HEADER, (dead_row(i) for i in page["items"])))
    if page["more"] and args.output != "json":
        print(f"sless: more dead letters follow these {len(page['items'])} (--limit up to 100)", file=sys.stderr)
    return 0


def cmd_dlq_show(args: argparse.Namespace, client: Client) -> int:
    letter = client.request("GET", queue_path(client, args.queue, f"/dead-letters/{quote(args.id, safe='')}"))
    keys = ("id", "message_id", "kind", "reason", "attempts", "status", "function", "trigger", "published_at",
            "first_seen_at", "failed_at", "content_type", "size")
    text = "\n".join(f"{key + ':':14} {letter.get(key) if letter.get(key) is not None else '-'}" for key in keys)
    if letter.get("headers"):
        text += f"\n{'headers:':14} {json.dumps(letter['headers'])}"
    text += f"\n\n{letter['body']}" + (" (base64)" if letter.get("body_encoding") == "base64" else "")
    emit(letter, args.output == "json", text)
    return 0


def _selection(args: argparse.Namespace) -> dict[str, Any]:
    if bool(args.ids) == args.all:
        args.usage_error("name dead letters by id, or --all (one of the two)")
    return {"all": True} if args.all else {"ids": args.ids}


def cmd_dlq_redrive(args: argparse.Namespace, client: Client) -> int:
    doc = _selection(args)
    if args.to:
        doc["to_queue"] = args.to
    answer = client.request("POST", queue_path(client, args.queue, "/dead-letters/redrive"), json=doc)
    emit(answer, args.output == "json", f"redriven: {answer['redriven']}" + (" (more left: run again)"
                                                                             if answer["more"] else ""))
    return 0


def cmd_dlq_purge(args: argparse.Namespace, client: Client) -> int:
    answer = client.request("POST", queue_path(client, args.queue, "/dead-letters/purge"), json=_selection(args))
    emit(answer, args.output == "json", f"purged: {answer['purged']}" + (" (more left: run again)"
                                                                         if answer["more"] else ""))
    return 0


def register(verbs: Any, with_client: Callable[[argparse.ArgumentParser, Verb], None]) -> None:
    """Add ``publish`` and ``dlq`` to the ``sless`` parser; WITH_CLIENT adds --url/--output/... and binds the verb."""
    publish = verbs.add_parser("publish", help="publish a message to one of the tenant's event queues")
    publish.add_argument("queue", help="the queue an event trigger consumes (its `queue`)")
    publish.add_argument("--data", "-d", metavar="JSON|@FILE|-", help="the message: JSON text, @FILE, - stdin "
                                                                       "(default {})")
    publish.add_argument("--ce", action="append", default=[], metavar="ATTRIBUTE=VALUE",
                         help="a CloudEvents attribute (type=..., source=..., id=..., ...), repeatable")
    publish.add_argument("--id", help="the message id (what deduplication keys on; default: a fresh one)")
    publish.set_defaults(usage_error=publish.error)
    with_client(publish, cmd_publish)
    dlq = verbs.add_parser("dlq", help="an event queue's dead letters: ls, show, redrive, purge")
    actions = dlq.add_subparsers(dest="action", required=True)
    ls = actions.add_parser("ls", help="the oldest dead letters, without their payloads")
    ls.add_argument("queue")
    ls.add_argument("--limit", type=int, default=20, help="1-100 (default 20)")
    with_client(ls, cmd_dlq_ls)
    show = actions.add_parser("show", help="one dead letter with its headers and payload")
    show.add_argument("queue")
    show.add_argument("id")
    with_client(show, cmd_dlq_show)
    for name, verb, help_text in (("redrive", cmd_dlq_redrive, "publish dead letters again and take them out"),
                                  ("purge", cmd_dlq_purge, "drop dead letters for good")):
        action = actions.add_parser(name, help=help_text)
        action.add_argument("queue")
        action.add_argument("ids", nargs="*", help="dead letter ids (as `sless dlq ls` prints them)")
        action.add_argument("--all", action="store_true", help="every dead letter of the queue")
        if name == "redrive":
            action.add_argument("--to", help="another queue of the tenant's to publish them to")
        action.set_defaults(usage_error=action.error)
        with_client(action, verb)
