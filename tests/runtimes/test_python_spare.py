"""The Python server's readiness byte (SLESS_READY_FD) and warm-spare mode (SLESS_SPARE), as plain processes.

The supervisor's side, in the sandbox, is tests/integration/test_spares.py; this is the runtime's own contract:
one byte once it accepts connections, and a spare that loads nothing of the function before its claim and
becomes exactly the process the claim describes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.support.services import free_port
from tests.support.spares import Procs, wait_byte

SERVER = Path(__file__).resolve().parents[2] / "runtimes" / "python3.11" / "server.py"
HANDLER = """\
import os

LOADED_AT_IMPORT = os.environ.get("CLAIMED", "missing")


def handle(event):
    secrets = os.environ.get("SLESS_SECRETS_DIR", "")
    files = {n: open(os.path.join(secrets, n)).read() for n in sorted(os.listdir(secrets))} if secrets else {}
    return {"env": dict(os.environ), "at_import": LOADED_AT_IMPORT, "cwd": os.getcwd(), "files": files,
            "stdin": os.read(0, 10).decode()}
"""


@pytest.fixture
def code(tmp_path: Path) -> Path:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "handler.py").write_text(HANDLER)
    return folder


def start(procs: Procs, env: dict[str, str], spare: bool) -> tuple[subprocess.Popen[bytes], int]:
    read_fd, write_fd = os.pipe()
    full = {"PATH": os.environ["PATH"], "SLESS_HOST": "127.0.0.1", "SLESS_READY_FD": str(write_fd), **env}
    if spare:
        full["SLESS_SPARE"] = "1"
    proc = subprocess.Popen([sys.executable, "-S", str(SERVER)], env=full, pass_fds=(write_fd,),
                            stdin=subprocess.PIPE if spare else subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(write_fd)
    procs.append(proc)
    return proc, read_fd


def test_the_server_writes_one_byte_once_it_accepts_connections(code: Path, spawn: list) -> None:
    port = free_port()
    _proc, ready = start(spawn, {"PORT": str(port), "SLESS_CODE_DIR": str(code)}, spare=False)
    assert wait_byte(ready) == b"r"
    body = requests.get(f"http://127.0.0.1:{port}/", timeout=10).json()  # no health polling needed
    assert "SLESS_READY_FD" not in body["env"]
    assert wait_byte(ready) == b""  # closed by the server: nothing more comes, and its handler cannot write there


def test_a_spare_becomes_the_function_its_claim_describes(code: Path, spawn: list, tmp_path: Path) -> None:
    port = free_port()
    proc, ready = start(spawn, {"PORT": str(port), "SPARE_ONLY": "x"}, spare=True)
    assert wait_byte(ready) == b"r"  # listening, nothing of the function loaded
    secrets_dir = tmp_path / "secrets"
    claim = {"env": {"PATH": os.environ["PATH"], "PORT": str(port), "SLESS_HOST": "127.0.0.1",
                     "SLESS_CODE_DIR": str(code), "CLAIMED": "yes", "SLESS_SECRETS_DIR": str(secrets_dir)},
             "cwd": str(code), "secrets_dir": str(secrets_dir), "files": [["token", b"file-secret".hex()]]}
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(claim).encode())
    proc.stdin.close()
    assert wait_byte(ready) == b"r"  # serving
    body = requests.get(f"http://127.0.0.1:{port}/", timeout=10).json()
    assert body["at_import"] == "yes"  # the claim's environment was there before the handler's import
    assert body["env"]["CLAIMED"] == "yes" and "SPARE_ONLY" not in body["env"] and "SLESS_SPARE" not in body["env"]
    assert body["cwd"] == str(code) and body["files"] == {"token": "file-secret"} and body["stdin"] == ""
    assert oct(secrets_dir.stat().st_mode & 0o777) == "0o500"
    assert oct((secrets_dir / "token").stat().st_mode & 0o777) == "0o400"


def test_a_spare_whose_stdin_closes_without_a_claim_exits_quietly(spawn: list) -> None:
    proc, ready = start(spawn, {"PORT": str(free_port())}, spare=True)
    assert wait_byte(ready) == b"r"
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(10) == 0


@pytest.mark.parametrize("claim", [b"not json", b"[1, 2]",
                                   json.dumps({"env": {}, "files": [["../escape", "00"]],
                                               "secrets_dir": "/tmp/x-sless-test"}).encode()])
def test_a_bad_claim_ends_the_spare_with_exit_1(spawn: list, claim: bytes) -> None:
    proc, ready = start(spawn, {"PORT": str(free_port())}, spare=True)
    assert wait_byte(ready) == b"r"
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(claim)
    proc.stdin.close()
    assert proc.wait(10) == 1
    assert b"claim" in proc.stderr.read()
