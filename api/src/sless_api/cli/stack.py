"""``sless stack deploy [FILE]``: a project's functions and their triggers, declared in one file, deployed at once.

The file (``sless.stack.json`` by default) is JSON::

    {"functions": {
        "api":     {"folder": "api", "memory_mb": 256, "env_vars": {"MODE": "prod"},
                    "triggers": {"api": {"type": "http", "auth": "token", "methods": ["GET", "POST"]}}},
        "nightly": {"folder": "jobs/nightly",
                    "triggers": {"nightly": {"type": "cron", "schedule": "0 3 * * *"}}}}}

A function's ``folder`` (relative to the file; default its name) is deployed as ``sless deploy`` does, its
``sless.json`` read first and the file's settings over it; its ``triggers`` are made to say what the file says
(created, or changed where they differ). Everything is checked and every folder zipped before anything is sent,
so a file with a mistake creates nothing; then the functions build side by side and the verb waits for all.
Triggers the file does not name are left alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sless_api.cli.client import Client, CliError, emit, table
from sless_api.cli.folders import TERMINAL_PHASES, read_manifest, zip_folder

DEFAULT_FILE = "sless.stack.json"
STACK_KEYS = frozenset({"functions"})
#: what a function's entry may hold besides the API's settings
ENTRY_KEYS = frozenset({"folder", "triggers"})
STACK_HEADER = ("NAME", "PHASE", "TRIGGERS", "URL")


@dataclass
class Planned:
    """One function of the file, ready to send."""

    name: str
    settings: dict[str, Any]
    archive: bytes
    triggers: dict[str, dict[str, Any]]


def load(path: Path) -> list[Planned]:
    """The file's functions, each folder zipped: every mistake is found here, before anything is sent."""
    try:
        doc = json.loads(path.read_bytes())
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(f"{path} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("functions"), dict) or not doc["functions"]:
        raise CliError(f'{path} must hold {{"functions": {{"NAME": {{...}}, ...}}}} with at least one function')
    unknown = sorted(set(doc) - STACK_KEYS)
    if unknown:
        raise CliError(f"{path}: unknown key {unknown[0]!r} (the file holds \"functions\")")
    planned = []
    for name, entry in doc["functions"].items():
        if not isinstance(entry, dict):
            raise CliError(f"{path}: functions.{name} must be an object (folder, triggers and the function's "
                           "settings)")
        folder = (path.parent / str(entry.get("folder", name))).resolve()
        where = f"{path}: functions.{name}"
        if not folder.is_dir():
            raise CliError(f"{where}: folder {folder} is not a folder")
        archive = zip_folder(folder)
        if len(archive) <= 22 or _only_manifest(archive):
            raise CliError(f"{where}: {folder} has no code to deploy (no file besides sless.json)")
        manifest = read_manifest(folder)
        manifest.pop("name", None)
        manifest.pop("trigger", None)  # the file says which triggers there are
        triggers = entry.get("triggers", {})
        if not isinstance(triggers, dict) or any(not isinstance(t, dict) for t in triggers.values()):
            raise CliError(f"{where}.triggers must map trigger names to objects ({{\"type\": \"http\", ...}})")
        settings = {**manifest, **{k: v for k, v in entry.items() if k not in ENTRY_KEYS}}
        planned.append(Planned(name, settings, archive, {n: dict(t) for n, t in triggers.items()}))
    return planned


def _only_manifest(archive: bytes) -> bool:
    import io
    import zipfile

    return all(info.filename == "sless.json" for info in zipfile.ZipFile(io.BytesIO(archive)).infolist())


def apply_trigger(client: Client, function: str, name: str, wanted: dict[str, Any]) -> str:
    """Make trigger NAME of FUNCTION say WANTED: created, changed, or as it was."""
    path = client.ns_path(f"/triggers/{name}")
    resp = client.http.get(client.url + path, timeout=60)
    if resp.status_code == 404:
        client.request("POST", client.ns_path("/triggers"), json={"name": name, "function": function, **wanted})
        return "created"
    current = client.request("GET", path)
    if current.get("type") != wanted.get("type", current.get("type")):
        client.request("DELETE", path)
        client.request("POST", client.ns_path("/triggers"), json={"name": name, "function": function, **wanted})
        return "replaced"
    changes = {k: v for k, v in {"function": function, **wanted}.items() if k != "type" and current.get(k) != v}
    if not changes:
        return "unchanged"
    client.request("PATCH", path, json=changes)
    return "changed"


def cmd_stack_deploy(args: argparse.Namespace, client: Client) -> int:
    path = Path(args.file)
    planned = load(path)
    client.request("POST", client.ns_path("/ensure"))
    for item in planned:
        created = client.request("POST", client.ns_path("/functions"), json={"name": item.name, **item.settings},
                                 ok=(201, 409))
        if created is None or created.get("error"):
            client.request("PUT", client.ns_path(f"/functions/{item.name}"), json=item.settings)
        print(f"{item.name}: uploading {len(item.archive)} bytes of code", file=sys.stderr)
        client.request("POST", client.ns_path(f"/functions/{item.name}/upload"),
                       files={"code": ("code.zip", item.archive)})
        for name, wanted in item.triggers.items():
            print(f"{item.name}: trigger {name} {apply_trigger(client, item.name, name, wanted)}", file=sys.stderr)
    records = wait_for_all(client, [p.name for p in planned], args.wait)
    base = f"{client.url}/fn/{client.namespace()}"
    rows = [(p.name, records[p.name]["phase"], ",".join(p.triggers) or "-", f"{base}/{p.name}") for p in planned]
    emit({"items": [{"name": n, "phase": ph, "triggers": list(planned[i].triggers), "url": u,
                     "message": records[n]["message"]} for i, (n, ph, _, u) in enumerate(rows)]},
         args.output == "json", table(STACK_HEADER, rows))
    failed = [p.name for p in planned if records[p.name]["phase"] != "Ready"]
    for name in failed:
        print(f"sless: {name}: {records[name]['phase']}: {records[name]['message']}", file=sys.stderr)
    return 1 if failed else 0


def wait_for_all(client: Client, names: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    """Each function's record once its build ended (or the wait is over), the builds running side by side."""
    deadline = time.monotonic() + timeout
    records: dict[str, dict[str, Any]] = {}
    while True:
        for name in names:
            if name not in records or records[name]["phase"] not in TERMINAL_PHASES:
                records[name] = client.request("GET", client.ns_path(f"/functions/{name}"))
        if all(r["phase"] in TERMINAL_PHASES for r in records.values()) or time.monotonic() > deadline:
            return records
        time.sleep(0.3)


def register(verbs: Any, with_client: Any) -> None:
    """Add ``stack deploy`` to the ``sless`` parser."""
    stack = verbs.add_parser("stack", help="a project's functions and triggers from one file (sless.stack.json)")
    actions = stack.add_subparsers(dest="stack_verb", required=True)
    deploy = actions.add_parser("deploy", help="deploy every function of the file and make its triggers match")
    deploy.add_argument("file", nargs="?", default=DEFAULT_FILE, help=f"the stack file (default {DEFAULT_FILE})")
    deploy.add_argument("--wait", type=float, default=600, help="seconds to wait for the builds (default 600)")
    with_client(deploy, cmd_stack_deploy)
