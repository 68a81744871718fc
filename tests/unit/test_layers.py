"""The layers contract of ``sless_api`` (pyproject.toml, import-linter) is a rule that can break: a planted upward
import, in a copy of the sources, fails it; the same copy without it passes. (lint-imports in .ci/run checks the
real tree.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"sless_core": ROOT / "core/src", "sless_api": ROOT / "api/src", "sless_operator": ROOT / "operator/src"}
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _contracts_only(target: Path) -> None:
    """A pyproject.toml holding only the project's import-linter contracts (tomllib cannot write: re-emit it)."""
    linter = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]

    def value(item: object) -> str:
        if isinstance(item, bool):
            return "true" if item else "false"
        if isinstance(item, list):
            return "[" + ", ".join(value(i) for i in item) + "]"
        return '"' + str(item).replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = ["[tool.importlinter]", *(f"{k} = {value(v)}" for k, v in linter.items() if k != "contracts")]
    for contract in linter["contracts"]:
        lines += ["", "[[tool.importlinter.contracts]]", *(f"{k} = {value(v)}" for k, v in contract.items())]
    target.write_text("\n".join(lines) + "\n")


def _lint(tree: Path, workdir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(workdir / "pyproject.toml"), "--no-cache"],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def copied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the three packages' Python sources and the contracts, outside the repository."""
    workdir = tmp_path_factory.mktemp("layers")
    for name, src in PACKAGES.items():
        shutil.copytree(src / name, workdir / "src" / name, ignore=shutil.ignore_patterns("__pycache__", "static"))
    _contracts_only(workdir / "pyproject.toml")
    return workdir


def test_the_copied_tree_keeps_every_contract(copied: Path) -> None:
    done = _lint(copied / "src", copied)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sless_api's layers" in done.stdout and "BROKEN" not in done.stdout


@pytest.mark.parametrize(("planted", "code", "broken"), [
    ("domain/planted.py", "from sless_api.main import app\n",
     "sless_api.domain is not allowed to import sless_api.main"),
    ("gateway/planted.py", "import sless_api.backends.kube.client\n",
     "sless_api.gateway is not allowed to import sless_api.backends"),
    ("stores/planted.py", "from sless_api.services import cron\n",
     "sless_api.stores is not allowed to import sless_api.services"),
])  # fmt: skip
def test_an_upward_import_breaks_the_layers(copied: Path, tmp_path: Path, planted: str, code: str,
                                            broken: str) -> None:  # fmt: skip
    tree = tmp_path / "src"
    shutil.copytree(copied / "src", tree)
    (tree / "sless_api" / planted).write_text(f'"""An upward import, planted."""\n\n{code}')
    done = _lint(tree, copied)
    assert done.returncode != 0, done.stdout
    assert broken in done.stdout, done.stdout
