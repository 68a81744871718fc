"""`sless up` on a data dir a crash left behind: damaged databases (a clear refusal for the state, a fresh start
for the log) and half-received uploads (removed at start)."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.support.platform import REPO, SECRET, Tenant, running_sless, start_sless

pytestmark = pytest.mark.e2e
GARBAGE = b"this is not an SQLite database\n" * 100


def test_a_corrupt_state_database_stops_start_up_with_what_to_do(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / "state.db").write_bytes(GARBAGE)
    env = {**os.environ, "SLESS_JWT_SECRET": SECRET}
    done = subprocess.run([sys.executable, "-m", "sless_api", "up", "--port", "0", "--data-dir", str(data),
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


def test_uploads_interrupted_by_a_kill_are_cleaned_at_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    sp = start_sless(data)
    spool = data / "tmp"
    try:
        tenant = Tenant(sp.url, "interrupted")
        tenant.api("POST", "/ensure", expect=(200, 201))
        tenant.api("POST", "/functions", json={"name": "big", "runtime": "python3.11"}, expect=201)
        conn = http.client.HTTPConnection("127.0.0.1", int(sp.url.rsplit(":", 1)[1]), timeout=30)
        conn.putrequest("POST", f"/v1/namespaces/{tenant.ns}/functions/big/upload")
        conn.putheader("Authorization", f"Bearer {tenant.token}")
        conn.putheader("Content-Type", "application/zip")
        conn.putheader("Content-Length", str(8 * 1024 * 1024))
        conn.endheaders()
        conn.send(b"PK" + b"\0" * (2 * 1024 * 1024))
        deadline = time.monotonic() + 30
        while not list(spool.glob("*.zip")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(spool.glob("*.zip")), "the upload was not spooled"
    finally:
        sp.stop(signal.SIGKILL)
    assert list(spool.glob("*.zip")), "SIGKILL leaves the spool file behind"
    with running_sless(data):
        assert list(spool.glob("*.zip")) == []
