"""tests/support/poll.py, the suite's one wait: what it returns, when it gives up, and what the failure says."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from tests.support.poll import holds, holds_async, until, until_async


def counting(answers: list[object]) -> tuple[Callable[[], object], list[int]]:
    """A probe answering ANSWERS in turn (the last one forever), and the count of its calls."""
    calls = [0]

    def probe() -> object:
        calls[0] += 1
        return answers[min(calls[0], len(answers)) - 1]

    return probe, calls


def test_the_first_truthy_answer_is_returned() -> None:
    probe, calls = counting([None, False, [], {"phase": "Ready"}, "later"])
    assert until("ready", probe, timeout=5, interval=0.001) == {"phase": "Ready"}
    assert calls[0] == 4


def test_a_probe_that_holds_at_once_is_asked_once_and_not_waited_for() -> None:
    probe, calls = counting([True])
    started = time.monotonic()
    assert until("at once", probe, timeout=5, interval=10) is True
    assert calls[0] == 1 and time.monotonic() - started < 1


def test_a_condition_never_reached_fails_naming_it_and_the_timeout() -> None:
    probe, calls = counting([None])
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"^the queue empty not reached within 0\.2s$"):
        until("the queue empty", probe, timeout=0.2, interval=0.05)
    assert time.monotonic() - started >= 0.2
    assert calls[0] >= 3  # asked again until the deadline, and once after it


def test_a_zero_timeout_still_asks_once() -> None:
    probe, calls = counting([None, "too late"])
    with pytest.raises(AssertionError, match="within 0s"):
        until("anything", probe, timeout=0)
    assert calls[0] == 1


def test_the_async_twin_lets_the_loop_run_while_it_waits() -> None:
    async def scenario() -> object:
        state: dict[str, object] = {}

        async def worker() -> None:  # needs the loop: a time.sleep in the wait would starve it
            await asyncio.sleep(0.05)
            state["done"] = "yes"

        task = asyncio.create_task(worker())
        found = await until_async("the worker", lambda: state.get("done"), timeout=5, interval=0.01)
        await task
        return found

    assert asyncio.run(scenario()) == "yes"


def test_the_async_twin_fails_like_the_other() -> None:
    with pytest.raises(AssertionError, match=r"^nothing not reached within 0\.1s$"):
        asyncio.run(until_async("nothing", lambda: None, timeout=0.1, interval=0.02))


def test_holds_passes_when_the_state_lasts_the_whole_time_and_asks_to_the_end() -> None:
    probe, calls = counting([True])
    started = time.monotonic()
    holds("nothing rebuilt", probe, for_sec=0.2, why="a rebuild would start within 0.05s", interval=0.02)
    assert time.monotonic() - started >= 0.2
    assert calls[0] >= 5  # asked throughout, and once at the end


def test_holds_fails_at_once_when_the_state_breaks_naming_what_and_why() -> None:
    probe, calls = counting([True, True, False])
    started = time.monotonic()
    with pytest.raises(AssertionError) as raised:
        holds("no restart", probe, for_sec=5, why="a restart comes within 1s of the crash", interval=0.01)
    assert time.monotonic() - started < 1  # well before FOR_SEC
    assert calls[0] == 3
    message = str(raised.value)
    assert message.startswith("no restart stopped holding after 0.0")
    assert "of the 5s checked" in message and "a restart comes within 1s of the crash" in message


def test_holds_fails_on_the_first_probe_already() -> None:
    with pytest.raises(AssertionError, match=r"^still idle stopped holding after 0\.00s"):
        holds("still idle", lambda: False, for_sec=5, why="anything")


def test_holds_wants_a_reason() -> None:
    with pytest.raises(ValueError, match="WHY"):
        holds("anything", lambda: True, for_sec=0.1, why="  ")


def test_the_async_holds_sees_what_the_loop_does_meanwhile() -> None:
    async def scenario() -> None:
        state = {"calls": 0}

        async def intruder() -> None:  # runs only if the wait yields to the loop
            await asyncio.sleep(0.05)
            state["calls"] += 1

        task = asyncio.create_task(intruder())
        try:
            await holds_async("no call", lambda: state["calls"] == 0, for_sec=5, why="a call comes within 0.05s",
                              interval=0.01)
        finally:
            await task

    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"^no call stopped holding after .* \(a call comes within 0\.05s\)$"):
        asyncio.run(scenario())
    assert time.monotonic() - started < 1


def test_the_async_holds_passes_when_the_state_lasts() -> None:
    asyncio.run(holds_async("quiet", lambda: True, for_sec=0.1, why="noise would come at once", interval=0.02))
