"""What `sless up` honours of a function's ``scale`` (one process per function): ``idle_sec`` as its own idle
timeout, ``min`` >= 1 as one process kept warm; ``max`` and ``target`` are not handed to the supervisor."""

from __future__ import annotations

from sless_api.backends.standalone.routing import StandaloneRouter
from sless_core.models import FunctionSpec


def spec(scale: object) -> FunctionSpec:
    return FunctionSpec.from_user({"name": "f", "runtime": "python3.11", "scale": scale}, 900)


def test_scale_reaches_the_supervisor_as_idle_time_and_warmth() -> None:
    assert StandaloneRouter._scaling(spec(None)) == {}
    assert StandaloneRouter._scaling(spec({})) == {"idle_sec": 300.0, "keep_warm": False}
    assert StandaloneRouter._scaling(spec({"min": 1, "max": 5, "target": 3, "idle_sec": 30})) == {
        "idle_sec": 30.0, "keep_warm": True}
