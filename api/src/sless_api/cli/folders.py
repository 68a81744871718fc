"""A function's folder as the CLI deploys it: its files zipped the same way every time, its ``sless.json`` read
(the runtime guessed from the files when it names none), and the wait for its build. Shared by ``sless deploy``
(one folder) and ``sless stack deploy`` (a project's folders)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from sless_api.cli.client import Client, CliError

TERMINAL_PHASES = ("Ready", "Failed")


def zip_folder(folder: Path) -> bytes:
    """The folder's files as a zip that is the same bytes for the same content (an unchanged folder is no rebuild)."""
    from sless_api.domain.archive import zip_bytes

    files = [(path, path.relative_to(folder)) for path in sorted(folder.rglob("*"))]
    return zip_bytes((rel.as_posix(), path.read_bytes(), os.access(path, os.X_OK)) for path, rel in files
                     if path.is_file() and not any(p in ("node_modules", "__pycache__", ".git") for p in rel.parts))


def read_manifest(folder: Path) -> dict[str, Any]:
    """The function's settings from ``sless.json`` (any field of the API's, ``scale`` included, plus ``trigger``);
    the runtime, when it does not name one (or there is no ``sless.json``), guessed from the files."""
    manifest = folder / "sless.json"
    if not manifest.exists():
        return {"runtime": guess_runtime(folder)}
    try:
        data = json.loads(manifest.read_bytes())
    except ValueError as exc:  # not JSON, or not UTF-8
        raise CliError(f"{manifest} is not JSON: {exc}") from None
    except OSError as exc:  # a folder of that name, no permission, ...
        raise CliError(f"cannot read {manifest}: {exc.strerror or exc}") from None
    if not isinstance(data, dict):
        raise CliError(f"{manifest} must hold a JSON object (name, runtime, scale, ...)")
    if "scale" in data and data["scale"] is not None and not isinstance(data["scale"], dict):
        raise CliError(f'{manifest}: "scale" must be an object {{min, max, target, idle_sec}} or null')
    if data.get("runtime") is None:
        data["runtime"] = guess_runtime(folder)
    return data


def guess_runtime(folder: Path) -> str:
    """The runtime a folder's files suggest: Go files or go.mod, then handler.js or package.json, else Python."""
    if (folder / "go.mod").exists() or list(folder.glob("*.go")):
        return "go1.23"
    if (folder / "handler.js").exists() or (folder / "package.json").exists():
        return "nodejs20"
    return "python3.11"


def wait_for_build(client: Client, name: str, timeout: float) -> dict[str, Any]:
    deadline, last = time.monotonic() + timeout, ""
    while True:
        record: dict[str, Any] = client.request("GET", client.ns_path(f"/functions/{name}"))
        line = f"{record['phase']}: {record['message']}"
        if line != last:
            print(f"  {line}", file=sys.stderr)
            last = line
        if record["phase"] in TERMINAL_PHASES or time.monotonic() > deadline:
            return record
        time.sleep(0.3)
