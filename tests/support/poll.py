"""Poll until a condition holds: the one wait of the suite.

Tests wait on conditions, not sleeps: a fixed sleep is either too short on a loaded machine (a flaky failure)
or too long everywhere else (a slow suite), and when it is too short the failure says nothing about what did
not happen. :func:`until` asks PROBE again and again and returns as soon as it holds; when it never does, the
failure names what was awaited and for how long.

Only the standard library is imported: tests/install/e2e_installed.py uses this inside an installed
environment (Molecule's verify), where nothing of the suite's own dependencies may be present.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(what: str, probe: Callable[[], T | bool | None], timeout: float, interval: float = 0.25) -> T:
    """The first truthy value PROBE returns, asked every INTERVAL seconds; AssertionError after TIMEOUT.

    PROBE is asked at least once, and once more when the deadline has passed, so a condition that holds by
    then still counts however long one probe takes. A probe that checks a condition returns True; one that
    finds something returns it (a body, a list), and the caller gets it back.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value  # type: ignore[return-value]  # truthy: not None, not False
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout:g}s")
        time.sleep(interval)


async def until_async(what: str, probe: Callable[[], T | bool | None], timeout: float,
                      interval: float = 0.25) -> T:
    """:func:`until` for a test on an event loop: it sleeps with ``asyncio.sleep``, so the code under test
    keeps running on the same loop while the test waits (a ``time.sleep`` would stop it)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value  # type: ignore[return-value]  # truthy: not None, not False
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} not reached within {timeout:g}s")
        await asyncio.sleep(interval)
