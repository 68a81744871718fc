"""What `sless up` honours of a function's ``scale``: ``idle_sec`` as its own idle timeout, ``min`` as processes
kept warm, ``max`` and ``target`` as the supervisor's pool (host/pool.py), and a scaled function's
``max_concurrency`` per process (the proxy's limit for the whole function is that times ``max``)."""

from __future__ import annotations

from sless_api.backends.standalone.host.pool import DemandMemory, Scale, pick
from sless_api.backends.standalone.routing import StandaloneRouter
from sless_core.models import FunctionSpec


def spec(scale: object, max_concurrency: int = 0) -> FunctionSpec:
    return FunctionSpec.from_user({"name": "f", "runtime": "python3.11", "scale": scale,
                                   "max_concurrency": max_concurrency}, 900)


def test_scale_reaches_the_supervisor_as_idle_time_warmth_and_pool() -> None:
    assert StandaloneRouter._scaling(spec(None)) == {}
    assert StandaloneRouter._scaling(spec({})) == {"idle_sec": 300.0, "keep_warm": False,
                                                   "scale": Scale(min=0, max=10, target=10, limit=0)}
    assert StandaloneRouter._scaling(spec({"min": 1, "max": 5, "target": 3, "idle_sec": 30}, 2)) == {
        "idle_sec": 30.0, "keep_warm": True, "scale": Scale(min=1, max=5, target=3, limit=2)}


def test_a_scaled_function_limit_is_per_process() -> None:
    assert StandaloneRouter.function_limit(spec(None, 4)) == 4
    assert StandaloneRouter.function_limit(spec({"max": 3}, 4)) == 12
    assert StandaloneRouter.function_limit(spec({"max": 3}, 0)) == 0  # no limit stays none


class Proc:
    def __init__(self, inflight: int) -> None:
        self.inflight = inflight


def test_processes_wanted_follow_demand_between_min_and_max() -> None:
    scale = Scale(min=1, max=3, target=2)
    assert [scale.wanted(d) for d in (0, 1, 2, 3, 4, 5, 9)] == [1, 1, 1, 2, 2, 3, 3]
    assert Scale(max=3, target=10, limit=1).wanted(2) == 2, "a full process wants another below its target"


def test_pick_takes_the_least_busy_below_a_bound_and_the_oldest_on_ties() -> None:
    a, b, c = Proc(1), Proc(0), Proc(0)
    assert pick([a, b, c], 1) is b
    assert pick([a], 1) is None
    assert pick([a], 0) is a


def test_demand_memory_says_the_most_processes_needed_since_a_time() -> None:
    memory = DemandMemory()
    memory.note(3, 10.0)
    memory.note(1, 20.0)
    assert memory.needed_within(5.0) == 3
    assert memory.needed_within(15.0) == 1
    assert memory.needed_within(25.0) == 0
