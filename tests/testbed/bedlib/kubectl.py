"""A thin kubectl runner: the test bed talks to the apiserver only through kubectl.

kubectl understands every kubeconfig (client certs, tokens, exec plugins), which matters
when the test bed reuses an existing cluster instead of starting its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Kubectl:
    """kubectl bound to one binary and one kubeconfig."""

    def __init__(self, binary: str, kubeconfig: Path | str) -> None:
        self.binary = binary
        self.env = os.environ | {"KUBECONFIG": str(kubeconfig)}

    def run(self, *args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, "--request-timeout=20s", *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            check=False,
        )

    def check(self, *args: str, stdin: str | None = None, timeout: float = 60) -> str:
        proc = self.run(*args, stdin=stdin, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def get_json(self, *args: str) -> Any:
        """The parsed `kubectl get ... -o json` output, or None when the object does not exist."""
        proc = self.run("get", *args, "-o", "json")
        if proc.returncode != 0:
            if "NotFound" in proc.stderr or "not found" in proc.stderr:
                return None
            raise RuntimeError(f"kubectl get {' '.join(args)} failed: {proc.stderr.strip()}")
        return json.loads(proc.stdout)

    def apply(self, manifest: str) -> str:
        return self.check("apply", "-f", "-", stdin=manifest)


def wait_for(
    what: str,
    probe: Callable[[], bool],
    timeout: float,
    interval: float = 0.25,
    abort: Callable[[], str | None] | None = None,
) -> float:
    """Poll PROBE until it returns True; raise after TIMEOUT seconds. Returns the seconds waited.

    ABORT, when given, returns an error text once waiting is pointless (a process died), so a
    crash is reported at once instead of after the whole timeout.
    """
    start = time.monotonic()
    last_error = ""
    while True:
        try:
            if probe():
                return time.monotonic() - start
        except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
            last_error = str(exc)
        if abort is not None:
            reason = abort()
            if reason:
                raise RuntimeError(f"gave up waiting for {what}: {reason}")
        if time.monotonic() - start > timeout:
            detail = f" (last error: {last_error})" if last_error else ""
            raise TimeoutError(f"{what} not reached within {timeout:.0f}s{detail}")
        time.sleep(interval)


def established(crd: Any) -> bool:
    """Whether a CRD (``kubectl get crd NAME -o json``, None when absent) is Established.

    Polled rather than ``kubectl wait --for=condition=Established``: right after the apply a CRD can have no
    ``status.conditions`` yet, and kubectl wait then fails at once ("accessor error: <nil>") instead of waiting.
    """
    if not crd:
        return False
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
