"""The operator dies and comes back: no duplicates, nothing forgotten, nothing left behind."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.support.poll import holds

if TYPE_CHECKING:
    from tests.support.kube_operator import Sless

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

NAMES = [f"crash-{i}" for i in range(6)]


def assert_one_set(sless: Sless, name: str) -> None:
    selector = f"sless.dev/function={name}"
    assert len(sless.build_jobs(name)) == 1, name
    assert len(sless.labelled("deployments", selector)) == 1, name
    assert len(sless.labelled("services", selector)) == 1, name
    assert len(sless.labelled("replicasets", selector)) == 1, name
    assert len(sless.labelled("pods", f"{selector},sless.dev/component=function")) == 1, name


def test_sigkill_while_creating_then_restart_gives_exactly_one_set_of_children(sless: Sless) -> None:
    op = sless.op
    for name in NAMES:
        sless.function(name)
    # kill in the middle: as soon as the first child exists, most Functions are half done
    op.wait("first build Job", lambda: any(sless.build_jobs(n) for n in NAMES), timeout=60)
    op.kill()
    half = {n: bool(sless.build_jobs(n)) for n in NAMES}
    deployed = {n: sless.get("deployment", n) is not None for n in NAMES}
    assert not all(deployed.values()), "the operator finished everything before it was killed; kill earlier"
    op.start()
    for name in NAMES:
        sless.wait_phase("Function", name, "Ready", timeout=120)
    for name in NAMES:
        assert_one_set(sless, name)
    print(f"killed with build Jobs {half} and Deployments {deployed}")


def test_function_deleted_while_the_operator_is_down_is_cleaned_after_restart(sless: Sless) -> None:
    op = sless.op
    sless.function("orphan")
    sless.wait_phase("Function", "orphan", "Ready")
    sless.apply("Trigger", "orphan-tick", {"type": "cron", "function": "orphan", "schedule": "0 * * * *"})
    op.wait("CronJob", lambda: sless.get("cronjob", "orphan-tick-cron"))
    assert op.stop() == 0  # a clean SIGTERM exit

    sless.delete("Function", "orphan")

    def held() -> bool:
        """The finalizer holds the Function (marked for deletion) and with it its children."""
        body = sless.get("Function", "orphan")
        return (body is not None and bool(body["metadata"].get("deletionTimestamp"))
                and sless.get("deployment", "orphan") is not None and bool(sless.build_jobs("orphan")))

    holds("the finalizer holds the Function and its children while nobody handles it", held, for_sec=3,
          why="only the operator removes the finalizer, and it is stopped; were the Function let go, the API server "
          "would drop it at once and the garbage collector its children within a second or two; 3 s shows that",
          interval=0.5)

    op.start()
    sless.wait_gone("Function", "orphan")
    sless.wait_gone("deployment", "orphan")
    sless.wait_gone("service", "orphan")
    sless.wait_gone("cronjob", "orphan-tick-cron")
    op.wait("build Job deleted", lambda: not sless.build_jobs("orphan"))


def test_build_finished_while_the_operator_was_down_is_picked_up(sless: Sless) -> None:
    op = sless.op
    sless.function("resume")
    op.wait("build Job", lambda: sless.build_jobs("resume"))
    op.kill()
    op.wait("build Job complete", lambda: any(
        c["type"] == "Complete" for j in sless.build_jobs("resume") for c in j.get("status", {}).get("conditions", [])
    ))  # fmt: skip
    op.start()
    sless.wait_phase("Function", "resume", "Ready")
    assert_one_set(sless, "resume")
