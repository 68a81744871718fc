"""`sless up` restarted on the same data directory serves the same functions without re-upload."""

from __future__ import annotations

import signal

import pytest
import requests

from tests.support.platform import Tenant, start_sless

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def assert_no_orphans(data: object) -> None:
    """Runtime processes die with `sless up`, even on SIGKILL (they ask the kernel for a parent-death signal)."""
    import subprocess
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-f", str(data)], capture_output=True, text=True).stdout.split()
        if not found:
            return
        time.sleep(0.2)
    raise AssertionError(f"runtime processes outlived sless up: {found}")


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_state_survives_restart(tmp_path: object, stop_signal: int) -> None:
    from pathlib import Path

    data = Path(str(tmp_path)) / "data"
    first = start_sless(data)
    try:
        tenant = Tenant(first.url, "restart-tenant")
        tenant.deploy("keeper", "python3.11", {"handler.py": "def handle(event):\n    return 'still here'\n"})
        tenant.api("POST", "/jobs", json={"name": "j", "function": "keeper", "run_id": 0}, expect=201)
        assert requests.get(tenant.fn_url("keeper"), timeout=30).text == "still here"
    finally:
        first.stop(stop_signal)
    if stop_signal == signal.SIGKILL:
        assert_no_orphans(data)
    second = start_sless(data)
    try:
        tenant = Tenant(second.url, "restart-tenant")
        record = tenant.api("GET", "/functions/keeper", expect=200).json()
        assert record["phase"] == "Ready"
        assert requests.get(tenant.fn_url("keeper"), timeout=30).text == "still here"
        assert tenant.api("GET", "/jobs/j", expect=200).json()["phase"] == "Recorded"
    finally:
        assert second.stop() == 0
