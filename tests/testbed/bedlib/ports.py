"""Free loopback ports, because other test beds, services or sessions may hold 6443 or 2379."""

from __future__ import annotations

import random
import socket
from pathlib import Path

NODE_PORTS_START = 30000  # Kubernetes' NodePort range (30000-32767) is kube-proxy's on a real node


def free_ports(count: int, taken: set[int] | None = None) -> list[int]:
    """COUNT distinct ports that were free on 127.0.0.1 a moment ago, below the kernel's ephemeral range.

    Ports handed out by ``bind(0)`` and the source ports of outgoing connections come from the ephemeral
    range, so on a machine running many tests at once a port picked there can be taken by some client's
    connection before the component binds it. Below the range only another program choosing explicitly can
    collide, and ``testbed up`` starts over with new ports when that happens. The NodePort range is left
    to kube-proxy. All sockets stay open until
    every port is chosen, so the same port is never handed out twice.
    """
    top = min(ephemeral_range()[0], NODE_PORTS_START)
    candidates = list(range(max(1024, top - 10000), top))
    random.shuffle(candidates)
    held: list[socket.socket] = []
    ports: list[int] = []
    avoid = taken or set()
    try:
        for port in candidates:
            if len(ports) == count:
                break
            if port in avoid:
                continue
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            held.append(sock)
            ports.append(port)
        while len(ports) < count:  # no room below the range (an unusual kernel setting): any free port
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            held.append(sock)
            port = int(sock.getsockname()[1])
            if port not in avoid and port not in ports:
                ports.append(port)
    finally:
        for sock in held:
            sock.close()
    return ports


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for automatically chosen local ports (Linux's default when it cannot be read)."""
    try:
        low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def port_free(port: int) -> bool:
    """Whether PORT can be bound on 127.0.0.1 right now (for ports the caller asked for)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
