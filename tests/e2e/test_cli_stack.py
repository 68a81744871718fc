"""`sless stack deploy`: a project's functions and triggers from one file, through a real `sless up`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.platform import REPO, Tenant, table_rows

pytestmark = pytest.mark.e2e
HELLO = "def handle(event):\n    return {'hello': event.get('name', 'you'), 'mode': __import__('os').environ['MODE']}\n"


def sless(tenant: Tenant, cwd: Path, *argv: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLESS_TOKEN": tenant.token, "SLESS_URL": tenant.url, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "sless_api", *argv], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == expect, (argv, done.stdout[-2000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr
    return done


def project(root: Path, stack: dict[str, Any]) -> Path:
    for folder in ("api", "jobs/nightly"):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "handler.py").write_text(HELLO)
    (root / "api" / "sless.json").write_text(json.dumps({"runtime": "python3.11", "env_vars": {"MODE": "folder"}}))
    path = root / "sless.stack.json"
    path.write_text(json.dumps(stack))
    return path


STACK = {"functions": {
    "api": {"env_vars": {"MODE": "stack"}, "memory_mb": 192,
            "triggers": {"api": {"type": "http", "methods": ["POST"]}}},
    "nightly": {"folder": "jobs/nightly", "runtime": "python3.11", "env_vars": {"MODE": "night"},
                "triggers": {"nightly": {"type": "cron", "schedule": "0 3 * * *"}}}}}


def test_a_stack_deploys_its_functions_and_makes_its_triggers_match(tenant: Tenant, tmp_path: Path) -> None:
    project(tmp_path, STACK)
    done = sless(tenant, tmp_path, "stack", "deploy")
    rows = table_rows(done.stdout)
    assert [row[:3] for row in rows] == [["api", "Ready", "api"], ["nightly", "Ready", "nightly"]], done.stdout
    answer = requests.post(tenant.fn_url("api"), json={"name": "ann"}, timeout=30)
    assert answer.json() == {"hello": "ann", "mode": "stack"}  # the file's settings over the folder's sless.json
    assert requests.get(tenant.fn_url("api"), timeout=30).status_code == 405
    assert tenant.api("GET", "/functions/api", expect=200).json()["memory_mb"] == 192
    assert tenant.api("GET", "/triggers/nightly", expect=200).json()["schedule"] == "0 3 * * *"
    # changed in the file: the trigger follows; an unchanged one is left as it is
    changed = json.loads(json.dumps(STACK))
    changed["functions"]["api"]["triggers"]["api"]["methods"] = ["GET", "POST"]
    (tmp_path / "sless.stack.json").write_text(json.dumps(changed))
    again = sless(tenant, tmp_path, "stack", "deploy", "sless.stack.json", "-o", "json")
    assert "trigger api changed" in again.stderr and "trigger nightly unchanged" in again.stderr
    assert [item["phase"] for item in json.loads(again.stdout)["items"]] == ["Ready", "Ready"]
    assert requests.get(tenant.fn_url("api"), timeout=30).status_code == 200


@pytest.mark.parametrize(("stack", "words"), [
    ({"functions": {}}, "at least one function"),
    ({"functions": {"api": {}}, "extra": 1}, "unknown key 'extra'"),
    ({"functions": {"ghost": {}}}, "is not a folder"),
    ({"functions": {"api": {"triggers": ["api"]}}}, "must map trigger names to objects"),
    ({"functions": {"api": {}, "ghost": {}}}, "functions.ghost: folder"),
])  # fmt: skip
def test_a_bad_stack_file_creates_nothing(tenant: Tenant, tmp_path: Path, stack: dict[str, Any], words: str) -> None:
    project(tmp_path, stack)
    done = sless(tenant, tmp_path, "stack", "deploy", expect=1)
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    tenant.api("POST", "/ensure", expect=(200, 201))
    assert tenant.api("GET", "/functions", expect=200).json()["items"] == []


def test_a_stack_file_that_is_not_json_or_missing(tenant: Tenant, tmp_path: Path) -> None:
    (tmp_path / "sless.stack.json").write_text("{functions: ")
    assert "is not JSON" in sless(tenant, tmp_path, "stack", "deploy", expect=1).stderr
    assert "cannot read" in sless(tenant, tmp_path, "stack", "deploy", "nope.json", expect=1).stderr
