#!/usr/bin/env python3
"""A real S3 server (moto_server) that outlives one command, for Molecule scenarios.

    s3bed.py up   --state DIR [--port 19000] [--host 127.0.0.1]   start moto_server -H HOST -p PORT
    s3bed.py down --state DIR                  stop it (by its recorded pid), delete DIR

HOST is loopback unless pods must reach the server too: the real node's scenario gives the node's
bridge address (10.199.0.1), which the host and the pods both reach and nothing outside does.
moto_server lives in its own virtualenv (scripts/install-test-services.sh): its botocore pins
conflict with the kubernetes client of the project's venv. It accepts any credentials.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

TOOLS = Path(os.environ.get("SLESS_TOOLS_DIR", "/var/cache/sless-tools"))


def up(state: Path, port: int, host: str = "127.0.0.1", timeout: float = 90) -> str:
    exe = TOOLS / "moto-venv" / "bin" / "moto_server"
    if not exe.exists():
        raise RuntimeError(f"{exe} is missing; run scripts/install-test-services.sh")
    state.mkdir(parents=True, exist_ok=True)
    if (state / "s3.json").exists():
        raise RuntimeError(f"{state} already holds an S3 server; run `s3bed.py down --state {state}` first")
    with (state / "moto.log").open("ab") as out:
        proc = subprocess.Popen([str(exe), "-H", host, "-p", str(port)], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd=state, start_new_session=True)  # fmt: skip
    url = f"http://{host}:{port}"
    (state / "s3.json").write_text(json.dumps({"pid": proc.pid, "url": url}) + "\n")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with {proc.returncode}: {(state / 'moto.log').read_text()[-2000:]}")
        try:
            requests.get(url + "/", timeout=2)
            print(f"[s3bed] moto_server up on {url} (pid {proc.pid})", file=sys.stderr)
            return url
        except requests.RequestException:
            time.sleep(0.2)
    down(state)
    raise RuntimeError(f"moto_server did not answer on {url} within {timeout:.0f}s")


def down(state: Path, grace: float = 10) -> None:
    info = json.loads((state / "s3.json").read_text()) if (state / "s3.json").exists() else {}
    pid = info.get("pid")
    if pid:
        try:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                os.kill(pid, 0)
                time.sleep(0.1)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if state.exists():
        for path in sorted(state.rglob("*"), reverse=True):
            path.unlink() if path.is_file() or path.is_symlink() else path.rmdir()
        state.rmdir()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="s3bed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("verb", choices=["up", "down"])
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--port", type=int, default=19000)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    try:
        if args.verb == "up":
            print(up(args.state.resolve(), args.port, args.host))
        else:
            down(args.state.resolve())
    except RuntimeError as exc:
        print(f"s3bed {args.verb}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
