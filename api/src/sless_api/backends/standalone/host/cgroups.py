"""cgroup v1 memory and pids groups for sandboxed process trees (see sandbox.py).

Each sandboxed process tree gets fresh cgroups, nested under the platform's own
cgroup in each hierarchy, so every function stays inside whatever limits the
platform itself runs under. A tree's cgroups are removed with it (anything left
in them is killed first); those of a platform that died by SIGKILL are removed by
the next one to start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path


def _own_cgroup_path(controller: str) -> str | None:
    """This process's path in a cgroup v1 hierarchy (from /proc/self/cgroup)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and controller in parts[1].split(","):
            return parts[2]
    return None


def _v1_mount(controller: str) -> Path | None:
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup" and controller in fields[3].split(","):
            return Path(fields[1])
    return None


class Cgroups:
    """Memory and pids cgroups (v1) for sandboxed process trees, nested under the platform's own.

    Nesting keeps every function inside whatever limits the platform itself
    runs under. Only usable by root (the hierarchies are root-owned); the
    unified (v2) hierarchy is not used because this kind of host delegates no
    controllers to it.
    """

    def __init__(self, bases: dict[str, Path]) -> None:
        self.bases = bases

    @classmethod
    def detect(cls) -> Cgroups | None:
        if os.geteuid() != 0:
            return None
        bases: dict[str, Path] = {}
        for controller in ("memory", "pids"):
            mount = _v1_mount(controller)
            own = _own_cgroup_path(controller)
            if mount is None or own is None:
                continue
            parent = mount / own.lstrip("/")
            base = parent / f"sless-{os.getpid()}"
            _remove_stale(parent)
            try:
                base.mkdir(parents=True, exist_ok=True)
                probe = base / "probe"
                probe.mkdir(exist_ok=True)
                limit_file = "memory.limit_in_bytes" if controller == "memory" else "pids.max"
                (probe / limit_file).write_text("67108864" if controller == "memory" else "64")
                probe.rmdir()
            except OSError:
                continue
            bases[controller] = base
        return cls(bases) if "memory" in bases else None

    def create(self, label: str, memory_mb: int | None, pids: int) -> CgroupSet:
        """Fresh cgroups for one process tree: ``memory_mb`` of memory (None: unlimited), ``pids`` tasks."""
        paths: dict[str, Path] = {}
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)
        for controller, base in self.bases.items():
            path = base / f"{safe}-{time.monotonic_ns()}"
            path.mkdir()
            paths[controller] = path
        group = CgroupSet(paths)
        try:
            if "memory" in paths and memory_mb:
                limit = str(memory_mb * 1024 * 1024)
                (paths["memory"] / "memory.limit_in_bytes").write_text(limit)
                with contextlib.suppress(OSError):  # only with swap accounting
                    (paths["memory"] / "memory.memsw.limit_in_bytes").write_text(limit)
            if "pids" in paths:
                (paths["pids"] / "pids.max").write_text(str(pids))
        except OSError:
            group.destroy()
            raise
        return group

    def close(self) -> None:
        """Remove the platform's parent cgroups (empty once every function stopped)."""
        for base in self.bases.values():
            for child in base.iterdir() if base.is_dir() else []:
                if child.is_dir():
                    _destroy_dir(child)
            with contextlib.suppress(OSError):
                base.rmdir()


def _remove_stale(parent: Path) -> None:
    """Remove the cgroups of earlier platforms that died without cleaning up (SIGKILL)."""
    for old in parent.glob("sless-*"):
        pid = old.name.removeprefix("sless-")
        if not pid.isdigit() or int(pid) == os.getpid() or Path(f"/proc/{pid}").exists():
            continue
        for child in old.iterdir():
            if child.is_dir():
                _destroy_dir(child)
        with contextlib.suppress(OSError):
            old.rmdir()


def _destroy_dir(path: Path) -> None:
    """SIGKILL everything left in one cgroup and remove it."""
    for _ in range(50):
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            break
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        path.rmdir()


@dataclass
class CgroupSet:
    """The cgroups of one process tree."""

    paths: dict[str, Path]
    procs: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.procs = [str(p / "cgroup.procs") for p in self.paths.values()]

    def join(self) -> None:
        """Move the calling process in (called after fork, before exec, while still root)."""
        pid = str(os.getpid()).encode()
        for procs in self.procs:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    def set_memory(self, memory_mb: int | None) -> None:
        """Change the memory limit of a running tree (a warm spare at its claim); None: unlimited.

        The swap-inclusive limit may never be below the memory limit, so the order of the two writes
        depends on the direction. Raises OSError when the tree uses more than a lowered limit allows.
        """
        path = self.paths.get("memory")
        if path is None:
            raise OSError("no memory cgroup")
        limit = str(memory_mb * 1024 * 1024) if memory_mb else "-1"
        files = [path / "memory.limit_in_bytes", path / "memory.memsw.limit_in_bytes"]
        swap = files[1].exists()
        if swap and memory_mb:
            current = int(files[0].read_text())
            if memory_mb * 1024 * 1024 > current:
                files.reverse()  # raising: the swap-inclusive limit first
        elif swap:
            files.reverse()
        for file in files:
            if file.exists():
                file.write_text(limit)

    def oom_kills(self) -> int:
        """How many processes the kernel killed for exceeding the memory limit."""
        path = self.paths.get("memory")
        if path is None:
            return 0
        try:
            for line in (path / "memory.oom_control").read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
            return 1 if int((path / "memory.failcnt").read_text()) else 0
        except (OSError, ValueError):
            return 0

    def memory_limit_hits(self) -> int:
        """How often the memory usage reached the limit (``memory.failcnt``), reclaimed or not."""
        path = self.paths.get("memory")
        if path is None:
            return 0
        try:
            return int((path / "memory.failcnt").read_text())
        except (OSError, ValueError):
            return 0

    def destroy(self) -> None:
        for path in self.paths.values():
            _destroy_dir(path)
