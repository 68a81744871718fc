"""The README's first command, `scripts/demo.sh --once`: the three hello examples answer on stdout, and only they
(the platform's own log lines go to a file of their own); and `sless token` signs for the CLI's tenant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jwt
import pytest

from tests.support.platform import REPO
from tests.support.services import free_port

pytestmark = pytest.mark.e2e


def test_the_demo_shows_the_answers_and_nothing_else_on_stdout(tmp_path: Path) -> None:
    log = tmp_path / "sless-up.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLESS_")}
    env |= {"SLESS_PORT": str(free_port()), "SLESS_DATA_DIR": str(tmp_path / "data"), "SLESS_DEMO_LOG": str(log)}
    done = subprocess.run(["bash", "scripts/demo.sh", "--once"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answers = [json.loads(line) for line in done.stdout.splitlines()]  # every stdout line is an answer
    assert sorted(a["runtime"] for a in answers) == ["go1.23", "nodejs20", "python3.11"], done.stdout
    assert all(a["message"] == "Hello, sless!" for a in answers), answers
    assert log.stat().st_size > 0 and f"its log: {log}" in done.stderr


def test_sless_token_signs_for_the_tenant_the_other_verbs_use(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLESS_")}
    data = tmp_path / "data"
    tokens = {}
    for sub in (None, "demo"):
        argv = ["token", "--data-dir", str(data), *(["--sub", sub] if sub else [])]
        done = subprocess.run([sys.executable, "-m", "sless_api", *argv], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=60, check=True)  # fmt: skip
        tokens[sub] = jwt.decode(done.stdout.strip(), options={"verify_signature": False})["sub"]
    assert tokens == {None: "developer", "demo": "demo"}
