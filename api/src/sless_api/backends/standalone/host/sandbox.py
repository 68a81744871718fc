"""Per-tenant sandboxes for the standalone backend's function processes.

A tenant's code (its runtime server, its one-shot runner, the dependency install
of its build) must not reach the platform or another tenant: not the data dir
with the JWT secret and the databases, not other tenants' code or
``/proc/<pid>/environ``, not the platform's process to signal it. Each such
process therefore runs under bubblewrap (``bwrap``):

- its own PID namespace (``--unshare-pid``): it sees and signals only its own
  processes; when the namespace's PID 1 dies the kernel kills every process in
  it, and ``--die-with-parent`` plus a parent-death signal on ``bwrap`` itself
  make that happen when the platform dies, even by SIGKILL;
- a private mount view: the toolchain folders read-only (``/usr``, the Python
  prefix, the runtime wrappers), a few ``/etc`` files for DNS and TLS, its own
  code, dependency cache and binary read-only, a size-capped private ``/tmp``;
- its own user: when the platform runs as root, a per-tenant unprivileged uid
  derived from the namespace (``setpriv`` drops to it inside the sandbox, after
  ``bwrap`` built the mounts with root's rights); otherwise a user namespace;
- limits: a memory cgroup (v1 ``memory`` controller, nested under the
  platform's own cgroup) of ``memory_mb``, a ``pids`` cgroup, RLIMIT_NPROC per
  tenant uid, RLIMIT_FSIZE, RLIMIT_CPU for runners; RLIMIT_AS with headroom
  where no memory cgroup can be made;
- a syscall filter (seccomp.py) that bwrap applies before it executes the
  command: io_uring, keyrings, bpf, mounts, namespaces, ptrace, other ABIs and
  more answer EPERM. Without libseccomp the sandbox counts as unavailable.

- as root, a network namespace of its own (network.py): pasta gives it
  outbound access and forwards the runtime's port from the host's loopback,
  so a function sees only its own sockets and reaches none of the host's
  loopback services but the ones an operator lists (SLESS_SANDBOX_HOST_PORTS).
  Without root (or with SLESS_SANDBOX_NETWORK=host) the host's network is
  shared, and as root the runtime ports are then closed to tenant uids
  (portguard.py).

``SLESS_SANDBOX`` chooses: ``auto`` (default: bwrap when it works here, else
none, for which the platform refuses to start: platform.py), ``bwrap``
(required) or ``off`` (processes run as the platform's user with a filtered
environment and per-process limits; single-tenant use only).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sless_api.backends.settings import SandboxSettings
from sless_api.backends.standalone.host import seccomp
from sless_api.backends.standalone.host.cgroups import Cgroups, CgroupSet
from sless_api.backends.standalone.host.network import NetnsLaunch, Pasta
from sless_api.backends.standalone.host.portguard import PortGuard
from sless_api.backends.standalone.host.process import set_parent_death_signal

#: The host-wide limits when the caller has no config (tests of the sandbox alone).
HOST_DEFAULTS = SandboxSettings()

#: First uid of the per-tenant range; the span keeps collisions between tenants rare.
UID_BASE = 100_000
UID_SPAN = 1 << 30
#: /etc entries a function or a build may need (DNS, TLS roots, time zone, and the alternatives that Debian's
#: /usr/bin/awk and friends point through); the rest of /etc stays out.
ETC_FILES = (
    "resolv.conf", "hosts", "nsswitch.conf", "host.conf", "gai.conf", "services", "protocols",
    "localtime", "ssl", "ca-certificates", "ca-certificates.conf", "pki", "mime.types", "pip.conf", "npmrc",
    "alternatives",
)
#: Top-level folders that are either symlinks into /usr (merged /usr) or toolchain folders.
SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
#: Virtual address space allowed beyond memory_mb when RLIMIT_AS stands in for a cgroup.
#: Runtimes reserve far more address space than they touch; measured idle servers (VSZ / RSS):
#: python3.11 230 MB / 14 MB plus 2 MiB of stack reserved per handler thread (and, without
#: MALLOC_ARENA_MAX, up to 64 MB of malloc arena per thread: 32 connections then failed
#: at +512 MB), node 20 730 MB / 45 MB, a Go 1.23 server 1.26 GB / 6 MB (heap arenas are
#: reserved ahead). Hence a loose bound: it stops a runaway allocation, not a small excess.
#: Python's gets 2 GiB more for the stacks of the runtime's 1,000 handler threads (a call whose
#: handler sleeps holds one): with 1 GiB, threads failed to start at about 525, and a thousand
#: sleeping calls waited for each other (1,000 concurrent 5 s calls took 10.9 s, with 3 GiB 6.8 s).
AS_HEADROOM_MB = {"python3.11": 3072, "nodejs20": 2048, "go1.23": 2048}
#: glibc malloc arenas when RLIMIT_AS is the memory limit (each reserves 64 MB of address space).
MALLOC_ARENAS = "2"
AS_HEADROOM_DEFAULT_MB = 2048
#: The sandbox's private tmpfs (mounted fresh per process, not the host's /tmp).
SANDBOX_TMP = "/tmp"  # noqa: S108
#: Where a sandboxed function finds the secrets it references as files ($SLESS_SECRETS_DIR).
SECRETS_DIR = "/run/sless/secrets"
#: What glibc ignores in a setuid program's environment (its "unsecure" variables, and GLIBC_TUNABLES; not
#: TMPDIR, which the sandbox sets): they make the dynamic loader load, or write, files the environment names.
#: A launch's environment holds the tenant's variables, and bwrap starts outside the sandbox (as root, or as
#: the platform's user): LD_PRELOAD=<its own code>/x.so would run tenant code there. So the launch empties
#: them (Prepared.env, which every caller applies last) and bwrap unsets them for the command. Only variables
#: that an empty value switches off are here: LD_SHOW_AUXV and LD_DYNAMIC_WEAK act on being set at all (they
#: load nothing; printing the loader's auxiliary vector and weak-symbol binding).
LOADER_ENV = (
    "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LD_AUDIT", "LD_DEBUG", "LD_DEBUG_OUTPUT",
    "LD_HWCAP_MASK", "LD_LIBRARY_PATH", "LD_ORIGIN_PATH", "LD_PRELOAD", "LD_PROFILE", "LD_USE_LOAD_BIAS",
    "LOCALDOMAIN", "LOCPATH", "MALLOC_TRACE", "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR",
)

class SandboxUnavailable(Exception):
    """A sandbox was required (SLESS_SANDBOX=bwrap) but cannot be made on this host."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed process tree. None means "not limited"."""

    memory_mb: int | None = None
    #: Processes and threads of the tree (pids cgroup) and of the tenant's uid (RLIMIT_NPROC).
    nproc: int = 256
    fsize_mb: int = 256
    cpu_sec: int | None = None
    tmp_mb: int = 64
    nofile: int = 4096
    runtime: str = ""

    @classmethod
    def for_function(cls, memory_mb: int | None, runtime: str = "", cpu_sec: int | None = None,
                     host: SandboxSettings = HOST_DEFAULTS) -> Limits:
        """The limits of a function's process, with the host-wide knobs of HOST.

        The private /tmp is memory (tmpfs pages count against the memory cgroup), so it
        gets at most half of ``memory_mb``: a full /tmp answers ENOSPC instead of an OOM kill.
        """
        tmp_mb = host.tmp_mb
        if memory_mb:
            tmp_mb = max(1, min(tmp_mb, memory_mb // 2))
        return cls(
            memory_mb=memory_mb,
            nproc=host.nproc,
            fsize_mb=host.fsize_mb,
            tmp_mb=tmp_mb,
            cpu_sec=cpu_sec,
            runtime=runtime,
        )


def _address_space_env(limits: Limits, cgroup: CgroupSet | None) -> dict[str, str]:
    """With RLIMIT_AS as the memory limit, cap glibc's per-thread arenas (address space, not memory)."""
    return {"MALLOC_ARENA_MAX": MALLOC_ARENAS} if limits.memory_mb and cgroup is None else {}


@dataclass(frozen=True)
class JailSpec:
    """What one sandboxed process may see: the tenant and the extra paths beyond the toolchain."""

    tenant: str
    limits: Limits
    ro_binds: tuple[Path, ...] = ()
    rw_binds: tuple[Path, ...] = ()
    #: Build tools (go build) that run no tenant code: only a PID namespace, so they die with the platform.
    reaper_only: bool = False
    #: Files (name, content) the process finds read-only in $SLESS_SECRETS_DIR: its secrets referenced as
    #: files. Sandboxed they exist only inside its mount view (copied in from a memfd, never on disk).
    files: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)
    #: A network namespace of its own when the sandbox offers one (function processes); build steps keep the
    #: host's network, which reaches the package registries and mirrors an operator configured.
    own_network: bool = True


def tenant_uid(tenant: str) -> int:
    """The unprivileged uid of a tenant (also its gid): stable, derived from the namespace."""
    digest = hashlib.sha256(tenant.encode()).digest()
    return UID_BASE + int.from_bytes(digest[:8], "big") % UID_SPAN


def _set_limit(which: int, value: int, hard_value: int | None = None) -> None:
    """Lower a limit (never above the current hard limit: the platform may not be allowed to raise it)."""
    _soft, hard = resource.getrlimit(which)
    new_hard = value if hard_value is None else hard_value
    if hard != resource.RLIM_INFINITY:
        value, new_hard = min(value, hard), min(new_hard, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(which, (value, new_hard))


# ---------------------------------------------------------------------- the sandbox


@dataclass
class Prepared:
    """One process's sandboxed launch: the argv to exec, the hook to run between fork and exec."""

    argv: list[str]
    preexec: Callable[[], None]
    env: dict[str, str]
    limits: Limits
    cgroup: CgroupSet | None = None
    sandboxed: bool = False
    #: Undoes what prepare() set up outside the process (a port rule), once, at cleanup.
    on_cleanup: Callable[[], None] | None = None
    #: Descriptors the child must inherit (the secret files' memfds bwrap copies in); released after spawn.
    pass_fds: tuple[int, ...] = ()
    #: The process's own network namespace, set up by attach() once it is spawned (network.py).
    netns: NetnsLaunch | None = None
    _cleaned: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _oom_kills: int = 0
    _memory_limit_hits: int = 0

    def oom_kills(self) -> int:
        # Under the lock: cleanup() (in a worker thread) keeps the counts and then removes the cgroup, so a
        # read that checked _cleaned just before would find no file and report 0, and a call killed by its
        # memory limit would get a bare 502 instead of the reason.
        with self._lock:
            if self.cgroup is None or self._cleaned:
                return self._oom_kills
            return self.cgroup.oom_kills()

    def memory_limit_hits(self) -> int:
        with self._lock:
            if self.cgroup is None or self._cleaned:
                return self._memory_limit_hits
            return self.cgroup.memory_limit_hits()

    def exit_note(self, returncode: int | None) -> str | None:
        """Why the process ended, when a limit ended it (for the call's or job's error message).

        A process that ended abnormally after its memory reached the limit counts as killed by it even
        without an OOM kill: on a busy host it can thrash at the limit, reclaiming its own pages, until its
        health probes give up and it is killed for that instead.
        """
        if self.oom_kills() or (returncode != 0 and self.memory_limit_hits()):
            return f"killed: the function exceeded its memory limit of {self.limits.memory_mb} MB"
        if returncode is None:
            return None
        code = -returncode if returncode < 0 else returncode - 128
        if code == signal.SIGXCPU and self.limits.cpu_sec:
            return f"killed: the function used more than its {self.limits.cpu_sec} s of CPU time"
        if code == signal.SIGXFSZ:
            return f"killed: the function wrote a file larger than its limit of {self.limits.fsize_mb} MB"
        return None

    def signal_main(self, pid: int, sig: int) -> None:
        """Send ``sig`` to the function's own process (inside the sandbox), else to ``pid``.

        bwrap does not forward signals; SIGTERM must reach the runtime for it to
        drain, so it goes to the process the sandbox's init runs.
        """
        target = inner_pid(pid) if self.sandboxed else None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target or pid, sig)

    def kill(self, pid: int) -> None:
        """SIGKILL the whole sandbox whose outer bwrap is ``pid``.

        The sandbox's PID 1 (bwrap's init, the outer bwrap's child) goes first: the
        kernel then kills everything in its PID namespace and the outer bwrap reaps
        it and exits. Killing the outer one first would orphan the init to the
        host's PID 1, which not every container reaps.
        """
        if self.sandboxed:
            for child in _children(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(child, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)

    def release_fds(self) -> None:
        """Close our copies of ``pass_fds`` (once the child has its own, or when it never started)."""
        fds, self.pass_fds = self.pass_fds, ()
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.netns is not None:
            self.netns.release_child_fds()

    def attach(self) -> None:
        """After the spawn (and release_fds): give the process its network and let it start.

        Blocking: call it from a worker thread. Raises NetworkUnavailable; the caller kills the process,
        which never ran its command.
        """
        if self.netns is not None:
            self.netns.attach()

    def cleanup(self) -> None:
        """Kill what is left of the tree and remove its cgroups (idempotent, thread-safe: the
        supervisor's exit watcher and its kill path may both get here, each from a worker thread)."""
        self.release_fds()
        with self._lock:
            if self._cleaned:
                return
            if self.cgroup is not None:
                self._oom_kills = self.cgroup.oom_kills()
                self._memory_limit_hits = self.cgroup.memory_limit_hits()
            self._cleaned = True
        if self.cgroup is not None:
            self.cgroup.destroy()
        if self.netns is not None:
            self.netns.close()
        if self.on_cleanup is not None:
            self.on_cleanup()


def _process_tree() -> dict[int, list[int]]:
    """Children of every process, from /proc (this kernel has no /proc/<pid>/task/<tid>/children)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    return parents


def _processes_of(uid: int) -> int:
    """Processes (and threads: RLIMIT_NPROC counts tasks) a uid runs now."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
            except OSError:
                continue
    return count


def _children(pid: int) -> list[int]:
    return sorted(_process_tree().get(pid, []))


def inner_pid(outer: int) -> int | None:
    """The host pid of the command bwrap runs: outer bwrap -> its init (PID 1) -> the command."""
    parents = _process_tree()
    pid = outer
    for _ in range(2):
        children = sorted(parents.get(pid, []))
        if not children:
            return None if pid == outer else pid
        pid = children[0]
    return pid


def _parent_dirs(dests: Sequence[Path]) -> list[str]:
    """bwrap options creating the ancestors of bind targets traversable only (0111: not listable, not even
    by their owner, which a user-namespace sandbox is).

    Running as root, bwrap would create them 0700, and the tenant's uid could not
    reach its own code. /usr (bound from the host) and /tmp (its own tmpfs) exist already.
    """
    out: list[str] = []
    seen: set[Path] = {Path("/"), Path(SANDBOX_TMP)}
    for dest in dests:
        for parent in reversed(dest.parents):
            if parent in seen or parent.is_relative_to("/usr"):
                continue
            seen.add(parent)
            out += ["--perms", "0111", "--dir", str(parent)]
    return out


def _memfd(name: str, content: bytes) -> int:
    """An anonymous in-memory file holding CONTENT, read from its start (what ``--ro-bind-data`` copies)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _private_files(files: Sequence[tuple[str, bytes]]) -> str:
    """Without a sandbox, the files go to a fresh 0700 folder, in memory (/dev/shm) where there is one."""
    shm = Path("/dev/shm")  # noqa: S108 - a private mkdtemp folder inside it
    folder = tempfile.mkdtemp(prefix="sless-secrets-", dir=str(shm) if shm.is_dir() else None)
    for name, content in files:
        fd = os.open(Path(folder) / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
        with os.fdopen(fd, "wb") as out:
            out.write(content)
    return folder


def _die_with_platform() -> None:
    """preexec of the platform's helpers (pasta): SIGKILL when the platform dies."""
    set_parent_death_signal(signal.SIGKILL)


def _network(setting: str, host_ports: Sequence[int]) -> tuple[Pasta | None, str | None]:
    """pasta for functions' own namespaces per SETTING (auto, own, host), or why the sandbox cannot be had."""
    if setting == "host":
        return None, None
    if os.geteuid() != 0:
        if setting == "own":
            return None, "SLESS_SANDBOX_NETWORK=own needs the platform to run as root"
        return None, None
    pasta = Pasta.find(host_ports)
    if pasta is None:
        return None, ("pasta (Debian package passt) is not installed: functions would share the host's network "
                      "and reach its loopback services (install it, or set SLESS_SANDBOX_NETWORK=host)")
    return pasta, None


def _works(bwrap: str) -> str | None:
    """None if a PID-namespaced bwrap can run here, else why not."""
    argv = [bwrap, "--unshare-pid", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc",
            "--dev", "/dev", "--", "true"]
    if os.geteuid() != 0:
        argv.insert(1, "--unshare-user")
    try:
        run = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{bwrap} cannot run: {exc}"
    if run.returncode != 0:
        return f"{bwrap} cannot create namespaces here: {run.stderr.strip() or run.returncode}"
    return None


class Sandbox:
    """How this platform runs tenant processes; made once at start-up by :meth:`detect`."""

    def __init__(self, *, bwrap: str | None, reason: str, toolchain: Sequence[Path] = (),
                 cgroups: Cgroups | None = None, setpriv: str | None = None,
                 port_guard: PortGuard | None = None, syscall_filter: bool = False,
                 pasta: Pasta | None = None) -> None:
        self.bwrap = bwrap
        #: Why the sandbox is on or off, for the start-up log and the refusal message.
        self.reason = reason
        self.toolchain = tuple(toolchain)
        self.cgroups = cgroups
        self.as_root = os.geteuid() == 0
        self.setpriv = setpriv
        #: Refuses tenant uids' connections to runtime ports (root only; see portguard.py).
        self.port_guard = port_guard
        #: Jailed processes run under the seccomp filter (seccomp.py); detect() turns it on.
        self.syscall_filter = syscall_filter
        #: Function processes get a network namespace of their own through it (network.py); root only.
        self.pasta = pasta

    @property
    def enabled(self) -> bool:
        return self.bwrap is not None

    @classmethod
    def off(cls, reason: str = "SLESS_SANDBOX=off") -> Sandbox:
        return cls(bwrap=None, reason=reason)

    @classmethod
    def detect(cls, setting: str = "auto", toolchain: Sequence[Path] = (), network: str = "auto",
               host_ports: Sequence[int] = ()) -> Sandbox:
        """The sandbox for ``setting`` (auto, bwrap, off: ``SandboxSettings.mode``).

        ``network`` (``SandboxSettings.network``): ``auto`` gives functions a namespace of their own when the
        platform runs as root (and refuses to start without pasta: deny by default), ``own`` requires one,
        ``host`` shares the host's network. ``host_ports``: host loopback ports functions may reach.
        """
        mode = setting.strip().lower()
        if mode in ("off", "0", "false", "none"):
            return cls.off()
        if mode not in ("auto", "bwrap", "on", "1", "true"):
            raise SandboxUnavailable(f"SLESS_SANDBOX={mode!r}: expected auto, bwrap or off")
        bwrap = shutil.which("bwrap")
        problem = "bwrap (Debian package bubblewrap) is not installed" if bwrap is None else _works(bwrap)
        setpriv = shutil.which("setpriv")
        if problem is None and os.geteuid() == 0 and setpriv is None:
            problem = "setpriv (util-linux) is missing: cannot drop to a per-tenant uid"
        if problem is None:
            # Deny by default: a sandbox without its syscall filter is not offered (auto then refuses to start).
            problem = seccomp.problem()
        pasta, network_problem = _network(network, host_ports)
        problem = problem or network_problem
        if problem is not None:
            if mode == "auto":
                return cls.off(problem)
            raise SandboxUnavailable(problem)
        assert bwrap is not None
        cgroups = Cgroups.detect()
        # Own namespaces make the port rule moot: no tenant reaches the host's loopback at all.
        guard = None
        if os.geteuid() == 0 and pasta is None:
            guard = PortGuard.detect((UID_BASE, UID_BASE + UID_SPAN - 1))
        how = "per-tenant uids" if os.geteuid() == 0 else "user namespaces"
        memory = "memory cgroups" if cgroups is not None else "RLIMIT_AS (no writable memory cgroup)"
        ports = ", runtime ports closed to tenants (iptables)" if guard is not None else ""
        net = "a network namespace each (pasta)" if pasta is not None else "the host's network"
        reason = f"bwrap with PID namespaces, {how}, {memory}, {net}{ports}, {seccomp.summary()}"
        return cls(bwrap=bwrap, reason=reason, toolchain=toolchain, cgroups=cgroups, setpriv=setpriv,
                   port_guard=guard, syscall_filter=True, pasta=pasta)

    def close(self) -> None:
        if self.cgroups is not None:
            self.cgroups.close()
        if self.port_guard is not None:
            self.port_guard.close()
            self.port_guard = None

    # -- launching ---------------------------------------------------------------------------

    def prepare(self, argv: Sequence[str], cwd: Path, spec: JailSpec, label: str,
                port: int | None = None) -> Prepared:
        """The launch of ``argv`` in ``spec``'s sandbox (or, when off, with per-process limits only).

        ``port``: the loopback port the process will listen on (forwarded from the host's loopback into its
        own network namespace, or closed to tenants until cleanup). The caller starts the process with
        ``pass_fds=prepared.pass_fds`` (the secret files, the syscall filter and the namespace's pipes reach
        bwrap on them; without them bwrap refuses to start, so nothing runs unfiltered), then calls
        ``release_fds()`` and ``attach()``.
        """
        limits = spec.limits
        if not self.enabled:
            plain_env = _address_space_env(limits, None)
            prepared = Prepared(list(argv), self._preexec(None, limits, None, signal.SIGTERM), plain_env, limits)
            if spec.files:
                folder = _private_files(spec.files)
                prepared.env["SLESS_SECRETS_DIR"] = folder
                prepared.on_cleanup = lambda: shutil.rmtree(folder, ignore_errors=True)
            return prepared
        cgroup = None
        if self.cgroups is not None and not spec.reaper_only:
            cgroup = self.cgroups.create(label, limits.memory_mb, limits.nproc)
        uid = tenant_uid(spec.tenant) if self.as_root and not spec.reaper_only else None
        fds: list[int] = []
        netns: NetnsLaunch | None = None
        if spec.reaper_only:
            wrapped = self._reaper_argv(argv, cwd)
            env: dict[str, str] = {}
        else:
            fds = [_memfd(f"sless-secret-{name}", content) for name, content in spec.files]
            filter_fd = None
            if self.syscall_filter:
                filter_fd = _memfd("sless-seccomp", seccomp.program())  # each bwrap reads its own to the end
                fds.append(filter_fd)
            if self.pasta is not None and spec.own_network:
                netns = NetnsLaunch.make(self.pasta, port, _die_with_platform)
                fds += netns.child_fds
            wrapped = self._jail_argv(argv, cwd, spec, uid, fds[:len(spec.files)], filter_fd,
                                      netns.bwrap_args() if netns is not None else [])
            env = {**dict.fromkeys(LOADER_ENV, ""), "HOME": SANDBOX_TMP, "TMPDIR": SANDBOX_TMP,
                   **_address_space_env(limits, cgroup)}
            if spec.files:
                env["SLESS_SECRETS_DIR"] = SECRETS_DIR
        preexec = self._preexec(cgroup, limits, uid, signal.SIGKILL, spec.reaper_only)
        prepared = Prepared(wrapped, preexec, env, limits, cgroup, sandboxed=True, pass_fds=tuple(fds), netns=netns)
        guard = self.port_guard
        if port is not None and guard is not None:
            try:
                guard.block(port)
            except BaseException:
                prepared.cleanup()
                raise
            prepared.on_cleanup = lambda: guard.unblock(port)
        return prepared

    def _reaper_argv(self, argv: Sequence[str], cwd: Path) -> list[str]:
        assert self.bwrap is not None
        head = [self.bwrap]
        if not self.as_root:
            head.append("--unshare-user")
        return [*head, "--unshare-pid", "--die-with-parent", "--dev-bind", "/", "/", "--proc", "/proc",
                "--chdir", str(cwd), "--", *argv]

    def _jail_argv(self, argv: Sequence[str], cwd: Path, spec: JailSpec, uid: int | None,
                   file_fds: Sequence[int] = (), filter_fd: int | None = None,
                   network: Sequence[str] = ()) -> list[str]:
        assert self.bwrap is not None
        out = [self.bwrap, *network]
        if uid is None:
            out += ["--unshare-user", "--disable-userns"]
        out += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent",
                "--new-session", "--hostname", "sless", "--ro-bind", "/usr", "/usr"]
        for name in LOADER_ENV:
            out += ["--unsetenv", name]
        for name in SYSTEM_DIRS:
            path = Path("/") / name
            if path.is_symlink():
                out += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                out += ["--ro-bind", str(path), str(path)]
        # The private /tmp first: a bind below /tmp (a data dir there) must land on top of it.
        out += ["--proc", "/proc", "--dev", "/dev", "--size", str(spec.limits.tmp_mb * 1024 * 1024),
                "--perms", "1777", "--tmpfs", SANDBOX_TMP]
        toolchain = [p for p in self.toolchain if not Path(p).is_relative_to("/usr")]
        ro = [Path(p) for p in dict.fromkeys([*toolchain, *spec.ro_binds])]
        rw = [Path(p) for p in spec.rw_binds]
        files = [Path(SECRETS_DIR) / name for name, _content in spec.files]
        out += _parent_dirs([Path("/etc/x"), *ro, *rw, *files])
        for name in ETC_FILES:
            out += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        for path in ro:
            out += ["--ro-bind", str(path), str(path)]
        for path in rw:
            out += ["--bind", str(path), str(path)]
        for fd, dest in zip(file_fds, files, strict=True):
            # bwrap copies the memfd into its own tmpfs file; readable by the tenant's uid, which has no
            # other way in (the folder is traversable only).
            out += ["--perms", "0444", "--ro-bind-data", str(fd), str(dest)]
        if self.syscall_filter:
            # Applied by bwrap right before it executes the command: setpriv and the tenant's code run under it.
            assert filter_fd is not None
            out += ["--seccomp", str(filter_fd)]
        out += ["--chdir", str(cwd)]
        if uid is not None:
            assert self.setpriv is not None
            # bwrap built the mounts with root's rights; setpriv drops to the tenant's uid with no
            # capabilities left and no way back (no_new_privs).
            out += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--", self.setpriv,
                    f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                    "--bounding-set=-all", "--no-new-privs"]
        return [*out, "--", *argv]

    def _preexec(self, cgroup: CgroupSet | None, limits: Limits, uid: int | None, death: int,
                 reaper_only: bool = False) -> Callable[[], None]:
        """Runs in the child between fork and exec: cgroup, rlimits, death signal. Keep it minimal."""
        as_limit: int | None = None
        if limits.memory_mb and cgroup is None and not reaper_only:
            headroom = AS_HEADROOM_MB.get(limits.runtime, AS_HEADROOM_DEFAULT_MB)
            as_limit = (limits.memory_mb + headroom) * 1024 * 1024
        nproc = limits.nproc
        per_uid = uid is not None or (self.enabled and not self.as_root and not reaper_only)
        if per_uid and uid is None:
            # Not root: the count is the platform user's (the user namespace is made after the fork),
            # so the allowance comes on top of what that user runs already.
            nproc += _processes_of(os.getuid())

        def preexec() -> None:
            if cgroup is not None:
                cgroup.join()
            if not reaper_only:
                if limits.fsize_mb:
                    _set_limit(resource.RLIMIT_FSIZE, limits.fsize_mb * 1024 * 1024)
                if limits.cpu_sec:
                    # soft < hard: the soft limit's SIGXCPU ends it, so the exit names the limit.
                    _set_limit(resource.RLIMIT_CPU, limits.cpu_sec, limits.cpu_sec + 2)
                if as_limit:
                    _set_limit(resource.RLIMIT_AS, as_limit)
                if limits.nofile:
                    _set_limit(resource.RLIMIT_NOFILE, limits.nofile)
                if per_uid:
                    # Counted per uid: the tenant's own when root, else the user namespace's.
                    _set_limit(resource.RLIMIT_NPROC, nproc)
            set_parent_death_signal(death)

        return preexec
