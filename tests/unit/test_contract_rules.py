"""The backend-neutral rules (sless_core.contract): each decision both backends take from it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sless_core import contract
from sless_core.errors import ValidationError
from sless_core.models import FunctionSpec, TriggerSpec


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def spec(**changes: object) -> FunctionSpec:
    return FunctionSpec.from_user({"name": "f", "runtime": "python3.11", **changes}, 900)


@pytest.mark.parametrize(("change", "rebuilds"), [
    ({"runtime": "nodejs20"}, True), ({"entrypoint": "main.run"}, True),
    ({"env_vars": {"A": "1"}}, False), ({"memory_mb": 512}, False), ({"timeout_sec": 5}, False),
])
def test_only_runtime_and_entrypoint_changes_rebuild(change: dict[str, object], rebuilds: bool) -> None:
    assert contract.spec_change_rebuilds(spec(), spec(**change)) is rebuilds


@pytest.mark.parametrize(("current", "phase", "builds"), [
    (None, "Pending", True), ("b" * 64, "Ready", True), ("a" * 64, "Ready", False),
    ("a" * 64, "Building", False), ("a" * 64, "Failed", True),
])
def test_identical_code_builds_only_a_failed_function(current: str | None, phase: str, builds: bool) -> None:
    assert contract.upload_builds(current, phase, "a" * 64) is builds
    assert contract.identical_upload_message("ready") == "identical code uploaded: no rebuild (ready)"


@pytest.mark.parametrize(("run_id", "phase", "requested", "decision"), [
    (1, "Succeeded", 1, contract.Rerun.NOTHING), (1, "Running", 1, contract.Rerun.NOTHING),
    (0, "Recorded", 1, contract.Rerun.RUN), (1, "Failed", 5, contract.Rerun.RUN),
    (1, "Pending", 2, contract.Rerun.BUSY), (1, "Running", 2, contract.Rerun.BUSY),
])
def test_run_id_moves(run_id: int, phase: str, requested: int, decision: contract.Rerun) -> None:
    assert contract.rerun(run_id, phase, requested) is decision


def test_run_id_never_shrinks() -> None:
    with pytest.raises(ValidationError) as caught:
        contract.rerun(3, "Succeeded", 2)
    assert caught.value.field == "run_id"


def trig(name: str, queue: str | None, kind: str = "event", **more: object) -> TriggerSpec:
    body: dict[str, object] = {"name": name, "type": kind, "function": "f", **more}
    if queue is not None:
        body["queue"] = queue
    return TriggerSpec.from_user(body)


def test_one_event_trigger_per_queue() -> None:
    others = [trig("web", None, "http"), trig("first", "orders", enabled=False), trig("other", "refunds")]
    holder = contract.queue_holder(trig("second", "orders"), others)
    assert holder is not None and holder.name == "first"  # a disabled trigger keeps its queue
    assert contract.queue_holder(trig("first", "orders"), others) is None  # itself, patched
    assert contract.queue_holder(trig("third", "new"), others) is None
    assert contract.queue_holder(trig("web2", None, "http"), others) is None


def test_a_firing_carries_its_tick_in_utc() -> None:
    event = contract.cron_event("nightly", "0 3 * * *", at("2026-01-02T03:00:00"))
    assert event == {"type": "cron", "trigger": "nightly", "schedule": "0 3 * * *",
                     "scheduled_at": "2026-01-02T03:00:00Z"}


def test_due_tick_fires_the_latest_missed_tick_within_the_deadline_only() -> None:
    every5 = "*/5 * * * *"
    assert contract.due_tick(every5, at("2026-01-02T03:05:00"), None) == at("2026-01-02T03:05:00")
    assert contract.due_tick(every5, at("2026-01-02T03:07:30"), at("2026-01-02T03:00:00")) == at("2026-01-02T03:05:00")
    assert contract.due_tick(every5, at("2026-01-02T03:07:30"), at("2026-01-02T03:05:00")) is None  # fired
    late = at("2026-01-02T03:00:00") + contract.CRON_START_DEADLINE_SEC + 1
    assert contract.due_tick("0 3 * * *", late, None) is None  # too late: skipped, never replayed
    assert contract.due_tick("0 3 * * *", late - 2, None) == at("2026-01-02T03:00:00")
    assert contract.next_tick(every5, at("2026-01-02T03:05:00")) == at("2026-01-02T03:10:00")
