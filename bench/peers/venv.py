"""The peer virtualenv: Flask, waitress and bjoern for the runtime benchmark, never in the project's venv.

It lives outside the repository, in ``${SLESS_TOOLS_DIR:-/var/cache/sless-tools}/bench-peers-venv``
(next to the moto venv of ``scripts/install-test-services.sh``), is created on first use and reused
afterwards. bjoern is a C extension built from source against libev: without the Debian package
``libev-dev`` (or a compiler) it cannot be built, and the benchmark goes on without its rows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

FLASK_SPECS = ("flask>=3,<4", "waitress>=3,<4")
BJOERN_SPEC = "bjoern==3.2.2"
LIBEV_HEADER = Path("/usr/include/ev.h")


def venv_dir() -> Path:
    return Path(os.environ.get("SLESS_TOOLS_DIR", "/var/cache/sless-tools")) / "bench-peers-venv"


@dataclass
class PeerEnv:
    """What the peer venv can run: its interpreter, and why a stack is missing (None: available)."""

    python: Path
    flask_error: str | None
    bjoern_error: str | None


def _imports(python: Path, modules: str) -> bool:
    return subprocess.run([str(python), "-c", f"import {modules}"], capture_output=True, timeout=120,
                          check=False).returncode == 0


def _pip(python: Path, specs: tuple[str, ...], log: Callable[[str], None]) -> str | None:
    """pip install, its progress on stderr; the tail of its output when it fails."""
    log(f"pip install {' '.join(specs)} into {python.parent.parent}")
    proc = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off",
                           *specs], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900,
                          check=False)
    for line in proc.stdout.splitlines():
        if line.startswith(("Collecting", "Building", "Successfully", "ERROR")):
            log("  " + line.strip())
    if proc.returncode == 0:
        return None
    tail = [line.strip() for line in proc.stdout.splitlines() if line.strip()][-6:]
    return " | ".join(tail) or f"pip exited {proc.returncode}"


def ensure(log: Callable[[str], None]) -> PeerEnv:
    """Create or complete the peer venv; never raises for a stack that cannot be installed."""
    root = venv_dir()
    python = root / "bin" / "python"
    if not python.exists():
        log(f"creating the peer virtualenv {root} (once; later runs reuse it)")
        root.parent.mkdir(parents=True, exist_ok=True)
        # the base interpreter, not the project venv's: a venv made from a venv would chain to it
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(root)], check=True, timeout=300)
    flask_error = None
    if not _imports(python, "flask, waitress"):
        flask_error = _pip(python, FLASK_SPECS, log)
    bjoern_error = None
    if not _imports(python, "bjoern"):
        if not LIBEV_HEADER.exists():
            bjoern_error = f"bjoern cannot be built: {LIBEV_HEADER} missing (apt-get install libev-dev)"
        else:
            failure = _pip(python, (BJOERN_SPEC,), log)
            if failure:
                bjoern_error = f"bjoern could not be built: {failure}"
    if flask_error:
        flask_error = f"Flask/waitress could not be installed: {flask_error}"
        bjoern_error = bjoern_error or flask_error
    return PeerEnv(python, flask_error, bjoern_error)
