"""A hostile tenant's function: each action is one attack on the platform or another tenant.

Every attempt is reported as ``{"target": "ok: <what it got>" | "err: <why not>"}`` so the
test can assert that nothing succeeded. Processes it starts are bounded (they sleep and exit).
"""

import os
import signal
import subprocess
import threading
import time

MB = 1024 * 1024


def _try(fn):
    try:
        return "ok: " + str(fn())[:300]
    except BaseException as exc:  # every failure is an answer here
        return f"err: {type(exc).__name__}: {exc}"[:300]


def _read(path):
    with open(path, "rb") as fh:
        return fh.read(4096)


def read_files(event):
    """The data dir (secret, databases), another tenant's code, the platform's environment."""
    out = {}
    for path in event.get("paths", []):
        out[path] = _try(lambda p=path: os.listdir(p) if os.path.isdir(p) else _read(p))
    return out


def scan_environ(event):
    """Look through every visible process's environment for another tenant's marker."""
    marker = event["marker"].encode()
    found, seen = [], []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            seen.append(int(entry))
            data = _try(lambda e=entry: _read(f"/proc/{e}/environ"))
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if marker in fh.read():
                        found.append(int(entry))
            except OSError:
                pass
            del data
    direct = {str(pid): _try(lambda p=pid: marker in _read(f"/proc/{p}/environ")) for pid in event.get("pids", [])}
    return {"found": found, "visible_pids": sorted(seen), "direct": direct}


def signals(event):
    """Signal the parent, PID 1, the platform's host pid, and everything (-1 last, it may hit us)."""
    out = {"ppid": os.getppid()}
    out["parent"] = _try(lambda: os.kill(os.getppid(), signal.SIGKILL) if os.getppid() > 0 else "no parent")
    out["pid1"] = _try(lambda: os.kill(1, signal.SIGKILL))
    for pid in event.get("pids", []):
        out[f"host-{pid}"] = _try(lambda p=pid: os.kill(p, signal.SIGKILL))
    time.sleep(0.2)
    return out


def fork_bomb(event):
    """Start up to ``count`` processes that sleep briefly; report how many the sandbox allowed."""
    count, started, error = int(event.get("count", 300)), [], None
    for _ in range(count):
        try:
            pid = os.fork()
        except OSError as exc:
            error = f"{type(exc).__name__}: {exc}"
            break
        if pid == 0:
            time.sleep(20)
            os._exit(0)
        started.append(pid)
    for pid in started:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
    return {"started": len(started), "error": error}


