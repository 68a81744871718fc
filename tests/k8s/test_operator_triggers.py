"""Triggers against the test bed: http scaling, cron CronJobs, event triggers."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from sless_core import runrecord

if TYPE_CHECKING:
    from tests.support.kube_operator import Sless

#: What kwok serves as any pod's log (tests/testbed/bedlib/kwokconf.py)
KWOK_DEFAULT_LOG = "sless-testbed: kwok runs no containers; this is the default log"

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def replicas(sless: Sless, name: str) -> int | None:
    dep = sless.get("deployment", name)
    return None if dep is None else int(dep["spec"]["replicas"])


def ready(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})


def test_http_trigger_disable_scales_to_zero_and_back(sless: Sless) -> None:
    sless.function("web", replicas=2)
    sless.wait_phase("Function", "web", "Ready")
    assert replicas(sless, "web") == 2
    sless.apply("Trigger", "web-http", {"type": "http", "function": "web"})
    sless.op.wait("trigger status", lambda: "serving /fn/" in sless.status("Trigger", "web-http").get("message", ""))

    sless.patch_spec("Trigger", "web-http", enabled=False)
    sless.op.wait("scaled to 0", lambda: replicas(sless, "web") == 0)
    status = sless.op.wait("disabled status", lambda: (s := sless.status("Trigger", "web-http"))
                           and "answers 404" in s.get("message", "") and s)  # fmt: skip
    assert ready(status)["reason"] == "Disabled"
    body = sless.wait_phase("Function", "web", "Ready")  # zero replicas is a finished rollout
    assert body["spec"]["replicas"] == 2
    sless.op.wait("pods gone", lambda: not sless.labelled("pods", "sless.dev/function=web"))

    sless.patch_spec("Trigger", "web-http", enabled=True)
    sless.op.wait("scaled back to 2", lambda: replicas(sless, "web") == 2)

    sless.patch_spec("Trigger", "web-http", enabled=False)
    sless.op.wait("scaled to 0 again", lambda: replicas(sless, "web") == 0)
    sless.delete("Trigger", "web-http")  # no http trigger left: the function runs again
    sless.wait_gone("Trigger", "web-http")
    sless.op.wait("replicas restored on delete", lambda: replicas(sless, "web") == 2)


def test_disabled_http_trigger_before_the_build_deploys_at_zero(sless: Sless) -> None:
    sless.apply("Trigger", "late-http", {"type": "http", "function": "late", "enabled": False})
    sless.function("late")
    sless.wait_phase("Function", "late", "Ready")
    assert replicas(sless, "late") == 0


def test_cron_trigger_creates_suspends_and_follows_rebuilds(sless: Sless) -> None:
    sless.apply("Trigger", "tick", {"type": "cron", "function": "clock", "schedule": "*/5 * * * *"})
    status = sless.op.wait("waiting message", lambda: (s := sless.status("Trigger", "tick")) and "waiting" in
                           s.get("message", "") and s)  # fmt: skip
    assert ready(status)["status"] == "False"
    assert sless.get("cronjob", "tick-cron") is None  # no image to run yet

    sless.function("clock")
    body = sless.wait_phase("Function", "clock", "Ready")
    cron = sless.op.wait("CronJob created", lambda: sless.get("cronjob", "tick-cron"))
    trigger = sless.get("Trigger", "tick")
    assert trigger is not None
    assert cron["spec"]["schedule"] == "*/5 * * * *" and cron["spec"]["suspend"] is False
    assert cron["metadata"]["ownerReferences"][0]["uid"] == trigger["metadata"]["uid"]
    container = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == body["status"]["image"]
    assert container["command"] == ["python3", "/app/runtime/runner.py"]
    event = next(e["value"] for e in container["env"] if e["name"] == "SLESS_EVENT")
    assert json.loads(event)["trigger"] == "tick"
    sless.op.wait("scheduled message", lambda: "scheduled" in sless.status("Trigger", "tick").get("message", ""))

    sless.patch_spec("Trigger", "tick", enabled=False)
    sless.op.wait("suspended", lambda: (sless.get("cronjob", "tick-cron") or {}).get("spec", {}).get("suspend"))
    sless.op.wait("suspended message", lambda: "suspended" in sless.status("Trigger", "tick").get("message", ""))

    sless.patch_spec("Function", "clock", codeHash="d4" * 32, contextKey=f"contexts/{sless.ns}/clock/d.tar.gz")
    new_image = sless.wait_phase("Function", "clock", "Ready")["status"]["image"]

    def cron_image() -> str:
        cj = sless.get("cronjob", "tick-cron") or {}
        return str(cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["image"]) if cj else ""

    sless.op.wait("CronJob follows the rebuild", lambda: cron_image() == new_image)
    assert (sless.get("cronjob", "tick-cron") or {})["spec"]["suspend"] is True

    sless.delete("Trigger", "tick")
    sless.wait_gone("cronjob", "tick-cron")  # garbage collection: owned by the Trigger


def test_event_trigger_is_left_to_the_dispatcher(sless: Sless) -> None:
    sless.apply("Trigger", "on-order", {"type": "event", "function": "any", "queue": "orders"})
    status = sless.op.wait("event status", lambda: sless.status("Trigger", "on-order").get("message"))
    assert status == "event triggers are served by the event dispatcher"


def test_a_cron_firing_is_recorded_on_the_trigger(sless: Sless) -> None:
    """The CronJob's Job (kwok completes its pod) becomes lastFiredAt and a LastRun condition."""
    sless.function("ticker")
    sless.wait_phase("Function", "ticker", "Ready")
    sless.apply("Trigger", "minutely", {"type": "cron", "function": "ticker", "schedule": "* * * * *"})

    def recorded() -> dict[str, Any] | None:
        status = sless.status("Trigger", "minutely")
        last = next((c for c in status.get("conditions", []) if c["type"] == "LastRun"), {})
        return status if status.get("lastFiredAt") and last.get("status") == "True" else None

    status = sless.op.wait("a firing recorded", recorded, timeout=150, interval=1)
    jobs = sless.labelled("jobs", "sless.dev/trigger=minutely")
    fired = {j["status"].get("startTime"): j["metadata"]["name"] for j in jobs}
    assert status["lastFiredAt"] in fired, (status, fired)
    last = next(c for c in status["conditions"] if c["type"] == "LastRun")
    assert last["reason"] == "Succeeded"
    assert last["message"].startswith(f"{fired[status['lastFiredAt']]}: ")
    assert ready(status)["reason"] == "Scheduled"  # the trigger's own condition is kept
    # the firing's invocation record for the API: its Job, function, outcome and what its pod "printed" (kwok's
    # default log for a pod it runs)
    job = next(j for j in jobs if j["metadata"]["name"] == fired[status["lastFiredAt"]])
    record = runrecord.parse(status)
    assert record is not None, status
    assert (record.uid, record.job, record.function, record.trigger) == (job["metadata"]["uid"],
                                                                         job["metadata"]["name"], "ticker", "cron")
    assert record.succeeded and record.start_time == status["lastFiredAt"]
    assert [(stream, text) for stream, text, _ in record.lines] == [("log", KWOK_DEFAULT_LOG)]
    assert record.version == 1  # the CronJob's Jobs name the version they run
