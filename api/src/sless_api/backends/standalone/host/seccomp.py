"""The syscall filter of sandboxed tenant processes on the standalone backend.

bwrap applies it (``--seccomp FD``) right before it executes the jailed command, after it built the
mounts, so ``setpriv`` and the tenant's program run under it and nothing they start can lift it. Every
refused call answers ``EPERM`` rather than killing the caller: a runtime that probes a feature (libuv tries
io_uring, glibc tries clone3) must fall back, not die. The default is to allow: the filter removes kernel
attack surface a function never needs; the namespaces, the tenant uid and the limits (sandbox.py) remain the
boundary. What is refused, and why:

- **io_uring** (``io_uring_setup``, ``io_uring_enter``, ``io_uring_register``): a large, often-patched kernel
  interface whose operations bypass other syscall filtering; runtimes fall back to plain I/O.
- **Kernel keyrings** (``keyctl``, ``add_key``, ``request_key``): keyrings are not namespaced; a tenant could
  read or fill keys other processes of the same uid use.
- **BPF and tracing** (``bpf``, ``perf_event_open``, ``lookup_dcookie``): in-kernel programs and performance
  counters, a frequent source of kernel exploits and of side channels on other tenants.
- **userfaultfd**: lets a process stall the kernel at a chosen page fault, the classic race-widening tool of
  kernel exploits.
- **Mounts and namespaces** (``mount``, ``umount2``, ``pivot_root``, the new mount API ``open_tree``,
  ``move_mount``, ``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``, ``mount_setattr``; ``unshare``, ``setns``,
  ``clone`` with a ``CLONE_NEW*`` flag; ``chroot``): the mount view is bwrap's to make; a new user namespace
  would give back capabilities over fresh namespaces (beyond what ``--disable-userns`` refuses as a user
  namespace sandbox). ``clone3`` answers ``ENOSYS``, as container runtimes do, because its flags sit in
  memory a filter cannot read: libc then falls back to ``clone``, whose flags it can.
- **Other processes' memory** (``ptrace``, ``process_vm_readv``, ``process_vm_writev``, ``process_madvise``,
  ``pidfd_getfd``, ``kcmp``): nothing in a function debugs or inspects another process.
- **File handles** (``name_to_handle_at``, ``open_by_handle_at``, ``fanotify_init``): opening by handle skips
  path lookup, the known way out of a bind-mounted view; fanotify hands out such handles and watches whole
  mounts.
- **Kernel modules and kexec** (``init_module``, ``finit_module``, ``delete_module``, ``create_module``,
  ``query_module``, ``get_kernel_syms``, ``kexec_load``, ``kexec_file_load``) and **host administration**
  (``swapon``, ``swapoff``, ``reboot``, ``acct``, ``quotactl``, ``quotactl_fd``, ``syslog``, ``vhangup``,
  ``sethostname``, ``setdomainname``, ``iopl``, ``ioperm``, ``nfsservctl``, ``uselib``, ``ustat``, ``sysfs``,
  ``_sysctl``, ``vm86``, ``vm86old``): calls that need capabilities a tenant never has; refused before the
  kernel's own checks run.
- **The clock** (``settimeofday``, ``clock_settime``, ``clock_adjtime``, ``adjtimex``, ``stime``): the host's
  time is not a tenant's to set (``adjtimex`` read-only queries included: ``clock_gettime`` answers the time).
- **personality** other than the default ``PER_LINUX`` (0): other personas switch off address space
  randomisation or change how the kernel reads the process's calls.
- **Other ABIs**: only the host's native one is allowed. On x86_64 the 32-bit ``int 0x80`` entry and the x32
  ABI carry other syscall numbers, which a filter written for x86_64 would misread; both answer ``EPERM``
  (libseccomp's bad-architecture action, which also covers x32 calls made through the 64-bit entry).

The program is compiled once per process with libseccomp (``pyseccomp``) and handed to each launch on a
fresh descriptor (bwrap reads it to its end). Without libseccomp no filter can be made: the sandbox then
counts as unavailable (sandbox.py), so the platform refuses to run tenants rather than run them unfiltered.
"""

from __future__ import annotations

import errno
import functools
import tempfile
from typing import Any