def memory_bomb(event):
    """Touch ``mb`` megabytes (the limit is far lower)."""
    chunks = [b"\x01" * (16 * MB) for _ in range(int(event.get("mb", 800)) // 16)]
    return {"allocated_mb": 16 * len(chunks)}


def detach(event):
    """Leave a daemon behind in its own session: it must not outlive the function."""
    subprocess.Popen(["sleep", str(event.get("seconds", 313))], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return {"detached": True}


def fill_disk(event):
    """Write until something stops us: into /tmp, into our own code, next to the platform's data."""
    out = {}

    def fill(path):
        written = 0
        with open(path, "wb") as fh:
            while written < int(event.get("mb", 512)) * MB:
                fh.write(b"\x00" * MB)
                fh.flush()
                written += MB
        return f"wrote {written // MB} MB"

    out["tmp"] = _try(lambda: fill("/tmp/fill"))
    out["code"] = _try(lambda: fill(os.path.join(os.environ["SLESS_CODE_DIR"], "fill")))
    for path in event.get("paths", []):
        out[path] = _try(lambda p=path: fill(p))
    return out


def stop_self(event):
    """SIGSTOP our own runtime shortly after answering: the health probe must replace it."""
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGSTOP)).start()
    return {"pid": os.getpid()}


def connect(event):
    """Open TCP connections to loopback ports (another tenant's runtime, the platform's API)."""
    import socket

    def probe(port):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(b"GET /_/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return conn.recv(64).decode(errors="replace").splitlines()[0]

    return {str(port): _try(lambda p=port: probe(p)) for port in event["ports"]}


def sockets(event):
    """The listening TCP ports this process can see in /proc/net/tcp and tcp6 (the host's, when it shares them)."""
    ports = set()
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/net/{name}") as table:
                lines = table.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return {"listening": sorted(ports)}


#: x86_64 numbers of the calls the sandbox's seccomp filter refuses, with arguments that make each call
#: harmless (and fail with another errno than EPERM) where no filter stops it.
X86_64_SYSCALLS = {
    "io_uring_setup": (425, 1, 0), "io_uring_enter": (426, -1, 0, 0, 0, 0, 0), "io_uring_register": (427, -1, 0, 0, 0),
    "keyctl": (250, -1, 0, 0, 0, 0), "add_key": (248, 0, 0, 0, 0, 0), "request_key": (249, 0, 0, 0, 0),
    "bpf": (321, -1, 0, 0), "userfaultfd": (323, -1), "perf_event_open": (298, 0, 0, -1, -1, 0),
    "mount": (165, 0, 0, 0, 0, 0), "umount2": (166, 0, 0), "pivot_root": (155, 0, 0),
    "open_tree": (428, -1, 0, 0), "move_mount": (429, -1, 0, -1, 0, 0), "fsopen": (430, 0, 0),
    "fsconfig": (431, -1, 0, 0, 0, 0), "fsmount": (432, -1, 0, 0), "fspick": (433, -1, 0, 0),
    "mount_setattr": (442, -1, 0, 0, 0, 0), "unshare": (272, 0), "setns": (308, -1, 0),
    "kexec_load": (246, 0, 0, 0, 0), "kexec_file_load": (320, -1, -1, 0, 0, 0), "init_module": (175, 0, 0, 0),
    "finit_module": (313, -1, 0, 0), "delete_module": (176, 0, 0), "ptrace": (101, -1, 0, 0, 0),
    "process_vm_readv": (310, 0, 0, 0, 0, 0, 0), "process_vm_writev": (311, 0, 0, 0, 0, 0, 0),
    "name_to_handle_at": (303, -1, 0, 0, 0, 0), "open_by_handle_at": (304, -1, 0, 0), "swapon": (167, 0, 0),
    "swapoff": (168, 0), "reboot": (169, 0, 0, 0, 0), "acct": (163, 0), "quotactl": (179, 0, 0, 0, 0),
    "syslog": (103, 10, 0, 0), "settimeofday": (164, 0, 0), "clock_settime": (227, -1, 0),
    "clock_adjtime": (305, -1, 0), "adjtimex": (159, 0), "lookup_dcookie": (212, 0, 0, 0), "vhangup": (153,),
    "personality": (135, 0xFFFFFFFF), "chroot": (161, 0), "pidfd_getfd": (438, -1, -1, 0),
    "process_madvise": (440, -1, 0, 0, 0, 0), "kcmp": (312, 0, 0, -1, 0, 0), "sethostname": (170, 0, 0),
    "ioperm": (173, 0, 0, 0),
    # a new user namespace through clone (invalid with CLONE_THREAD: EINVAL where unfiltered, never a child)
    "clone(CLONE_NEWUSER)": (56, 0x10000000 | 0x00010000, 0, 0, 0, 0),
    # the x32 ABI through the 64-bit entry: getpid with the x32 bit
    "x32 getpid": (0x40000000 | 39,),
}
#: clone3 answers ENOSYS (libc then falls back to clone, whose flags the filter reads).
X86_64_ENOSYS = {"clone3": (435, 0, 0)}


def _raw_syscall(libc, nr, *args):
    import ctypes

    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
    return "ok" if result != -1 else errno_name(ctypes.get_errno())


def errno_name(code):
    import errno as errno_module

    return errno_module.errorcode.get(code, str(code))


def _int80_getpid():
    """The 32-bit getpid through int 0x80, in a child process (a kernel without ia32 emulation kills it)."""
    import ctypes
    import mmap

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            code = bytes.fromhex("b814000000cd80c3")  # mov eax, 20 (getpid); int 0x80; ret
            page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
            page.write(code)
            address = ctypes.addressof(ctypes.c_char.from_buffer(page))
            result = ctypes.CFUNCTYPE(ctypes.c_int)(address)()
            os.write(write_fd, str(result).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read_fd, "rb") as fh:
        got = fh.read().decode()
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    value = int(got)
    return errno_name(-value) if value < 0 else "ok"


def syscalls(event):
    """Call each syscall the sandbox refuses (raw, through libc's syscall()) and report the errno it got."""
    import ctypes
    import platform

    if platform.machine() != "x86_64":
        return {"skipped": platform.machine()}
    libc = ctypes.CDLL(None, use_errno=True)
    out = {name: _raw_syscall(libc, *call) for name, call in X86_64_SYSCALLS.items()}
    out.update({name: _raw_syscall(libc, *call) for name, call in X86_64_ENOSYS.items()})
    out["int 0x80 getpid"] = _int80_getpid()
    out["personality(PER_LINUX)"] = _raw_syscall(libc, 135, 0)
    with open("/proc/self/status") as fh:
        out["Seccomp"] = next((line.split()[1] for line in fh if line.startswith("Seccomp:")), "?")
    return out


def whoami(event):
    return {"uid": os.getuid(), "pid": os.getpid(), "ppid": os.getppid(), "root": sorted(os.listdir("/"))}


ACTIONS = {f.__name__: f for f in (read_files, scan_environ, signals, fork_bomb, memory_bomb, detach,
                                   fill_disk, stop_self, connect, whoami, syscalls, sockets)}


def handle(event):
    return ACTIONS[event["action"]](event)
