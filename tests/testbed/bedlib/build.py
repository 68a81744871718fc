"""Run build.sh, which compiles the pinned binaries once into a versioned cache folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BUILD_SH = Path(__file__).resolve().parent.parent / "build.sh"
NOT_BUILT = 3  # build.sh --check: the binaries for this key are not in the cache
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "kube-proxy",
    "kwok",
    "helm",
)


def build() -> Path:
    """Build (or find in the cache) every binary; returns the bin folder. Progress goes to stderr."""
    proc = subprocess.run(["bash", str(BUILD_SH)], stdout=subprocess.PIPE, stderr=sys.stderr, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{BUILD_SH} failed with exit code {proc.returncode}")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"{BUILD_SH} printed no bin folder")
    bin_dir = Path(lines[-1])
    missing = [b for b in BINARIES if not (bin_dir / b).is_file()]
    if missing:
        raise RuntimeError(f"{bin_dir} lacks {', '.join(missing)}")
    return bin_dir


def is_built() -> bool:
    """Whether build.sh would find everything in its cache (a cheap check, builds nothing)."""
    proc = subprocess.run(["bash", str(BUILD_SH), "--check"], capture_output=True, text=True, check=False)
    if proc.returncode not in (0, NOT_BUILT):
        raise RuntimeError(f"{BUILD_SH} --check failed: {proc.stderr.strip()}")
    return proc.returncode == 0


def k8s_version(bin_dir: Path) -> str:
    """The Kubernetes version the folder was built for: its name starts with it (v1.34.4-...)."""
    return bin_dir.name.split("-", 1)[0]