#: Calls refused with EPERM, by group (the module docstring says why each group is refused).
REFUSED: dict[str, tuple[str, ...]] = {
    "io_uring": ("io_uring_setup", "io_uring_enter", "io_uring_register"),
    "keyrings": ("keyctl", "add_key", "request_key"),
    "bpf and tracing": ("bpf", "perf_event_open", "lookup_dcookie"),
    "userfaultfd": ("userfaultfd",),
    "mounts and namespaces": ("mount", "umount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen",
                              "fsconfig", "fsmount", "fspick", "mount_setattr", "unshare", "setns", "chroot"),
    "other processes": ("ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_getfd",
                        "kcmp"),
    "file handles": ("name_to_handle_at", "open_by_handle_at", "fanotify_init"),
    "modules and kexec": ("init_module", "finit_module", "delete_module", "create_module", "query_module",
                          "get_kernel_syms", "kexec_load", "kexec_file_load"),
    "host administration": ("swapon", "swapoff", "reboot", "acct", "quotactl", "quotactl_fd", "syslog",
                            "vhangup", "sethostname", "setdomainname", "iopl", "ioperm", "nfsservctl", "uselib",
                            "ustat", "sysfs", "_sysctl", "vm86", "vm86old"),
    "clock": ("settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "stime"),
}
#: clone() flags that make a namespace (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET).
CLONE_NEW_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
#: personality(2)'s default persona, the only one allowed.
PER_LINUX = 0


class SeccompUnavailable(Exception):
    """No filter can be compiled here (libseccomp or its Python binding missing, or it refused a rule)."""


def _refusals(sc: Any, arch: int) -> list[tuple[int, str, tuple[Any, ...]]]:
    """(action, syscall, argument conditions) of every rule of the filter."""
    eperm = sc.ERRNO(errno.EPERM)
    rules: list[tuple[int, str, tuple[Any, ...]]] = [
        (eperm, name, ()) for names in REFUSED.values() for name in names
    ]
    # clone(2) takes its flags first, but on s390 second.
    flags_arg = 1 if arch in (sc.Arch.S390, sc.Arch.S390X) else 0
    rules += [(eperm, "clone", (sc.Arg(flags_arg, sc.MASKED_EQ, flag, flag),)) for flag in CLONE_NEW_FLAGS]
    rules.append((sc.ERRNO(errno.ENOSYS), "clone3", ()))
    rules.append((eperm, "personality", (sc.Arg(0, sc.NE, PER_LINUX),)))
    return rules


@functools.cache
def _compiled() -> tuple[bytes, tuple[str, ...]]:
    """The program and the refused calls this libseccomp does not know (left unfiltered), made once."""
    try:
        import pyseccomp as sc  # type: ignore[import-untyped]  # here: it raises at import without libseccomp
    except (ImportError, RuntimeError, OSError) as exc:
        raise SeccompUnavailable(f"no syscall filter: libseccomp (Debian package libseccomp2) or pyseccomp "
                                 f"is missing ({exc})") from None
    unknown: list[str] = []
    try:
        arch = sc.system_arch()
        flt = sc.SyscallFilter(sc.ALLOW)
        # Calls of any other ABI (x86's int 0x80, x32) are refused whole.
        flt.set_attr(sc.Attr.ACT_BADARCH, sc.ERRNO(errno.EPERM))
        for action, name, conditions in _refusals(sc, arch):
            # -1: a call newer than this libseccomp (other negative numbers: calls this arch does not have).
            if sc.resolve_syscall(sc.Arch.NATIVE, name) == -1:
                unknown.append(name)
                continue
            flt.add_rule(action, name, *conditions)
        with tempfile.TemporaryFile() as out:
            flt.export_bpf(out)
            out.seek(0)
            code = out.read()
    except OSError as exc:
        raise SeccompUnavailable(f"no syscall filter: libseccomp refused it ({exc})") from None
    if not code or len(code) % 8:
        raise SeccompUnavailable(f"no syscall filter: libseccomp exported {len(code)} bytes, not a BPF program")
    return code, tuple(dict.fromkeys(unknown))


def program() -> bytes:
    """The compiled classic-BPF program (what ``bwrap --seccomp`` reads); SeccompUnavailable if none."""
    return _compiled()[0]


def problem() -> str | None:
    """None if the filter can be made here, else why not (for the sandbox's start-up reason)."""
    try:
        _compiled()
    except SeccompUnavailable as exc:
        return str(exc)
    return None


def summary() -> str:
    """What the filter refuses, in a few words (for the start-up log)."""
    text = f"a seccomp filter refusing {', '.join(REFUSED)}, personas and other ABIs"
    unknown = _compiled()[1]
    if unknown:
        text += f" (this libseccomp cannot filter {', '.join(unknown)})"
    return text
