"""The invocation log's queue and writer, against small in-process sinks.

The sinks here are plain Python objects implementing the Sink protocol (a list, one that
fails on demand, one that blocks on an event); the real databases are exercised in
tests/integration/test_invocations.py.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence

import pytest

from sless_api.stores.invocations import Invocation, InvocationLog


def inv(i: int = 0, ns: str = "ns", fn: str = "fn") -> Invocation:
    return Invocation(ns, fn, "POST", f"/p/{i}", 200, 1.5, 10, 20, "http", None, 1_700_000_000.0 + i)


class ListSink:
    """Keeps batches in memory; assigns ids like a database would."""

    def __init__(self) -> None:
        self.batches: list[list[Invocation]] = []
        self.rows: list[Invocation] = []
        self.closed = False
        self.lock = threading.Lock()

    def write_batch(self, batch: Sequence[Invocation]) -> None:
        with self.lock:
            self.batches.append(list(batch))
            for item in batch:
                self.rows.append(dataclasses.replace(item, id=len(self.rows) + 1))

    def list(self, namespace: str, function: str | None, limit: int, before_id: int | None,
             since: float | None = None) -> list[Invocation]:
        with self.lock:
            found = [
                r
                for r in reversed(self.rows)
                if r.namespace == namespace
                and (function is None or r.function == function)
                and (before_id is None or (r.id or 0) < before_id)
                and (since is None or r.started_at >= since)
            ]
        return found[:limit]

    def close(self) -> None:
        self.closed = True


class FlakySink(ListSink):
    """Fails the next ``failures`` write attempts, then works."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.attempts = 0

    def write_batch(self, batch: Sequence[Invocation]) -> None:
        self.attempts += 1
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("database unreachable")
        super().write_batch(batch)


class BlockingSink(ListSink):
    """Every write waits until ``release`` is set: a database that stopped answering."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def write_batch(self, batch: Sequence[Invocation]) -> None:
        self.entered.set()
        self.release.wait(60)
        super().write_batch(batch)


def test_records_are_written_in_bounded_batches() -> None:
    sink = ListSink()
    log = InvocationLog(sink, max_queue=10_000, batch=100, flush_interval=0.05)
    for i in range(1234):
        log.record(inv(i))
    assert log.flush(30)
    assert log.close(10)
    assert sink.closed
    assert len(sink.rows) == 1234
    assert [r.path for r in sink.rows] == [f"/p/{i}" for i in range(1234)]  # order kept
    assert max(len(b) for b in sink.batches) <= 100
    assert len(sink.batches) < 1234  # actually batched
    assert log.stats() == {"recorded": 1234, "queued": 0, "written": 1234, "dropped": 0, "failed_batches": 0}


def test_a_lone_record_is_written_after_the_flush_interval() -> None:
    sink = ListSink()
    log = InvocationLog(sink, batch=500, flush_interval=0.05)
    log.record(inv())
    deadline = time.monotonic() + 10
    while not sink.rows and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(sink.rows) == 1
    log.close()


def test_full_queue_drops_and_counts_without_blocking() -> None:
    sink = BlockingSink()
    log = InvocationLog(sink, max_queue=100, batch=10, flush_interval=0.01)
    log.record(inv(-1))
    assert sink.entered.wait(10)  # the writer is now stuck inside the sink
    start = time.monotonic()
    for i in range(5000):
        log.record(inv(i))
    elapsed = time.monotonic() - start
    assert elapsed < 2.0, f"record() blocked: {elapsed:.3f}s for 5000 calls"
    stats = log.stats()
    assert stats["recorded"] == 5001
    assert stats["dropped"] >= 5000 - 100
    sink.release.set()
    assert log.flush(30)
    stats = log.stats()
    assert stats["written"] + stats["dropped"] == stats["recorded"] == 5001
    assert stats["queued"] == 0
    assert len(sink.rows) == stats["written"]
    log.close()


def test_failing_batches_are_retried_then_dropped_and_the_writer_goes_on() -> None:
    # 3 attempts per batch: the first batch fails 3 times (dropped), the second fails once, then works.
    sink = FlakySink(failures=4)
    log = InvocationLog(sink, batch=5, flush_interval=0.01, retries=3, retry_delay=0.01)
    for i in range(5):
        log.record(inv(i))
    assert log.flush(10)
    assert log.stats()["failed_batches"] == 1
    assert log.stats()["dropped"] == 5
    assert log.last_error == "ConnectionError: database unreachable"
    for i in range(5, 10):
        log.record(inv(i))
    assert log.flush(10)
    stats = log.stats()
    assert stats == {"recorded": 10, "queued": 0, "written": 5, "dropped": 5, "failed_batches": 1}
    assert [r.path for r in sink.rows] == [f"/p/{i}" for i in range(5, 10)]
    assert sink.attempts == 5
    log.close()


def test_record_never_raises_even_on_garbage_or_after_close() -> None:
    class ExplodingSink(ListSink):
        def write_batch(self, batch: Sequence[Invocation]) -> None:
            raise RuntimeError("boom")

    log = InvocationLog(ExplodingSink(), batch=2, flush_interval=0.01, retries=1)
    log.record(None)  # type: ignore[arg-type]
    log.record(inv())
    assert log.flush(10)
    assert log.close(5)
    log.record(inv())  # after close: dropped, not raised
    stats = log.stats()
    assert stats["recorded"] == 3
    assert stats["dropped"] == 3
    assert stats["written"] == 0


def test_close_flushes_what_is_queued() -> None:
    sink = ListSink()
    log = InvocationLog(sink, batch=50, flush_interval=5.0)  # long interval: only close() flushes fast
    for i in range(120):
        log.record(inv(i))
    assert log.close(10)
    assert len(sink.rows) == 120


def test_close_gives_up_on_a_hung_sink() -> None:
    sink = BlockingSink()
    log = InvocationLog(sink, batch=1, flush_interval=0.01)
    log.record(inv())
    assert sink.entered.wait(10)
    start = time.monotonic()
    assert log.close(0.3) is False
    assert time.monotonic() - start < 5
    assert not sink.closed  # never closed under a writer that is still inside it
    sink.release.set()


def test_list_pages_newest_first_with_a_cursor() -> None:
    sink = ListSink()
    log = InvocationLog(sink, flush_interval=0.01)
    for i in range(25):
        log.record(inv(i, fn="a" if i % 2 else "b"))
    assert log.flush(10)
    page1, cursor = log.list("ns", "a", limit=5)
    assert [r.path for r in page1] == ["/p/23", "/p/21", "/p/19", "/p/17", "/p/15"]
    assert cursor == page1[-1].id
    seen = [r.path for r in page1]
    while cursor is not None:
        page, cursor = log.list("ns", "a", limit=5, before_id=cursor)
        seen += [r.path for r in page]
    assert seen == [f"/p/{i}" for i in range(23, 0, -2)]
    everything, cursor = log.list("ns", None, limit=1000)
    assert len(everything) == 25 and cursor is None
    assert log.list("other")[0] == []
    log.close()


@pytest.mark.parametrize("kwargs", [{"max_queue": 0}, {"batch": 0}, {"flush_interval": 0}, {"retries": 0}])
def test_rejects_nonsense_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        InvocationLog(ListSink(), **kwargs)  # type: ignore[arg-type]
