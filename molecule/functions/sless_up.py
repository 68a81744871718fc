#!/usr/bin/env python3
"""`sless up` for the functions scenario, and a tenant token for the playbook.

    sless_up.py up   --state DIR     start `sless up` on a free port; DIR/platform.json holds its URL and pid,
                                     DIR/token a token of the tenant the playbook deploys as (0600)
    sless_up.py down --state DIR     stop it, delete DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sless_api.auth import issue_token  # noqa: E402
from tests.support.platform import SECRET, start_sless  # noqa: E402

SUB = "molecule-functions"


def up(state: Path) -> None:
    state.mkdir(parents=True, exist_ok=True)
    if (state / "platform.json").exists():
        raise SystemExit(f"{state} already runs a platform; `sless_up.py down --state {state}` first")
    sless = start_sless(state / "data", {"SLESS_IDLE_TIMEOUT_SEC": "3600"})
    (state / "platform.json").write_text(json.dumps({"url": sless.url, "pid": sless.proc.pid,
                                                     "log": str(sless.log_path)}))
    token = state / "token"
    token.write_text(issue_token(SECRET, SUB, 4 * 3600))
    token.chmod(0o600)
    print(f"sless up on {sless.url} (pid {sless.proc.pid})", file=sys.stderr)


def down(state: Path) -> None:
    info_file = state / "platform.json"
    if info_file.exists():
        pid = json.loads(info_file.read_text())["pid"]
        try:
            os.killpg(pid, signal.SIGTERM)
            for _ in range(400):
                os.kill(pid, 0)
                time.sleep(0.1)
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(state, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--state", required=True, type=Path)
    args = parser.parse_args()
    (up if args.action == "up" else down)(args.state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
