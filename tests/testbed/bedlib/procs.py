"""Start control-plane processes detached, remember them in pid files, stop them again.

Each process gets its own session (so a Ctrl-C in the caller's terminal or the end of the
`testbed up` process does not reach it) and its own log file. The pid file also records the
executable, so `down` never signals a recycled pid that now belongs to someone else.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Started:
    """A process this test bed started."""

    name: str
    pid: int
    exe: str


def start(name: str, argv: list[str], state: Path, env: dict[str, str] | None = None) -> Started:
    """Start ARGV detached with output to STATE/NAME.log and its pid in STATE/pids/NAME.json."""
    log = (state / f"{name}.log").open("ab")
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=state,
            env=env,
        )
    finally:
        log.close()
    started = Started(name, proc.pid, os.path.realpath(argv[0]))
    piddir = state / "pids"
    piddir.mkdir(exist_ok=True)
    (piddir / f"{name}.json").write_text(json.dumps(started.__dict__ | {"argv": argv, "at": time.time()}))
    return started


def recorded(state: Path) -> list[Started]:
    """The processes recorded in STATE, newest first (the order to stop them in)."""
    found: list[tuple[float, Started]] = []
    for path in (state / "pids").glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        found.append((float(data.get("at", 0)), Started(data["name"], int(data["pid"]), data["exe"])))
    return [s for _, s in sorted(found, key=lambda item: item[0], reverse=True)]


def alive(proc: Started) -> bool:
    """Whether PROC still runs as the executable we started (not a zombie, not a recycled pid)."""
    try:
        exe = os.readlink(f"/proc/{proc.pid}/exe")
        with open(f"/proc/{proc.pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and exe.removesuffix(" (deleted)") == proc.exe


def exited_early(proc: Started) -> bool:
    """True when PROC is gone; used while waiting so a crash fails fast instead of timing out."""
    return not alive(proc)


def _signal_group(proc: Started, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)  # start_new_session made the pid its own process group id
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(proc.pid, sig)


def stop(procs: list[Started], grace: float = 10.0) -> list[str]:
    """SIGTERM every live process in PROCS, SIGKILL those still alive after GRACE seconds.

    Returns the names that needed SIGKILL.
    """
    live = [p for p in procs if alive(p)]
    for proc in live:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in live):
        time.sleep(0.1)
    killed = [p for p in live if alive(p)]
    for proc in killed:
        _signal_group(proc, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(p) for p in killed):
        time.sleep(0.05)
    return [p.name for p in killed]


def log_tail(state: Path, name: str, lines: int = 15) -> str:
    """The last LINES lines of NAME's log, for error messages."""
    try:
        text = (state / f"{name}.log").read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])
