"""Poll until a condition holds: the one wait of the suite.

Tests wait on conditions, not sleeps: a fixed sleep is either too short on a loaded machine (a flaky failure)
or too long everywhere else (a slow suite), and when it is too short the failure says nothing about what did
not happen. :func:`until` asks PROBE again and again and returns as soon as it holds; when it never does, the
failure names what was awaited and for how long. The check that something did NOT happen is :func:`holds`: it
watches the good state for a bound written, with its reason, at the call site, and fails the moment it breaks.

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


def holds(what: str, probe: Callable[[], bool], for_sec: float, why: str, interval: float = 0.1) -> None:
    """Check that PROBE (the good state: "still not rebuilt", "no call yet") stays true for FOR_SEC seconds.

    An absence can only be checked for a bounded time: nothing tells a test that an unwanted rebuild, call or
    restart will never come, only that it did not come within some time. So the bound and the reason it is long
    enough are written at the call site: WHY says what would make the unwanted thing happen and how fast it
    would (e.g. "the reconcile of a change takes < 0.5 s on the bed; 2 s is 4x that"). PROBE is asked every
    INTERVAL seconds and once more at the end; the moment it turns false the check fails at once, with an
    AssertionError naming WHAT, the time elapsed and WHY, instead of sleeping out the rest of FOR_SEC.
    """
    _check_why(why)
    started = time.monotonic()
    deadline = started + for_sec
    while True:
        if not probe():
            raise AssertionError(_broken(what, time.monotonic() - started, for_sec, why))
        now = time.monotonic()
        if now >= deadline:
            return
        time.sleep(min(interval, deadline - now))


async def holds_async(what: str, probe: Callable[[], bool], for_sec: float, why: str,
                      interval: float = 0.1) -> None:
    """:func:`holds` for a test on an event loop: it waits with ``asyncio.sleep``, so the code under test keeps
    running on the same loop (and can break PROBE, which is the point) while the test watches."""
    _check_why(why)
    started = time.monotonic()
    deadline = started + for_sec
    while True:
        if not probe():
            raise AssertionError(_broken(what, time.monotonic() - started, for_sec, why))
        now = time.monotonic()
        if now >= deadline:
            return
        await asyncio.sleep(min(interval, deadline - now))


def _check_why(why: str) -> None:
    """An empty WHY is the bare sleep again under another name: refuse it."""
    if not why.strip():
        raise ValueError("holds: WHY must say why FOR_SEC is long enough for the unwanted thing to show")


def _broken(what: str, elapsed: float, for_sec: float, why: str) -> str:
    return f"{what} stopped holding after {elapsed:.2f}s of the {for_sec:g}s checked ({why})"
