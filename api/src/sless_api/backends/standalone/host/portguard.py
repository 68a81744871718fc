"""Keeps sandboxed tenants off the runtime ports on loopback.

Functions keep the network (they call databases, often on loopback), so a runtime
server's loopback port would be reachable from any other tenant's function, which
could then call it directly, past the proxy and its ``auth: token`` check. When the
platform runs as root, every tenant has its own uid in a known range (sandbox.py),
so an iptables owner match can refuse exactly that: TCP from a tenant uid to a
port a runtime listens on. The platform itself (the proxy) is not a tenant uid and
is unaffected; everything else on loopback stays reachable.

Rules live in a chain of this platform process (``SLESS-<pid>``) jumped to from
OUTPUT for tenant uids only; a chain left by a platform that died without cleaning
up (SIGKILL) is removed by the next one to start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Sequence

log = logging.getLogger("sless.standalone")

_CHAIN = re.compile(r"-j (SLESS-(\d+))\b")


class PortGuard:
    """One platform's iptables chain of refused runtime ports."""

    def __init__(self, iptables: str, uid_range: tuple[int, int]) -> None:
        self.iptables = iptables
        self.chain = f"SLESS-{os.getpid()}"
        self.owner = f"{uid_range[0]}-{uid_range[1]}"
        self._jump = ["-o", "lo", "-p", "tcp", "-m", "owner", "--uid-owner", self.owner, "-j", self.chain]

    @classmethod
    def detect(cls, uid_range: tuple[int, int]) -> PortGuard | None:
        """A guard when this host allows one (root, iptables with the owner match), else None (logged)."""
        iptables = shutil.which("iptables")
        if os.geteuid() != 0 or iptables is None:
            return None
        guard = cls(iptables, uid_range)
        try:
            guard._remove_stale()
            guard._run("-N", guard.chain)
            guard._run("-I", "OUTPUT", *guard._jump)
        except OSError as exc:
            log.warning("runtime ports stay reachable from other tenants' functions: iptables: %s", exc)
            guard.close()
            return None
        return guard

    def block(self, port: int) -> None:
        """Refuse tenant connections to ``port`` (a runtime is about to listen there)."""
        self._run("-A", self.chain, *self._port_rule(port))

    def unblock(self, port: int) -> None:
        with contextlib.suppress(OSError):  # already gone: the chain was removed at shutdown
            self._run("-D", self.chain, *self._port_rule(port))

    def close(self) -> None:
        """Remove this platform's jump and chain."""
        for args in (("-D", "OUTPUT", *self._jump), ("-F", self.chain), ("-X", self.chain)):
            try:
                self._run(*args)
            except OSError:
                continue

    @staticmethod
    def _port_rule(port: int) -> list[str]:
        return ["-p", "tcp", "--dport", str(port), "-j", "REJECT", "--reject-with", "tcp-reset"]

    def _remove_stale(self) -> None:
        """Drop the jumps and chains of platforms that are gone."""
        rules = self._run("-S", "OUTPUT").splitlines()
        for rule in rules:
            match = _CHAIN.search(rule)
            if match is None or os.path.exists(f"/proc/{match.group(2)}"):
                continue
            stale = match.group(1)
            for args in (["-D", *rule.split()[1:]], ["-F", stale], ["-X", stale]):
                try:
                    self._run(*args)
                except OSError:
                    continue

    def _run(self, *args: str) -> str:
        return _iptables([self.iptables, "-w", "5", *args])


def _iptables(argv: Sequence[str]) -> str:
    """Run iptables; any failure is an OSError, so a failed start reads like any other spawn failure."""
    try:
        run = subprocess.run(list(argv), capture_output=True, text=True, timeout=15, check=False)
    except subprocess.TimeoutExpired as exc:
        raise OSError(f"iptables {' '.join(argv[1:])}: timed out") from exc
    if run.returncode != 0:
        raise OSError(f"iptables {' '.join(argv[1:])}: {run.stderr.strip() or run.returncode}")
    return run.stdout
