"""The scaler's aggregator: per function, the sum of the latest snapshot of every live reporter."""

from __future__ import annotations

import pytest

from sless_api.services.scaling.aggregator import IDLE, Load, LoadAggregator, TooManyReporters

A = ("tenant-a", "resize")
B = ("tenant-b", "resize")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_snapshots_of_two_reporters_add_up(clock: Clock) -> None:
    agg = LoadAggregator(clock=clock)
    assert agg.report("api-1", {A: Load(2, 1)}, 5) == {A}
    assert agg.report("api-2", {A: Load(3, 0), B: Load(0, 1)}, 5) == {B}
    assert agg.load(A) == Load(5, 1) and agg.load(A).total == 6
    assert agg.load(B) == Load(0, 1) and agg.load(B).active
    assert agg.load(("tenant-a", "other")) is IDLE and not IDLE.active


def test_a_snapshot_replaces_the_reporters_previous_one(clock: Clock) -> None:
    agg = LoadAggregator(clock=clock)
    agg.report("api-1", {A: Load(2, 0), B: Load(1, 0)}, 5)
    agg.report("api-2", {A: Load(1, 0)}, 5)
    changed = agg.report("api-1", {A: Load(4, 0)}, 5)  # B left api-1's snapshot: B is idle again
    assert changed == {B}
    assert agg.load(A) == Load(5, 0) and agg.load(B) is IDLE
    assert agg.report("api-1", {A: Load(0, 0)}, 5) == set()  # a zero entry is dropped; api-2 keeps A active
    assert agg.load(A) == Load(1, 0)
    assert agg.report("api-2", {}, 5) == {A}
    assert agg.load(A) is IDLE and list(agg.functions()) == []


def test_a_reporter_that_stops_reporting_expires_after_its_ttl(clock: Clock) -> None:
    agg = LoadAggregator(clock=clock)
    agg.report("dead", {A: Load(3, 1)}, 2)
    agg.report("alive", {A: Load(1, 0)}, 10)
    clock.now += 1.9
    assert agg.expire() == set() and agg.load(A) == Load(4, 1)
    clock.now += 0.2
    assert agg.expire() == set()  # alive still holds A active
    assert agg.load(A) == Load(1, 0) and agg.reporters == 1
    clock.now += 8
    assert agg.expire() == {A} and agg.load(A) is IDLE and agg.reporters == 0
    assert agg.next_expiry() is None


def test_a_renewed_snapshot_outlives_its_first_ttl(clock: Clock) -> None:
    agg = LoadAggregator(clock=clock)
    agg.report("api-1", {A: Load(1, 0)}, 2)
    clock.now += 1.5
    agg.report("api-1", {A: Load(1, 0)}, 2)
    clock.now += 1.0  # past the first report's expiry, within the second's
    assert agg.expire() == set() and agg.load(A) == Load(1, 0)
    clock.now += 1.0
    assert agg.expire() == {A}


def test_a_report_first_expires_the_dead_and_reports_their_change(clock: Clock) -> None:
    agg = LoadAggregator(clock=clock)
    agg.report("dead", {A: Load(1, 0)}, 1)
    clock.now += 2
    assert agg.report("other", {B: Load(1, 0)}, 5) == {A, B}


def test_the_number_of_reporters_is_bounded_and_the_dead_make_room(clock: Clock) -> None:
    agg = LoadAggregator(max_reporters=2, clock=clock)
    agg.report("api-1", {A: Load(1, 0)}, 1)
    agg.report("api-2", {A: Load(1, 0)}, 5)
    agg.report("api-2", {A: Load(2, 0)}, 5)  # a known reporter is no new one
    with pytest.raises(TooManyReporters):
        agg.report("api-3", {A: Load(1, 0)}, 5)
    assert agg.load(A) == Load(3, 0)  # the refused report changed nothing
    clock.now += 1.5  # api-1 expired
    agg.report("api-3", {A: Load(1, 0)}, 5)
    assert agg.load(A) == Load(3, 0) and agg.reporters == 2


def test_forget_drops_a_reporter_at_once(clock: Clock) -> None:
    agg = LoadAggregator(clock=clock)
    agg.report("api-1", {A: Load(1, 2), B: Load(1, 0)}, 60)
    agg.report("api-2", {B: Load(1, 0)}, 60)
    assert agg.forget("api-1") == {A}
    assert agg.forget("api-1") == set()
    assert agg.load(B) == Load(1, 0)
