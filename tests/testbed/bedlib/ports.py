"""Free loopback ports, because other test beds, services or sessions may hold 6443 or 2379."""

from __future__ import annotations

import socket


def free_ports(count: int, taken: set[int] | None = None) -> list[int]:
    """COUNT distinct ports that were free on 127.0.0.1 a moment ago.

    All sockets stay open until every port is chosen, so the kernel cannot hand out the
    same port twice; a race with another program remains possible but is rare.
    """
    held: list[socket.socket] = []
    ports: list[int] = []
    avoid = taken or set()
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            held.append(sock)
            port = int(sock.getsockname()[1])
            if port not in avoid:
                ports.append(port)
    finally:
        for sock in held:
            sock.close()
    return ports


def port_free(port: int) -> bool:
    """Whether PORT can be bound on 127.0.0.1 right now (for ports the caller asked for)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
