"""The test bed's ports: chosen below the kernel's ephemeral range, where no client connection can take them."""

from __future__ import annotations

import socket

from tests.testbed.bedlib import ports


def test_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    low, high = ports.ephemeral_range()
    assert 0 < low <= high
    chosen = ports.free_ports(6)
    assert len(set(chosen)) == 6 and all(1024 <= p < min(low, ports.NODE_PORTS_START) for p in chosen)
    for port in chosen:
        assert ports.port_free(port)


def test_ports_taken_or_asked_to_avoid_are_skipped() -> None:
    first = ports.free_ports(3)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", first[0]))
        held.listen()
        again = ports.free_ports(50, taken={first[1]})
    assert first[0] not in again and first[1] not in again and len(set(again)) == 50
