"""The README's configuration tables list every ``SLESS_*`` variable the platform's code reads.

The sources are scanned for reads (a ``SLESS_*`` name passed to a call such as ``env.get(...)`` or a typed
getter, or looked up as ``env["..."]``); names the platform only writes into a function's or build's
environment (``SLESS_CODE_DIR``, ...) are the runtime contract, documented in runtimes/README.md.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("api/src", "operator/src", "core/src")
NAME = re.compile(r"SLESS_[A-Z0-9_]+")


def names_read(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            writes = isinstance(node.func, ast.Attribute) and node.func.attr in ("setdefault", "pop")
            candidates = [] if writes else list(node.args)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            candidates = [node.slice]
        else:
            continue
        for arg in candidates:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and NAME.fullmatch(arg.value):
                found.add(arg.value)
    return found


def code_reads() -> dict[str, Path]:
    where: dict[str, Path] = {}
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            for name in names_read(ast.parse(path.read_text(), str(path))):
                where.setdefault(name, path.relative_to(ROOT))
    return where


def documented() -> set[str]:
    """Every name in the first column of a table row of the README's Configuration section."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names.update(NAME.findall(line.split("|")[1]))
    return names


def test_the_scan_finds_reads_and_skips_writes() -> None:
    tree = ast.parse("\n".join([
        'x = env.get("SLESS_A")', 'y = reader.integer("SLESS_B", 1)', 'z = env["SLESS_C"]',
        'child["SLESS_D"] = "1"', 'child.setdefault("SLESS_G", "1")', 'spec = {"SLESS_E": "1"}',
        'raise ValueError("SLESS_F_*: bad")',
    ]))
    assert names_read(tree) == {"SLESS_A", "SLESS_B", "SLESS_C"}


def test_every_variable_read_is_in_the_readme_table() -> None:
    reads = code_reads()
    assert len(reads) > 50, "the scan found too few reads: has the code's shape changed?"
    missing = {name: str(path) for name, path in reads.items() if name not in documented()}
    assert not missing, f"add these to the README's configuration table: {missing}"


#: The only modules that touch os.environ, and why. Everything else gets its settings from the one parser of
#: its process (ApiConfig.from_env, OperatorConfig.from_env) through its caller.
ENVIRONMENT_READERS = {
    "api/src/sless_api/main/sless.py": "entry point (sless): the client's options (cli.commands.ClientEnv)",
    "api/src/sless_api/main/up.py": "entry point (sless up): builds the config with the command line's overrides",
    "api/src/sless_api/main/serve.py": "entry point (sless-api); PROMETHEUS_MULTIPROC_DIR is prometheus_client's own",
    "api/src/sless_api/main/app.py": "entry point of `uvicorn --factory sless_api.main.app:create_app`",
    "api/src/sless_api/main/events.py": "entry point (sless-events)",
    "api/src/sless_api/main/scaler.py": "entry point (sless-scaler)",
    "api/src/sless_api/metrics.py": "PROMETHEUS_MULTIPROC_DIR, read by prometheus_client itself in each worker",
    "api/src/sless_api/backends/standalone/builder.py": "function and build processes' environments; the "
                                                        "runtimes' locations, shared with the harnesses that run "
                                                        "runtimes alone",
    "operator/src/sless_operator/main.py": "entry point (sless-operator)",
    "operator/src/sless_operator/contextfetch.py": "the build Job's init container, a process of its own",
    "operator/src/sless_operator/binaryupload.py": "the Go compile Job's upload step, a process of its own "
                                                   "(its signed PUT URL)",
}


def test_only_entry_points_read_the_environment() -> None:
    readers = set()
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            code = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
            if re.search(r"\bos\.environ\b|\bgetenv\(|\bos\.environb\b", code.split('"""', 2)[-1]):
                readers.add(str(path.relative_to(ROOT)))
    assert readers <= set(ENVIRONMENT_READERS), f"read the setting in the process's config instead: " \
        f"{sorted(readers - set(ENVIRONMENT_READERS))}"


def test_the_table_lists_no_variable_nothing_reads() -> None:
    # Read outside the scanned Python sources: build.sh, the test suite's own switches.
    elsewhere = {"SLESS_GO_CACHE"}
    stale = documented() - set(code_reads()) - elsewhere
    assert not stale, f"the README documents variables no code reads: {sorted(stale)}"
