"""The suite's own layout: no module under tests/ or bench/ imports a test module or a conftest.

A test module imported by another runs its module-level code twice under two names, drags its fixtures and
``pytestmark`` along, and ties the importer to that module's tests: moving or deleting a test breaks an
unrelated one. What several modules share lives in ``tests/support/`` (helpers, constants, fixtures imported by
name) or, for fixtures of one directory, in that directory's ``conftest.py``, which pytest finds by itself.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("tests", "bench")
SCRIPT_IMPORT = re.compile(r"^\s*(?:from|import)\s+(tests(?:\.\w+)+)", re.MULTILINE)  # in a script's text


def _forbidden(module: str) -> bool:
    """A dotted module path naming a test module (``test_*``) or a ``conftest`` at any level."""
    return any(part.startswith("test_") or part == "conftest" for part in module.split("."))


def _package_of(path: Path, root: Path) -> list[str]:
    """The dotted package a file under ROOT belongs to, as its parts (``tests/k8s/x.py`` -> tests, k8s)."""
    return list(path.relative_to(root).parent.parts)


def forbidden_imports(source: str, path: Path, root: Path, scripts: bool = True) -> list[tuple[int, str]]:
    """(line, imported module) for each import in SOURCE (the file PATH under ROOT) of a test or conftest module.

    Covers ``import a.test_b``, ``from a.test_b import x``, ``from a import test_b`` / ``conftest`` and the
    relative forms (``from .conftest import x``, ``from . import test_b``), resolved against PATH's package.
    Imports anywhere count, not only at the top: a function-level or TYPE_CHECKING import couples as much, and
    so does one in a string that a test runs as a script in another interpreter (SCRIPTS; off for this module,
    whose strings are the samples below).
    """
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, str(path))):
        if scripts and isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(node.lineno + node.value.count("\n", 0, m.start(1)), m[1])  # a script's line by line
                      for m in SCRIPT_IMPORT.finditer(node.value) if _forbidden(m[1])]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if _forbidden(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = _package_of(path, root)
                package = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                base = ".".join([*package, *([base] if base else [])])
            if _forbidden(base):
                found.append((node.lineno, base))
            else:  # the names imported from a package may be modules themselves
                found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names
                          if _forbidden(alias.name)]  # fmt: skip
    return found


def suite_files(root: Path) -> list[Path]:
    """Every Python file of the suite and the benchmarks."""
    return sorted(p for top in SCANNED for p in (root / top).rglob("*.py") if "__pycache__" not in p.parts)


def test_no_module_imports_a_test_module_or_a_conftest() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line}: imports {module}"
        for path in suite_files(REPO)
        for line, module in forbidden_imports(path.read_text(), path, REPO, scripts=path != Path(__file__).resolve())
    ]
    assert not offenders, (
        "move what is shared into tests/support/ (or fixtures of one directory into its conftest.py):\n"
        + "\n".join(offenders)
    )


def test_the_scan_covers_the_whole_suite() -> None:
    files = suite_files(REPO)
    assert REPO / "tests" / "unit" / "test_suite_layout.py" in files
    assert any(p.parts[-2] == "bench" for p in files)
    assert len(files) > 100  # a broken glob would pass the check above on nothing


@pytest.mark.parametrize(("source", "module"), [
    ("import tests.k8s.test_api_kube\n", "tests.k8s.test_api_kube"),
    ("from tests.k8s.test_api_kube import KubeApi\n", "tests.k8s.test_api_kube"),
    ("from tests.k8s.conftest import Operator\n", "tests.k8s.conftest"),
    ("from tests.k8s import test_api_kube\n", "tests.k8s.test_api_kube"),
    ("from tests.backends import conftest\n", "tests.backends.conftest"),
    ("from .conftest import Backend\n", "tests.backends.conftest"),
    ("from .test_contract import HELLO\n", "tests.backends.test_contract"),
    ("from . import conftest\n", "tests.backends.conftest"),
    ("from ..k8s.conftest import Operator\n", "tests.k8s.conftest"),
    ("from ..k8s import test_api_kube\n", "tests.k8s.test_api_kube"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tests.k8s.conftest import Sless\n",
     "tests.k8s.conftest"),
    ("def f() -> None:\n    from tests.unit.test_kube_routes import fn\n", "tests.unit.test_kube_routes"),
    ('script = "import json\\nfrom tests.integration.test_seccomp import run_probe\\n"\n',
     "tests.integration.test_seccomp"),
])  # fmt: skip
def test_the_scan_finds_each_form(source: str, module: str) -> None:
    planted = REPO / "tests" / "backends" / "planted.py"  # never written: the scan reads SOURCE
    assert [found for _, found in forbidden_imports(source, planted, REPO)] == [module]


@pytest.mark.parametrize("source", [
    "from tests.support.kube_api import KubeApi\n",
    "import tests.support.poll\n",
    "from tests.install import helm\n",
    "from . import helpers\n",
    "import unittest\nfrom test import support\n",  # the standard library's, not ours
    "import pytest\nfrom _pytest.fixtures import FixtureRequest\n",
    'script = "from tests.support.seccomp_probe import run_probe\\n"\n',
])  # fmt: skip
def test_the_scan_leaves_support_modules_and_libraries_alone(source: str) -> None:
    assert forbidden_imports(source, REPO / "tests" / "backends" / "planted.py", REPO) == []
