"""``sless init [DIR] --runtime R [--name NAME]``: a new function's folder, ready for ``sless deploy DIR``.

The files are the smallest function that works in each runtime (it greets the caller, as the examples do) and a
``sless.json`` naming the function and its runtime, which ``sless deploy`` reads. Nothing that exists is ever
overwritten: if any file the template would write is already there, nothing is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from sless_api.cli.client import CliError
from sless_core.errors import ValidationError
from sless_core.naming import validate_name

RUNTIMES = ("python3.11", "nodejs20", "go1.23")

_PYTHON = '''def handle(event):
    """Called once per request: EVENT is the JSON body (or {"body": ...}) plus _method, _path, _query, _headers."""
    name = event.get("name") or event.get("_query", {}).get("name") or "world"
    return {"message": f"Hello, {name}!", "function": "%(name)s"}
'''

_NODE = '''// Called once per request: event is the JSON body (or {body}) plus _method, _path, _query, _headers.
exports.handle = async (event) => {
  const name = event.name || (event._query || {}).name || "world";
  return { message: `Hello, ${name}!`, function: "%(name)s" };
};
'''

_GO = '''package function

import (
	"context"
	"fmt"
)

// Handle is called once per request: event is the JSON body (or {"body": ...}) plus _method, _path, _query and
// _headers.
func Handle(ctx context.Context, event map[string]any) (any, error) {
	name, _ := event["name"].(string)
	if q, ok := event["_query"].(map[string]any); ok && name == "" {
		name, _ = q["name"].(string)
	}
	if name == "" {
		name = "world"
	}
	return map[string]any{"message": fmt.Sprintf("Hello, %%s!", name), "function": "%(name)s"}, nil
}
'''

_GO_MOD = "module example.com/%(name)s\n\ngo 1.23\n"

#: each runtime's files: path -> content, %(name)s being the function's name
TEMPLATES: dict[str, dict[str, str]] = {
    "python3.11": {"handler.py": _PYTHON},
    "nodejs20": {"handler.js": _NODE},
    "go1.23": {"handler.go": _GO, "go.mod": _GO_MOD},
}


def template_files(runtime: str, name: str) -> dict[str, str]:
    """The files of RUNTIME's template for a function called NAME, ``sless.json`` included."""
    files = {path: text % {"name": name} for path, text in TEMPLATES[runtime].items()}
    files["sless.json"] = json.dumps({"name": name, "runtime": runtime}, indent=2) + "\n"
    return files


def target(folder: str | None, name: str | None, usage_error: Callable[[str], NoReturn]) -> tuple[Path, str]:
    """Where the files go and the function's name: DIR and its name, or a new folder named NAME."""
    if folder is None and name is None:
        usage_error("give a folder (sless init DIR) or a name (--name NAME: the folder ./NAME)")
    path = Path(folder) if folder is not None else Path(str(name))
    chosen = name if name is not None else path.resolve().name
    try:
        return path, validate_name(chosen, "--name")
    except ValidationError as exc:
        hint = "" if name is not None else f" (taken from the folder {path}; give --name)"
        raise CliError(f"{exc}{hint}") from None


def cmd_init(args: argparse.Namespace) -> int:
    folder, name = target(args.folder, args.name, args.usage_error)
    files = template_files(args.runtime, name)
    if folder.exists() and not folder.is_dir():
        raise CliError(f"{folder} exists and is not a folder")
    present = sorted(path for path in files if (folder / path).exists() or (folder / path).is_symlink())
    if present:
        raise CliError(f"{folder} already has {', '.join(present)}: nothing was written (init never overwrites)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for path, text in files.items():
            with open(folder / path, "x", encoding="utf-8") as out:  # "x": a file that appeared meanwhile stays
                out.write(text)
    except OSError as exc:
        raise CliError(f"cannot write into {folder}: {exc.strerror or type(exc).__name__}") from None
    print(f"{name}: {args.runtime} function in {folder} ({', '.join(sorted(files))})")
    print(f"deploy it with: sless deploy {folder}", file=sys.stderr)
    return 0


def register(verbs: Any) -> None:
    """Add ``init`` to the ``sless`` parser (it talks to no API: no --url, no token)."""
    init = verbs.add_parser(
        "init", help="write a new function's folder (handler and sless.json) for a runtime",
        description="Write the smallest working function for RUNTIME and a sless.json naming it, into DIR "
                    "(default: a new folder ./NAME); `sless deploy DIR` deploys it. Existing files are never "
                    "overwritten.")
    init.add_argument("folder", nargs="?", metavar="DIR", help="where to write (default: ./NAME)")
    init.add_argument("--runtime", "-r", choices=RUNTIMES, required=True)
    init.add_argument("--name", help="the function's name (default: the folder's name)")
    init.set_defaults(run=cmd_init, usage_error=init.error)
