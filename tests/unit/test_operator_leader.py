"""The leader election's timing rules and a standby's liveness answer (a real socket on loopback)."""

from __future__ import annotations

import socket

import pytest
import requests

from sless_operator.leader import Timing, micro_time, standby_liveness
from tests.support.services import free_port


@pytest.mark.parametrize("lease_sec", [3, 6, 15, 300])
def test_a_holder_steps_down_before_a_standby_may_take_over(lease_sec: int) -> None:
    timing = Timing(lease_sec)
    assert timing.renew_sec < timing.renew_deadline_sec < lease_sec  # several renewals before stepping down
    assert timing.retry_sec < lease_sec


def test_lease_times_are_microtime() -> None:
    assert micro_time(0) == "1970-01-01T00:00:00.000000Z"
    assert micro_time(1_800_000_000.25) == "2027-01-15T08:00:00.250000Z"


def test_a_standby_answers_its_liveness_probe_and_frees_the_port_for_kopf() -> None:
    port = free_port()
    with standby_liveness(f"http://127.0.0.1:{port}/healthz"):
        alive = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert alive.status_code == 200 and alive.json() == {"standby": True}
        assert requests.get(f"http://127.0.0.1:{port}/other", timeout=5).status_code == 404
    with socket.create_server(("127.0.0.1", port)):  # Kopf's liveness endpoint binds the same port next
        pass
    with standby_liveness(None):  # no --liveness: nothing served
        pass
