"""``sless env NAME``, ``sless env set NAME KEY=VALUE...``, ``sless env unset NAME KEY...``: a function's
environment variables.

The API keeps ``env_vars`` as one object that a PATCH replaces whole, so a change reads the function first, edits
its variables and sends them all back; which names and values are allowed is the API's to say (a 400 in one
line). Only the shape of the arguments is checked here: a ``KEY=VALUE`` without ``=`` is a usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn
from urllib.parse import quote

from sless_api.cli.client import Client, emit

Verb = Callable[[argparse.Namespace, Client], int]
ACTIONS = ("set", "unset")
USAGE = ("sless env NAME [options]\n       sless env set NAME KEY=VALUE [KEY=VALUE ...] [options]\n"
         "       sless env unset NAME KEY [KEY ...] [options]")


def parse_pairs(pairs: Sequence[str], usage_error: Callable[[str], NoReturn]) -> dict[str, str]:
    """``["A=1", "B=x=y"]`` as ``{"A": "1", "B": "x=y"}`` (the value is all after the first ``=``)."""
    found: dict[str, str] = {}
    for number, pair in enumerate(pairs, 1):
        key, sep, value = pair.partition("=")
        if not sep:
            usage_error(f"expected KEY=VALUE: argument {number} after the name ({pair!r}) has no '='")
        found[key] = value
    return found


def env_text(env: dict[str, str]) -> str:
    """One ``KEY=VALUE`` per line, sorted, as ``env`` prints them (no variables: nothing)."""
    return "\n".join(f"{key}={env[key]}" for key in sorted(env))


def cmd_env(args: argparse.Namespace, client: Client) -> int:
    """Show, or change and show, NAME's variables; an unchanged set is not sent (no new version for nothing)."""
    words: list[str] = args.words
    action = words[0] if words[0] in ACTIONS and len(words) > 1 else None
    if action is None and len(words) > 1:
        args.usage_error(f"unexpected {words[1]!r}: `sless env NAME` shows, `sless env set|unset NAME ...` changes")
    name = words[1] if action else words[0]
    rest = words[2:]
    if action and not rest:
        args.usage_error(f"env {action} {name}: give at least one {'KEY=VALUE' if action == 'set' else 'KEY'}")
    given = parse_pairs(rest, args.usage_error) if action == "set" else {}
    path = client.ns_path(f"/functions/{quote(name, safe='')}")  # the API names a bad name, not another route
    record: dict[str, Any] = client.request("GET", path)
    current: dict[str, str] = dict(record.get("env_vars") or {})
    wanted = dict(current)
    if action == "set":
        wanted.update(given)
    elif action == "unset":
        for key in rest:
            if wanted.pop(key, None) is None:
                print(f"sless: {name} has no variable {key!r}", file=sys.stderr)
    if wanted != current:
        record = client.request("PATCH", path, json={"env_vars": wanted})
    elif action:
        print(f"sless: {name}'s variables are already so: nothing changed", file=sys.stderr)
    env = dict(record.get("env_vars") or {})
    emit({"name": record["name"], "env_vars": env}, args.output == "json", env_text(env))
    return 0


def register(verbs: Any, with_client: Callable[[argparse.ArgumentParser, Verb], None]) -> None:
    """Add ``env`` to the ``sless`` parser; WITH_CLIENT adds --url/--output/... and binds the verb."""
    env = verbs.add_parser(
        "env", usage=USAGE, help="show a function's environment variables, or set and unset some",
        description="`sless env NAME` prints NAME's variables, one KEY=VALUE per line. `set` adds or changes the "
                    "given ones, `unset` removes the given keys; the others stay. The function is updated as by "
                    "PATCH .../functions/NAME {\"env_vars\": ...}: the API checks the names and values.")
    env.add_argument("words", nargs="+", metavar="[set|unset] NAME ...", help="what to show or change")
    env.set_defaults(usage_error=env.error, subverbs=list(ACTIONS))
    with_client(env, cmd_env)
