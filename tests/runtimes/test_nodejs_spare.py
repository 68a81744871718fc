"""The Node server's readiness byte (SLESS_READY_FD) and warm-spare mode (SLESS_SPARE), as plain processes.

The supervisor's side, in the sandbox, is tests/integration/test_spares.py; this is the runtime's own contract,
the same as the Python server's (test_python_spare.py): one byte once it accepts connections, and a spare that
loads nothing of the function before its claim and becomes exactly the process the claim describes.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import requests

from tests.support.services import free_port
from tests.support.spares import Procs, wait_byte

SERVER = Path(__file__).resolve().parents[2] / "runtimes" / "nodejs20" / "server.js"
NODE = shutil.which(os.environ.get("SLESS_NODE") or "node")
HANDLER = """\
'use strict';
const fs = require('node:fs');
const path = require('node:path');

const LOADED_AT_IMPORT = process.env.CLAIMED || 'missing';
const NODE_ENV_AT_IMPORT = process.env.NODE_ENV || 'missing';

exports.handle = async () => {
  const secrets = process.env.SLESS_SECRETS_DIR || '';
  const files = {};
  for (const name of secrets ? fs.readdirSync(secrets).sort() : []) {
    files[name] = fs.readFileSync(path.join(secrets, name), 'utf8');
  }
  let stdin;
  try {
    stdin = fs.readFileSync(0, 'utf8');
  } catch (err) {
    stdin = `error ${err.code}`;
  }
  let helper;
  try {
    helper = require('helperpkg').tag;
  } catch (err) {
    helper = err.code;
  }
  return { env: { ...process.env }, at_import: LOADED_AT_IMPORT, node_env_at_import: NODE_ENV_AT_IMPORT,
           cwd: process.cwd(), files, stdin, helper };
};
"""
ESM_HANDLER = "export async function handle() { return { esm: true, claimed: process.env.CLAIMED }; }\n"

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


@pytest.fixture
def code(tmp_path: Path) -> Path:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "handler.js").write_text(HANDLER)
    return folder


def start(procs: Procs, env: dict[str, str], spare: bool) -> tuple[subprocess.Popen[bytes], int]:
    assert NODE is not None
    read_fd, write_fd = os.pipe()
    full = {"PATH": os.environ["PATH"], "SLESS_HOST": "127.0.0.1", "SLESS_READY_FD": str(write_fd), **env}
    if spare:
        full["SLESS_SPARE"] = "1"
    proc = subprocess.Popen([NODE, str(SERVER)], env=full, pass_fds=(write_fd,),
                            stdin=subprocess.PIPE if spare else subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(write_fd)
    procs.append(proc)
    return proc, read_fd


def claim_of(port: int, code: Path, secrets_dir: Path, **env: str) -> dict[str, object]:
    return {"env": {"PATH": os.environ["PATH"], "PORT": str(port), "SLESS_HOST": "127.0.0.1",
                    "SLESS_CODE_DIR": str(code), "SLESS_SECRETS_DIR": str(secrets_dir), **env},
            "cwd": str(code), "secrets_dir": str(secrets_dir), "files": [["token", b"file-secret".hex()]]}


def send_claim(proc: subprocess.Popen[bytes], claim: bytes) -> None:
    assert proc.stdin is not None
    proc.stdin.write(claim)
    proc.stdin.close()


def test_the_server_writes_one_byte_once_it_accepts_connections(code: Path, spawn: Procs) -> None:
    port = free_port()
    _proc, ready = start(spawn, {"PORT": str(port), "SLESS_CODE_DIR": str(code)}, spare=False)
    assert wait_byte(ready) == b"r"
    body = requests.get(f"http://127.0.0.1:{port}/", timeout=10).json()  # no health polling needed
    assert "SLESS_READY_FD" not in body["env"]
    assert wait_byte(ready) == b""  # closed by the server: nothing more comes, and its handler cannot write there


def test_a_spare_becomes_the_function_its_claim_describes(code: Path, spawn: Procs, tmp_path: Path) -> None:
    port = free_port()
    deps = tmp_path / "deps" / "node_modules" / "helperpkg"
    deps.mkdir(parents=True)
    (deps / "index.js").write_text("exports.tag = 'from-deps';\n")
    proc, ready = start(spawn, {"PORT": str(port), "SPARE_ONLY": "x"}, spare=True)
    assert wait_byte(ready) == b"r"  # listening, nothing of the function loaded
    secrets_dir = tmp_path / "secrets"
    claim = claim_of(port, code, secrets_dir, CLAIMED="yes", NODE_ENV="production",
                     SLESS_DEPS_DIR=str(tmp_path / "deps"), ODD="a b\nc=d é \u2603")
    send_claim(proc, json.dumps(claim).encode())
    assert wait_byte(ready) == b"r"  # serving
    body = requests.get(f"http://127.0.0.1:{port}/", timeout=10).json()
    # The claim's environment was there before the handler's import, and only it.
    assert body["at_import"] == "yes" and body["node_env_at_import"] == "production"
    assert body["env"]["CLAIMED"] == "yes" and body["env"]["ODD"] == "a b\nc=d é \u2603"
    assert "SPARE_ONLY" not in body["env"] and "SLESS_SPARE" not in body["env"]
    assert "SLESS_READY_FD" not in body["env"]
    assert body["helper"] == "from-deps"  # the claim's SLESS_DEPS_DIR resolves packages
    assert body["cwd"] == str(code) and body["files"] == {"token": "file-secret"} and body["stdin"] == ""
    assert oct(secrets_dir.stat().st_mode & 0o777) == "0o500"
    assert oct((secrets_dir / "token").stat().st_mode & 0o777) == "0o400"
    assert wait_byte(ready) == b""  # closed once serving


def test_a_spare_serves_an_es_module_handler_and_the_requests_that_came_while_it_loaded(
    spawn: Procs, tmp_path: Path
) -> None:
    code = tmp_path / "esm"
    code.mkdir()
    (code / "package.json").write_text(json.dumps({"type": "module"}))
    (code / "handler.js").write_text(ESM_HANDLER)
    port = free_port()
    proc, ready = start(spawn, {"PORT": str(port)}, spare=True)
    assert wait_byte(ready) == b"r"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as early:  # waits in the backlog
        early.sendall(b"GET /_/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        send_claim(proc, json.dumps(claim_of(port, code, tmp_path / "s", CLAIMED="esm")).encode())
        assert early.recv(64).startswith(b"HTTP/1.1 200")
    assert wait_byte(ready) == b"r"
    assert requests.get(f"http://127.0.0.1:{port}/", timeout=10).json() == {"esm": True, "claimed": "esm"}


def test_a_spare_whose_stdin_closes_without_a_claim_exits_quietly(spawn: Procs) -> None:
    proc, ready = start(spawn, {"PORT": str(free_port())}, spare=True)
    assert wait_byte(ready) == b"r"
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(10) == 0


@pytest.mark.parametrize("claim", [
    b"not json",
    b"[1, 2]",
    b"null",
    json.dumps({"env": ["A=1"]}).encode(),
    json.dumps({"env": {"A\u0000B": "x"}}).encode(),
    json.dumps({"env": {}, "files": [["../escape", "00"]], "secrets_dir": "/tmp/x-sless-test"}).encode(),
    json.dumps({"env": {}, "files": [["ok", "not hex"]], "secrets_dir": "/tmp/x-sless-test"}).encode(),
    json.dumps({"env": {}, "files": [["ok", "00"]], "secrets_dir": "relative"}).encode(),
    json.dumps({"env": {}, "cwd": "/no/such/folder/here"}).encode(),
], ids=["not-json", "a-list", "null", "env-list", "nul-in-name", "escaping-name", "not-hex", "relative-dir",
        "missing-cwd"])
def test_a_bad_claim_ends_the_spare_with_exit_1(spawn: Procs, claim: bytes) -> None:
    proc, ready = start(spawn, {"PORT": str(free_port())}, spare=True)
    assert wait_byte(ready) == b"r"
    assert proc.stderr is not None
    send_claim(proc, claim)
    assert proc.wait(10) == 1
    assert b"claim" in proc.stderr.read()
    assert not Path("/tmp/x-sless-test").exists()


def test_without_sless_spare_the_server_never_reads_stdin(code: Path, spawn: Procs) -> None:
    """Pods (Kubernetes) never set SLESS_SPARE: the server starts at once, as it always did."""
    assert NODE is not None
    port = free_port()
    proc = subprocess.Popen([NODE, str(SERVER)], stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={"PATH": os.environ["PATH"], "PORT": str(port), "SLESS_HOST": "127.0.0.1",
                                 "SLESS_CODE_DIR": str(code), "SLESS_SPARE": "0"})
    spawn.append(proc)
    assert proc.stderr is not None
    assert b"on http://127.0.0.1" in proc.stderr.readline()  # listening with stdin still open
    assert proc.stdin is not None
    proc.stdin.close()  # the handler reads it
    assert requests.get(f"http://127.0.0.1:{port}/", timeout=10).json()["at_import"] == "missing"
