"""``sless versions|rollback|traffic``: a function's deployed versions, a rollback, and a traffic split.

Thin mappings onto ``GET .../versions``, ``POST .../rollback`` and ``GET, PUT, DELETE .../traffic``: the API
decides what is allowed (which versions exist, weights summing to 100, the current version in a split) and the
CLI prints its answer. Only the shape of ``--split VERSION=WEIGHT`` is checked here, so a typo is named before
anything is sent.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from sless_api.cli.client import Client, CliError, emit, table
from sless_core.errors import ValidationError
from sless_core.naming import validate_name

Verb = Callable[[argparse.Namespace, Client], int]

HASH_SHOWN = 12
#: what a version is besides its code and configuration: left out when asking "is this the same deploy?"
_NOT_CONFIG = frozenset({"version", "deployed_at", "current"})
_SPLIT = re.compile(r"([0-9]+)=([0-9]+)", re.ASCII)


def parse_split(pairs: Sequence[str]) -> list[dict[str, int]]:
    """``["3=90", "4=10"]`` as the API's split entries; CliError naming the first argument that is not V=W."""
    entries = []
    for pair in pairs:
        found = _SPLIT.fullmatch(pair.strip())
        if found is None:
            raise CliError(f"--split expects VERSION=WEIGHT in whole numbers (e.g. --split 3=90), not {pair!r}")
        entries.append({"version": int(found[1]), "weight": int(found[2])})
    return entries


def function_name(args: argparse.Namespace) -> str:
    """NAME as it goes into the URL: a function name, or a CliError before anything is sent."""
    try:
        return validate_name(args.name, "NAME")
    except ValidationError as exc:
        raise CliError(str(exc)) from None


def weights_of(split: list[dict[str, Any]] | None) -> dict[int, int]:
    return {int(e["version"]): int(e["weight"]) for e in split or []}


def version_rows(items: list[dict[str, Any]], split: list[dict[str, Any]] | None) -> str:
    """One line per version, newest first: number, short code hash, when deployed, current, its traffic share."""
    weights = weights_of(split)
    rows = []
    for v in items:
        share = f"{weights[v['version']]}%" if v["version"] in weights else "-"
        rows.append((f"v{v['version']}", str(v["code_hash"] or "-")[:HASH_SHOWN], v.get("deployed_at") or "-",
                     "current" if v.get("current") else "-", share))
    return table(("VERSION", "CODE", "DEPLOYED", "CURRENT", "TRAFFIC"), rows)


def split_rows(name: str, split: list[dict[str, Any]] | None, current: int | None) -> str:
    if not split:
        return f"{name}: no split (every call goes to the current version)"
    return table(("VERSION", "WEIGHT", "CURRENT"), ((f"v{e['version']}", f"{e['weight']}%",
                                                     "current" if e["version"] == current else "-") for e in split))


def current_version(client: Client, name: str) -> int | None:
    items = client.request("GET", client.ns_path(f"/functions/{name}/versions"))["items"]
    return next((int(v["version"]) for v in items if v.get("current")), None)


# -- versions --------------------------------------------------------------------------------------


def cmd_versions(args: argparse.Namespace, client: Client) -> int:
    name = function_name(args)
    listing = client.request("GET", client.ns_path(f"/functions/{name}/versions"))
    if args.output == "json":
        emit(listing, True, "")
        return 0
    split = client.request("GET", client.ns_path(f"/functions/{name}/traffic"))["split"]
    emit(listing, False, version_rows(listing["items"], split))
    return 0


# -- rollback --------------------------------------------------------------------------------------


def same_deploy(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two versions ran the same code with the same configuration."""
    return {k: v for k, v in a.items() if k not in _NOT_CONFIG} == {k: v for k, v in b.items() if k not in _NOT_CONFIG}


def cmd_rollback(args: argparse.Namespace, client: Client) -> int:
    """Roll back, then (unless ``--wait 0``) wait until the target's code and configuration are the current version."""
    path = client.ns_path(f"/functions/{function_name(args)}")
    before = client.request("GET", f"{path}/versions")["items"]
    body = {"version": args.version} if args.version is not None else None
    started = client.request("POST", f"{path}/rollback", json=body)
    if not args.wait:
        emit(started, args.output == "json", f"{args.name}: {started['message']} ({started['phase']})")
        return 0
    wanted = args.version if args.version is not None else before[1]["version"] if len(before) > 1 else None
    target = next((v for v in before if v["version"] == wanted), None)
    deadline = time.monotonic() + args.wait
    while True:
        record = client.request("GET", path)
        items = client.request("GET", f"{path}/versions")["items"]
        newest = items[0] if items else None
        if record["phase"] == "Failed":
            raise CliError(f"rolling {args.name} back failed: {' '.join(str(record['message']).split())[-300:]}")
        if record["phase"] == "Ready" and newest is not None and target is not None and same_deploy(newest, target):
            break
        if time.monotonic() > deadline:
            raise CliError(f"{args.name} is still rolling back after {args.wait:g} s ({record['phase']}: "
                           f"{record['message']}); `sless versions {args.name}` shows when it is current")
        time.sleep(0.3)
    emit(newest, args.output == "json",
         f"{args.name}: version {newest['version']} is current (the code and configuration of version {wanted}, "
         f"code {str(newest['code_hash'])[:HASH_SHOWN]})")
    return 0


# -- traffic ---------------------------------------------------------------------------------------


def cmd_traffic(args: argparse.Namespace, client: Client) -> int:
    split = parse_split(args.split)
    path = client.ns_path(f"/functions/{function_name(args)}/traffic")
    if args.clear:
        client.request("DELETE", path)
        emit({"split": None}, args.output == "json", f"{args.name}: split cleared (every call goes to the current "
                                                      "version)")
        return 0
    answer = client.request("PUT", path, json={"split": split}) if split else client.request("GET", path)
    if args.output == "json":
        emit(answer, True, "")
        return 0
    current = current_version(client, args.name) if answer["split"] else None
    emit(answer, False, split_rows(args.name, answer["split"], current))
    return 0


# -- the parser ------------------------------------------------------------------------------------


def register(verbs: Any, with_client: Callable[[argparse.ArgumentParser, Verb], None]) -> None:
    """Add this module's verbs to the ``sless`` parser; WITH_CLIENT adds --url/--output/... and binds the verb."""
    versions = verbs.add_parser("versions", help="a function's deployed versions, the current one and traffic shares")
    versions.add_argument("name")
    with_client(versions, cmd_versions)

    rollback = verbs.add_parser("rollback", help="deploy an earlier version's code and configuration again")
    rollback.add_argument("name")
    rollback.add_argument("version", type=int, nargs="?", help="the version to roll back to (default: the previous)")
    rollback.add_argument("--wait", type=float, default=600,
                          help="wait up to this many seconds until it is current (0: do not wait)")
    with_client(rollback, cmd_rollback)

    traffic = verbs.add_parser("traffic", help="show, set (--split V=W ...) or --clear a function's traffic split")
    traffic.add_argument("name")
    change = traffic.add_mutually_exclusive_group()
    change.add_argument("--split", action="append", default=[], metavar="VERSION=WEIGHT",
                        help="a version and its share of calls (0-100); give one or two, summing to 100")
    change.add_argument("--clear", action="store_true", help="drop the split: every call to the current version")
    with_client(traffic, cmd_traffic)
