"""The operator's own work in its metrics: each reconcile timed and its failures counted by kind, queue depth."""

from __future__ import annotations

import asyncio

import pytest

from sless_operator.context import work_kind
from sless_operator.metrics import REGISTRY, reconciled, watch_queue
from sless_operator.workqueue import WorkQueue


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_reconcile_is_timed_and_a_failure_counted_and_raised() -> None:
    before = value("sless_operator_reconcile_duration_seconds_count", kind="trigger")
    errors = value("sless_operator_reconcile_errors_total", kind="trigger")

    async def fails() -> None:
        raise RuntimeError("api down")

    async def works() -> None:
        await asyncio.sleep(0)

    asyncio.run(reconciled("trigger", works))
    with pytest.raises(RuntimeError, match="api down"):
        asyncio.run(reconciled("trigger", fails))
    assert value("sless_operator_reconcile_duration_seconds_count", kind="trigger") == before + 2
    assert value("sless_operator_reconcile_errors_total", kind="trigger") == errors + 1


def test_the_work_queue_runs_each_key_through_its_runner_and_its_depth_is_read_at_scrape() -> None:
    seen: list[str] = []

    async def main() -> None:
        async def runner(key: object, work: object) -> None:
            seen.append(work_kind(key))
            await reconciled(work_kind(key), work)  # type: ignore[arg-type]

        queue = WorkQueue(1, runner=runner)
        watch_queue(queue)
        done = asyncio.Event()

        async def last() -> None:
            done.set()

        queue.add(("function", "ns", "a"), lambda: asyncio.sleep(0))
        queue.add(("Job", "ns", "b"), last)
        assert value("sless_operator_queue_depth") == 2  # nothing ran yet: the worker is not started
        queue.start()
        await asyncio.wait_for(done.wait(), 10)
        await queue.stop()
        assert value("sless_operator_queue_depth") == 0

    asyncio.run(main())
    assert seen == ["function", "job"]
