"""`sless init` writes a function that `sless deploy` deploys and that answers, in every runtime; it never
overwrites a file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.platform import REPO, Tenant, sless_cli

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(("runtime", "handler"), [
    ("python3.11", "handler.py"), ("nodejs20", "handler.js"),
    pytest.param("go1.23", "handler.go", marks=pytest.mark.slow),  # a Go deploy compiles: about a minute
])  # fmt: skip
def test_init_deploy_invoke(tenant: Tenant, tmp_path: Path, runtime: str, handler: str) -> None:
    folder = tmp_path / f"new-{runtime.replace('.', '')}"
    written = sless_cli(tenant, "init", str(folder), "--runtime", runtime)
    name = folder.name
    assert written.stdout.startswith(f"{name}: {runtime} function in {folder}"), written.stdout
    assert f"sless deploy {folder}" in written.stderr
    assert json.loads((folder / "sless.json").read_text()) == {"name": name, "runtime": runtime}
    assert (folder / handler).is_file()
    deployed = sless_cli(tenant, "deploy", str(folder))
    assert deployed.stdout == f"{name}: Ready at {tenant.fn_url(name)}\n"
    called = sless_cli(tenant, "invoke", name, "--data", '{"name": "init"}')
    assert json.loads(called.stdout) == {"message": "Hello, init!", "function": name}


def test_the_default_folder_is_the_name_and_nothing_is_overwritten(tenant: Tenant, tmp_path: Path) -> None:
    made = subprocess.run([sys.executable, "-m", "sless_api", "init", "--runtime", "python3.11", "--name", "greeter"],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert made.returncode == 0, made.stderr
    folder = tmp_path / "greeter"
    assert sorted(p.name for p in folder.iterdir()) == ["handler.py", "sless.json"], "./NAME by default"
    before = (folder / "handler.py").read_text()
    (folder / "handler.py").write_text("def handle(event):\n    return 'mine'\n")
    refused = sless_cli(tenant, "init", str(folder), "--runtime", "nodejs20", "--name", "greeter", expect=1)
    assert "already has sless.json: nothing was written" in refused.stderr and refused.stderr.count("\n") == 1
    assert not (folder / "handler.js").exists()
    again = sless_cli(tenant, "init", str(folder), "--runtime", "python3.11", expect=1).stderr
    assert "already has handler.py, sless.json" in again
    assert (folder / "handler.py").read_text() == "def handle(event):\n    return 'mine'\n" != before


@pytest.mark.parametrize(("argv", "code", "words"), [
    (("init", "--runtime", "python3.11"), 2, "give a folder (sless init DIR) or a name"),
    (("init", "x", "--runtime", "ruby"), 2, "invalid choice: 'ruby'"),
    (("init", "x"), 2, "the following arguments are required: --runtime"),
    (("init", "x", "--runtime", "go1.23", "--name", "Not_A_Name"), 1, "--name"),
])  # fmt: skip
def test_bad_init_arguments_write_nothing(tenant: Tenant, tmp_path: Path, argv: tuple[str, ...], code: int,
                                         words: str) -> None:
    target = [str(tmp_path / "x") if a == "x" else a for a in argv]
    done = sless_cli(tenant, *target, expect=code)
    assert words in done.stderr, done.stderr
    assert not (tmp_path / "x").exists()


def test_a_folder_name_that_is_no_function_name_asks_for_name(tenant: Tenant, tmp_path: Path) -> None:
    done = sless_cli(tenant, "init", str(tmp_path / "Bad_Folder"), "--runtime", "python3.11", expect=1)
    assert "taken from the folder" in done.stderr and "give --name" in done.stderr
    assert done.stderr.count("\n") == 1 and not (tmp_path / "Bad_Folder").exists()
    sless_cli(tenant, "init", str(tmp_path / "Bad_Folder"), "--runtime", "python3.11", "--name", "good")
    assert json.loads((tmp_path / "Bad_Folder" / "sless.json").read_text())["name"] == "good"
