"""A network namespace of its own for each sandboxed function process, with outbound access through pasta.

Why: on the host's network a function could list every socket of the host (``/proc/net/tcp``) and connect to
any loopback service: the platform's databases, a message broker, another tenant's runtime port (closed only
by an iptables rule, which another firewall manager on the host can wipe). In its own namespace a function
sees only its own sockets, and its 127.0.0.1 is its own.

pasta (Debian package ``passt``) gives the namespace outbound access without a bridge, a NAT rule or any
iptables: it copies the host's addresses and routes into the namespace and carries each connection out as a
socket of its own on the host. Three settings make it a one-way door:

- ``--no-map-gw``: the gateway address does not lead to the host's loopback; no other address does either;
- ``-t 127.0.0.1/PORT``: the runtime's port is forwarded from the host's loopback into the namespace, so the
  platform keeps reaching the runtime at 127.0.0.1:PORT, a port no tenant can reach from its namespace;
- ``-T PORTS``: the few host loopback ports an operator lets functions reach (``SLESS_SANDBOX_HOST_PORTS``;
  ``sless up`` adds its own API port, so a function can still call ``/fn``) appear on the namespace's own
  127.0.0.1; nothing else of the host's loopback does.

bwrap starts the process in a new namespace (``--unshare-net``) and holds it (``--block-fd``) until pasta has
configured the namespace, so the function's first outbound connection finds the network up; bwrap reports the
sandbox's pid (``--info-fd``), whose namespace pasta joins through a descriptor the platform opened.

Root only: joining the namespace of a sandbox made by an unprivileged platform (inside a user namespace) is
not set up, so there functions keep the host's network (SandboxSettings.network says what was chosen).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO

from sless_api.backends.standalone.host.fdwait import readable_within

#: How long pasta may take to configure a namespace before the launch fails (it takes milliseconds).
PASTA_READY_SEC = 10.0
#: How long bwrap may take to report the sandbox's pid (seconds on an idle host; a loaded one can take many).
INFO_SEC = 30.0


class NetworkUnavailable(Exception):
    """A namespace of its own cannot be given to a function process (pasta missing, or it failed)."""


class NetworkSetupBroken(NetworkUnavailable):
    """The set-up failed on the way (a pipe to the sandbox broken under load): the launch is tried again."""


class PortTaken(NetworkUnavailable):
    """The runtime's port on the host's loopback was taken meanwhile (a launch retries on another)."""


@dataclass(frozen=True)
class Pasta:
    """The pasta binary and the host loopback ports functions may reach (the same for every function)."""

    binary: str
    host_ports: tuple[int, ...] = ()

    @classmethod
    def find(cls, host_ports: Sequence[int] = ()) -> Pasta | None:
        binary = shutil.which("pasta")
        return cls(binary, tuple(sorted(set(host_ports)))) if binary else None

    def argv(self, netns_fd: int, pid_fd: int, port: int | None) -> list[str]:
        """pasta in the foreground (a child of the platform, which kills it), quiet, joining NETNS_FD."""
        inbound = ["-t", f"127.0.0.1/{port}"] if port is not None else ["-t", "none"]
        outbound = ["-T", ",".join(map(str, self.host_ports))] if self.host_ports else ["-T", "none"]
        return [self.binary, "--foreground", "--quiet", "--config-net", "--no-map-gw", "--runas", "0",
                *inbound, "-u", "none", *outbound, "-U", "none",
                "--netns", f"/proc/self/fd/{netns_fd}", "--pid", f"/proc/self/fd/{pid_fd}"]


@dataclass
class NetnsLaunch:
    """One sandboxed launch's namespace plumbing: made before the spawn, attached to the process after it."""

    pasta: Pasta
    port: int | None
    #: Runs in pasta between fork and exec: the parent-death signal, so pasta never outlives the platform.
    preexec: Callable[[], None]
    block_read: int
    block_write: int
    info_read: int
    info_write: int
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    messages: IO[bytes] | None = field(default=None, repr=False)

    @classmethod
    def make(cls, pasta: Pasta, port: int | None, preexec: Callable[[], None]) -> NetnsLaunch:
        block_read, block_write = os.pipe()
        info_read, info_write = os.pipe()
        return cls(pasta, port, preexec, block_read, block_write, info_read, info_write)

    def bwrap_args(self) -> list[str]:
        return ["--unshare-net", "--block-fd", str(self.block_read), "--info-fd", str(self.info_write)]

    @property
    def child_fds(self) -> tuple[int, ...]:
        """The descriptors bwrap must inherit (released after the spawn with the other pass_fds)."""
        return (self.block_read, self.info_write)

    def attach(self) -> None:
        """After the spawn: start pasta in the sandbox's namespace, then let the sandbox go on.

        Blocks (up to a few seconds on a loaded host): call it from a worker thread. Raises
        NetworkUnavailable; the caller then kills the sandbox (which never ran the function's code).
        """
        try:
            self._attach()
        except NetworkUnavailable:
            raise
        except (OSError, ValueError) as exc:  # a failure of ours must fail the launch, never wedge its caller
            raise NetworkSetupBroken(f"cannot set up the function's network: {exc}") from exc

    def _attach(self) -> None:
        pid = self._sandbox_pid()
        try:
            netns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise NetworkUnavailable(f"cannot open the sandbox's network namespace: {exc}") from exc
        pid_read, pid_write = os.pipe()
        # Its messages go to a file, not a pipe: a pasta that logs while it serves must never block on a full one.
        self.messages = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the launch
        try:
            self.process = subprocess.Popen(
                self.pasta.argv(netns, pid_write, self.port), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=self.messages, pass_fds=(netns, pid_write),
                start_new_session=True, preexec_fn=self.preexec)  # noqa: PLW1509 - a prctl call
        except OSError as exc:
            raise NetworkUnavailable(f"cannot start pasta: {exc}") from exc
        finally:
            os.close(netns)
            os.close(pid_write)
        try:
            # pasta writes its pid once the namespace is configured and the ports are bound.
            ready = _read_some(pid_read, PASTA_READY_SEC)
        finally:
            os.close(pid_read)
        if not ready:
            self.process.kill()
            self.process.wait(timeout=5)
            self.messages.seek(0)
            said = self.messages.read(4096).decode(errors="replace").strip()
            failure = PortTaken if "Failed to bind" in said else NetworkUnavailable
            raise failure(f"pasta did not configure the function's network (exit {self.process.returncode}): "
                          f"{said}")
        os.write(self.block_write, b"1")

    def _sandbox_pid(self) -> int:
        """The pid bwrap reports on its info descriptor (its sandbox's first process, in the new namespaces).

        bwrap writes one JSON object there right after it made the sandbox, then closes it.
        """
        text = b""
        deadline = time.monotonic() + INFO_SEC
        ended = False
        while not ended and (left := deadline - time.monotonic()) > 0:
            if not readable_within(self.info_read, left):
                break
            chunk = os.read(self.info_read, 4096)
            text += chunk
            ended = not chunk
        try:
            return int(json.loads(text)["child-pid"])
        except (ValueError, KeyError, TypeError) as exc:
            how = "it closed its report" if ended else f"nothing more within {INFO_SEC:g}s"
            raise NetworkUnavailable(f"bwrap did not report its sandbox's pid ({how}): {text[:200]!r}") from exc

    def close(self) -> None:
        """Stop pasta and close what is left (idempotent): at the sandbox's cleanup."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
        if self.messages is not None:
            self.messages.close()
        for name in ("block_read", "block_write", "info_read", "info_write"):
            fd = getattr(self, name)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, -1)

    def release_child_fds(self) -> None:
        """Close the platform's copies of the descriptors bwrap inherited (the info pipe then ends with bwrap's)."""
        for name in ("block_read", "info_write"):
            fd = getattr(self, name)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, -1)


def _read_some(fd: int, timeout: float) -> bytes:
    """What FD has within TIMEOUT seconds (b"" at its end or the timeout)."""
    return os.read(fd, 4096) if readable_within(fd, timeout) else b""

