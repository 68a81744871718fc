"""A real ``sless-events`` process (the event dispatcher): started, probed, stopped and killed by the tests."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

START_TIMEOUT = 60


def events_command() -> list[str]:
    script = Path(sys.executable).parent / "sless-events"
    return [str(script)] if script.exists() else [sys.executable, "-m", "sless_api.main.events"]


class Events:
    """One ``sless-events`` process (restartable: each start logs to its own file)."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.port = int(env["SLESS_EVENTS_PORT"])
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, wait_ready: bool = True) -> Events:
        assert self.proc is None or self.proc.poll() is not None
        self.starts += 1
        with open(self.log_dir / f"events-{self.starts}.log", "wb") as out:
            self.proc = subprocess.Popen(events_command(), env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.wait("/health answers", lambda: self.get("/health") is not None)
        if wait_ready:
            self.wait("/ready", lambda: (self.get("/ready") or {}).get("status") == "ready")
        return self

    def get(self, path: str) -> dict[str, Any] | None:
        try:
            resp = requests.get(self.url + path, timeout=2)
        except requests.RequestException:
            return None
        body: dict[str, Any] = resp.json()
        body["_code"] = resp.status_code
        return body

    def stats(self) -> dict[str, int]:
        return dict((self.get("/ready") or {}).get("stats") or {})

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def term(self, timeout: float = 60) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                raise AssertionError(f"no exit within {timeout}s of SIGTERM\n{self.log_tail()}") from None
        return self.proc.returncode

    def log_tail(self, lines: int = 80) -> str:
        out = []
        for n in range(1, self.starts + 1):
            text = (self.log_dir / f"events-{n}.log").read_text(errors="replace").splitlines()
            out.append(f"--- events-{n}.log\n" + "\n".join(text[-lines:]))
        return "\n".join(out)

    def wait(self, what: str, probe: Callable[[], Any], timeout: float = START_TIMEOUT) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"sless-events exited ({self.proc.returncode}) waiting for {what}\n"
                                     + self.log_tail())
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout:.0f}s\n{self.log_tail()}")
            time.sleep(0.1)
