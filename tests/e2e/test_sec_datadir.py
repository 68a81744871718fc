"""The standalone data dir is private: a real `sless up` on a fresh dir, on a loose one, on a bad path."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from sless_api.auth import issue_token
from sless_core.naming import tenant_namespace
from tests.support.platform import REPO, serving
from tests.support.services import free_port

pytestmark = [pytest.mark.e2e]

PRIVATE_DIRS = ("functions", "cache", "logs", "objects", "tmp")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def sless_up_argv(data_dir: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "sless_api", "up", "--host", "127.0.0.1", "--port", str(port),
            "--data-dir", str(data_dir)]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLESS_")}
    env["SLESS_IDLE_TIMEOUT_SEC"] = "300"
    return env


@contextmanager
def sless_up(data_dir: Path, log_path: Path) -> Iterator[str]:
    """`sless up` with no secret in its environment (it makes its own in the data dir), umask 022."""
    port = free_port()
    with serving(sless_up_argv(data_dir, port), clean_env(), log_path, f"http://127.0.0.1:{port}",
                 umask=0o022) as url:
        yield url


def write_state(url: str, data_dir: Path) -> None:
    """One write through the API, so the state database has its WAL files too."""
    secret = (data_dir / "jwt-secret").read_text().strip()
    token = issue_token(secret, "datadir-tenant", 600)
    ns = tenant_namespace("datadir-tenant")
    headers = {"Authorization": f"Bearer {token}"}
    assert requests.post(f"{url}/v1/namespaces/{ns}/ensure", headers=headers, timeout=30).status_code in (200, 201)
    resp = requests.post(f"{url}/v1/namespaces/{ns}/functions", headers=headers, timeout=30,
                         json={"name": "fn", "runtime": "python3.11", "env_vars": {"TOKEN": "s3cr3t"}})
    assert resp.status_code == 201, resp.text


def assert_private(data_dir: Path) -> None:
    assert mode(data_dir) == 0o700
    assert mode(data_dir / "jwt-secret") == 0o600
    for name in PRIVATE_DIRS:
        assert mode(data_dir / name) == 0o700, name
    dbs = [p for p in data_dir.iterdir() if p.name.startswith(("state.db", "invocations.db"))]
    names = {p.name for p in dbs}
    assert {"state.db", "state.db-wal", "invocations.db"} <= names, names
    for db in dbs:
        assert mode(db) == 0o600, (db.name, oct(mode(db)))


def test_fresh_data_dir_is_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "new" / "data"
    with sless_up(data_dir, tmp_path / "up.log") as url:
        write_state(url, data_dir)
        assert_private(data_dir)


def test_loose_data_dir_is_tightened_at_start(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o755)
    os.chmod(data_dir, 0o755)
    secret = data_dir / "jwt-secret"
    secret.write_text("an-old-secret-that-was-world-readable-0123456789")
    os.chmod(secret, 0o644)
    (data_dir / "state.db").touch()
    os.chmod(data_dir / "state.db", 0o666)
    (data_dir / "objects").mkdir()
    os.chmod(data_dir / "objects", 0o777)
    log_path = tmp_path / "up.log"
    with sless_up(data_dir, log_path) as url:
        write_state(url, data_dir)
        assert_private(data_dir)
    assert secret.read_text() == "an-old-secret-that-was-world-readable-0123456789"  # kept, only tightened
    log = log_path.read_text()
    assert f"{secret}: mode 644 -> 600" in log
    assert f"{data_dir}: mode 755 -> 700" in log


def test_data_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.write_text("not a folder")
    done = subprocess.run(sless_up_argv(data_dir, free_port()), cwd=REPO, env=clean_env(), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "is not a directory" in done.stderr
    assert "Traceback" not in done.stderr


def test_sless_token_creates_a_private_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "tok" / "data"
    done = subprocess.run([sys.executable, "-m", "sless_api", "token", "--sub", "x", "--data-dir",
                           str(data_dir)], cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=60,
                          umask=0o022)
    assert done.returncode == 0, done.stderr
    assert mode(data_dir) == 0o700
    assert mode(data_dir / "jwt-secret") == 0o600


def test_sless_token_on_a_bad_data_dir_says_why_in_one_line(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.write_text("not a folder")
    done = subprocess.run([sys.executable, "-m", "sless_api", "token", "--sub", "x", "--data-dir",
                           str(data_dir)], cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "is not a directory" in done.stderr and "Traceback" not in done.stderr
