"""LoadReporter's counting, without a scaler: what a report would carry, and the Kubernetes activator's sink."""

from __future__ import annotations

import asyncio

from sless_api.backends.kube.activator import Demand
from sless_api.services.scaling.reporter import LoadReporter, default_reporter_id

NS = "tenant-a"


def make() -> LoadReporter:
    return LoadReporter("127.0.0.1:1", "token-0123456789abcdef", default_reporter_id("test"))


def test_calls_are_counted_per_function_in_flight_and_waiting() -> None:
    api = make()

    async def run() -> None:
        async with api.waiting(NS, "fn"), api.inflight(NS, "fn"), api.inflight(NS, "fn"), \
                api.inflight("tenant-b", "fn"):
            assert api.counts() == {(NS, "fn"): (2, 1), ("tenant-b", "fn"): (1, 0)}
        assert api.counts() == {}

    asyncio.run(run())


def test_it_is_the_activators_demand_sink() -> None:
    demand: Demand = make()  # mypy checks the protocol; the calls below its meaning
    assert isinstance(demand, LoadReporter)
    demand.call_started(NS, "fn")  # as the activator calls them: a call, part of which waits for a replica
    assert demand.counts() == {(NS, "fn"): (1, 0)}
    demand.waiting_started(NS, "fn")
    assert demand.counts() == {(NS, "fn"): (0, 1)}  # one call, counted once: now waiting
    assert demand._wake.is_set()  # the function's first waiter is reported at once
    demand.waiting_ended(NS, "fn")
    assert demand.counts() == {(NS, "fn"): (1, 0)}
    demand.call_ended(NS, "fn")
    assert demand.counts() == {}


def test_the_first_waiter_of_a_function_wakes_the_sender_and_later_ones_do_not() -> None:
    api = make()
    api.begin(NS, "fn", waiting=True)
    assert api._wake.is_set()
    api._wake.clear()
    api.begin(NS, "fn", waiting=True)
    api.begin(NS, "fn")
    assert not api._wake.is_set()
    api.begin(NS, "other", waiting=True)
    assert api._wake.is_set()


def test_reporter_ids_differ_between_reporters() -> None:
    assert default_reporter_id() != default_reporter_id()
    assert default_reporter_id("events").startswith("events-") and len(default_reporter_id()) <= 128
