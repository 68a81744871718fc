"""The syscall probe in a sandboxed process, for the seccomp tests.

Its own module, not the test module's: test_the_filter_holds_without_root runs :func:`run_probe` in a separate
interpreter as uid 65534 (``from tests.support.seccomp_probe import run_probe``), which then needs neither
pytest nor the tests' fixtures, and imports no test module.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from sless_api.backends.standalone.builder import python_interpreter
from sless_api.backends.standalone.host.sandbox import JailSpec, Limits, Prepared, Sandbox

REPO = Path(__file__).resolve().parents[2]
# the hostile function: its ``syscalls`` action calls each refused syscall raw through libc
HANDLER = REPO / "tests" / "e2e" / "hostile" / "handler.py"
PROBE = f"import json, runpy; print(json.dumps(runpy.run_path({str(HANDLER)!r})['syscalls']({{}})))"


def run_jailed(prepared: Prepared, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Start a prepared launch as the platform's callers do (descriptors passed on, then its network attached),
    wait for it, clean up."""
    try:
        proc = subprocess.Popen(prepared.argv, env={"PATH": "/usr/bin:/bin", **prepared.env}, cwd=cwd,
                                preexec_fn=prepared.preexec,  # the sandbox's hook
                                pass_fds=prepared.pass_fds, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        prepared.release_fds()
        prepared.attach()
        out, err = proc.communicate(timeout=60)
        return subprocess.CompletedProcess(prepared.argv, proc.returncode, out, err)
    finally:
        prepared.cleanup()


def run_probe(sandbox: Sandbox) -> dict[str, str]:
    """The probe's answers from a process sandboxed as tenant "t1"."""
    jail = JailSpec(tenant="t1", limits=Limits.for_function(128, "python3.11"), ro_binds=(HANDLER.parent,))
    prepared = sandbox.prepare([str(python_interpreter()), "-S", "-c", PROBE], HANDLER.parent, jail,
                               "seccomp-probe")
    run = run_jailed(prepared, HANDLER.parent)
    assert run.returncode == 0, run.stderr[-2000:]
    answers: dict[str, str] = json.loads(run.stdout)
    return answers
