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


def whoami(event):
    return {"uid": os.getuid(), "pid": os.getpid(), "ppid": os.getppid(), "root": sorted(os.listdir("/"))}


ACTIONS = {f.__name__: f for f in (read_files, scan_environ, signals, fork_bomb, memory_bomb, detach,
                                   fill_disk, stop_self, connect, whoami)}


def handle(event):
    return ACTIONS[event["action"]](event)
