"""tests/support/poll.py, the suite's one wait: what it returns, when it gives up, and what the failure says."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from tests.support.poll import until, until_async


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
