"""`sless up` on a data dir whose databases were damaged: a clear refusal for the state, a fresh start for the log."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.support.platform import REPO, SECRET, Tenant, running_sless

pytestmark = pytest.mark.e2e
GARBAGE = b"this is not an SQLite database\n" * 100


def test_a_corrupt_state_database_stops_start_up_with_what_to_do(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / "state.db").write_bytes(GARBAGE)
    env = {**os.environ, "SLESS_JWT_SECRET": SECRET}
    done = subprocess.run([sys.executable, "-m", "sless_api.cli", "up", "--port", "0", "--data-dir", str(data),
                           "--single-tenant"], env=env, cwd=REPO, capture_output=True, timeout=60, check=False)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert str(data / "state.db") in err and "move it aside" in err
    assert "Traceback" not in err
    assert (data / "state.db").read_bytes() == GARBAGE  # never replaced on its own: it is every function's spec


def test_a_corrupt_invocation_log_is_moved_aside(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / "invocations.db").write_bytes(GARBAGE)
    with running_sless(data) as sp:
        tenant = Tenant(sp.url, "corrupt-log")
        tenant.deploy("hello", "python3.11", {"handler.py": "def handle(event):\n    return 'hi'\n"})
        assert requests.get(tenant.fn_url("hello"), timeout=30).text == "hi"
        assert "moved aside" in sp.log_tail(200)
    aside = [p for p in data.iterdir() if p.name.startswith("invocations.db.corrupt-")]
    assert [p.read_bytes() for p in aside] == [GARBAGE]
    assert (data / "invocations.db").stat().st_mode & 0o777 == 0o600
