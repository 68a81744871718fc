"""NetworkPolicy on the real node: kube-router's firewall, and nothing else of kube-router.

The CNI bridge plugin enforces no policy, so without this a NetworkPolicy is an object the API
server stores and nothing obeys. kube-router's network policy controller watches pods,
namespaces and policies and turns them into iptables chains (KUBE-ROUTER-INPUT/FORWARD/OUTPUT
jumped to from the built-in chains, a KUBE-POD-FW-* chain per local pod, a KUBE-NWPLCY-* chain
per policy) and ipsets (KUBE-SRC-*, KUBE-DST-*, TMP-* while swapping). Its router (BGP) and
service proxy (IPVS) stay off: CNI's bridge routes, kube-proxy serves Services. Its health and
metrics servers stay off too: they would listen on every address, and the node exposes nothing
beyond its bridge and loopback; readiness is its top-level chains being in place.

Every chain it makes starts with KUBE-, so the node's iptables sweep removes them; `sweep` here
destroys its ipsets. kube-router leaves both in place when it stops, by design (a restart must
not open the firewall), so the sweep is what cleans up after `down`, a crash or a kill.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from . import procs
from .kubectl import wait_for

BUILD_SH = Path(__file__).resolve().parent.parent / "build-netpol.sh"
NAME = "kube-router"
TOP_CHAINS = ("KUBE-ROUTER-INPUT", "KUBE-ROUTER-FORWARD", "KUBE-ROUTER-OUTPUT")
IPSET_PREFIXES = ("KUBE-SRC-", "KUBE-DST-", "TMP-", "inet6:KUBE-SRC-", "inet6:KUBE-DST-", "inet6:TMP-")


def build() -> Path:
    """Build (or find in the cache) kube-router; returns its folder."""
    proc = subprocess.run(["bash", str(BUILD_SH)], stdout=subprocess.PIPE, stderr=sys.stderr, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{BUILD_SH} failed with exit code {proc.returncode}")
    folder = Path(proc.stdout.strip().splitlines()[-1])
    if not (folder / NAME).is_file():
        raise RuntimeError(f"{folder} lacks {NAME}")
    return folder


def is_built() -> bool:
    proc = subprocess.run(["bash", str(BUILD_SH), "--check"], capture_output=True, text=True, check=False)
    return proc.returncode == 0


def _ipset_names() -> list[str]:
    proc = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True, timeout=30, check=False)
    return proc.stdout.split() if proc.returncode == 0 else []


def ipsets() -> list[str]:
    """kube-router's ipsets present now: `up` refuses to start beside someone else's."""
    return [name for name in _ipset_names() if name.startswith(IPSET_PREFIXES)]


def argv(folder: Path, state: Path, node: str, service_cidr: str) -> list[str]:
    return [
        str(folder / NAME), f"--kubeconfig={state / 'kubeconfig'}", f"--hostname-override={node}",
        "--run-firewall=true", "--run-router=false", "--run-service-proxy=false", "--run-loadbalancer=false",
        f"--service-cluster-ip-range={service_cidr}", "--health-port=0", "--metrics-port=0",
        "--iptables-sync-period=1m", "--v=1",
    ]  # fmt: skip


def _hooked() -> bool:
    """The top-level chains exist and the built-in chains jump to them: the first sync is done."""
    dump = subprocess.run(["iptables-save", "-t", "filter"], capture_output=True, text=True, timeout=30,
                          check=False).stdout  # fmt: skip
    return all(f"-j {chain}" in dump for chain in TOP_CHAINS)


def start(folder: Path, state: Path, node: str, service_cidr: str, timeout: float) -> procs.Started:
    """Start kube-router's firewall against the bed's API server (the node object must exist)."""
    started = procs.start(NAME, argv(folder, state, node, service_cidr), state)
    wait_for("kube-router's firewall chains", _hooked, timeout,
             abort=lambda: None if procs.alive(started) else procs.log_tail(state, NAME))  # fmt: skip
    return started


def sweep() -> list[str]:
    """Destroy kube-router's ipsets (after the iptables sweep: a set in use cannot go)."""
    removed = []
    for name in ipsets():
        subprocess.run(["ipset", "flush", name], capture_output=True, timeout=30, check=False)
    for name in ipsets():
        proc = subprocess.run(["ipset", "destroy", name], capture_output=True, text=True, timeout=30, check=False)
        removed.append(f"ipset {name}" + ("" if proc.returncode == 0 else f" (destroy failed: {proc.stderr.strip()})"))
    return removed
