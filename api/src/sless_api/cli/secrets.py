"""``sless secrets ls|set|rm``: a tenant's secrets from the command line.

Values are given as ``KEY=VALUE``, read from a file (``--from-file KEY=PATH``) or from standard input
(``--stdin KEY``): the last two keep them out of the shell history and the process list. ``set`` writes the
whole secret (keys left out are removed), creating it when it does not exist. Nothing prints a value.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sless_api.cli.client import Client, CliError, emit, table

Verb = Callable[[argparse.Namespace, Client], int]


def register(verbs: Any, with_client: Callable[[argparse.ArgumentParser, Verb], None]) -> None:
    secrets = verbs.add_parser("secrets", help="list, set or remove the tenant's secrets (values are write-only)")
    actions = secrets.add_subparsers(dest="action", required=True)
    with_client(actions.add_parser("ls", help="secret names, keys and versions"), cmd_ls)
    put = actions.add_parser("set", help="create or replace a secret: every key it should hold")
    put.add_argument("name")
    put.add_argument("pairs", nargs="*", metavar="KEY=VALUE")
    put.add_argument("--from-file", action="append", default=[], metavar="KEY=PATH",
                     help="the value of KEY is the content of PATH (UTF-8)")
    put.add_argument("--stdin", metavar="KEY", help="the value of KEY is standard input (a trailing newline dropped)")
    with_client(put, cmd_set)
    rm = actions.add_parser("rm", help="delete a secret (refused while a function uses it)")
    rm.add_argument("name")
    with_client(rm, cmd_rm)


def collect(args: argparse.Namespace) -> dict[str, str]:
    """The secret's data from the arguments; CliError naming the first bad one (never its value)."""
    data: dict[str, str] = {}

    def add(key: str, value: str, source: str) -> None:
        if not key:
            raise CliError(f"{source}: expected KEY=...")
        if key in data:
            raise CliError(f"key {key!r} is given twice")
        data[key] = value

    for number, pair in enumerate(args.pairs, 1):
        key, sep, value = pair.partition("=")
        if not sep:
            raise CliError(f"expected KEY=VALUE: argument {number} after the name has no '='")
        add(key, value, "KEY=VALUE")
    for item in args.from_file:
        key, sep, path = item.partition("=")
        if not sep:
            raise CliError("--from-file expects KEY=PATH")
        try:
            add(key, Path(path).read_text(encoding="utf-8"), "--from-file")
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError(f"--from-file {key}: cannot read {path}: {type(exc).__name__}") from None
    if args.stdin:
        add(args.stdin, sys.stdin.read().removesuffix("\n"), "--stdin")
    if not data:
        raise CliError("give at least one KEY=VALUE, --from-file KEY=PATH or --stdin KEY")
    return data


def cmd_ls(args: argparse.Namespace, client: Client) -> int:
    items = client.items("/secrets")
    rows = table(("NAME", "VERSION", "KEYS"), ((s["name"], f"v{s['version']}", ",".join(s["keys"])) for s in items))
    emit({"items": items}, args.output == "json", rows)
    return 0


def cmd_set(args: argparse.Namespace, client: Client) -> int:
    data = collect(args)
    client.request("POST", client.ns_path("/ensure"))
    path = client.ns_path(f"/secrets/{args.name}")
    current = client.http.get(client.url + path, timeout=60)
    if current.status_code == 404:
        meta = client.request("POST", client.ns_path("/secrets"), json={"name": args.name, "data": data})
    else:
        meta = client.request("PUT", path, json={"data": data})
    emit(meta, args.output == "json", f"{meta['name']}: version {meta['version']}, keys {', '.join(meta['keys'])}")
    return 0


def cmd_rm(args: argparse.Namespace, client: Client) -> int:
    client.request("DELETE", client.ns_path(f"/secrets/{args.name}"))
    print(f"deleted secret {args.name}", file=sys.stderr)
    return 0
