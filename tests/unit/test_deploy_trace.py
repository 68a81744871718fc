"""The operator's record of a traced change (``status.trace``) and the spans it makes of it, without a cluster."""

from __future__ import annotations

from sless_core import crd
from sless_operator.deploytrace import DeployTrace, PlannedSpan
from sless_operator.runtrace import timestamp_ns, traceparent_of

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
META = {"annotations": {crd.ANNOTATION_TRACEPARENT: TP}}


def test_an_untraced_function_has_no_record() -> None:
    assert DeployTrace.of({}, {}, 5) is None


def test_a_new_traceparent_starts_a_new_record_and_the_same_one_keeps_it() -> None:
    old = {"trace": DeployTrace("00-other-01", 1, emitted=True).to_status()}
    fresh = DeployTrace.of(META, old, 10)
    assert fresh == DeployTrace(TP, 10)
    kept = {"trace": DeployTrace(TP, 3, build_start=4).to_status()}
    assert DeployTrace.of(META, kept, 10) == DeployTrace(TP, 3, build_start=4)


def test_a_hand_edited_record_starts_again() -> None:
    assert DeployTrace.of(META, {"trace": {"traceparent": TP, "seen": "soon"}}, 10) == DeployTrace(TP, 10)


def test_the_steps_of_a_build_then_a_rollout() -> None:
    trace = DeployTrace(TP, 1).step("building", False, False, 2).step("building", False, False, 3)
    assert (trace.build_start, trace.build_end, trace.rollout_start) == (2, 0, 0)
    trace = trace.step("built", True, False, 5).step("built", True, False, 7)
    assert (trace.build_start, trace.build_end, trace.rollout_start) == (2, 5, 5)


def test_an_emitted_record_takes_no_more_steps() -> None:
    done = DeployTrace(TP, 1, emitted=True)
    assert done.step("building", True, False, 9) is done


def test_the_spans_of_a_build_and_a_rollout_sit_inside_the_reconcile() -> None:
    root, children = DeployTrace(TP, 10, build_start=12, build_end=20, rollout_start=21).spans(30, "Ready", "")
    assert root == PlannedSpan("reconcile", 10, 30)
    assert children == [PlannedSpan("build", 12, 20), PlannedSpan("rollout", 21, 30)]


def test_fetched_code_has_a_fetch_span_until_the_rollout() -> None:
    _, children = DeployTrace(TP, 10, rollout_start=14, fetched=True).spans(30, "Ready", "")
    assert children == [PlannedSpan("fetch", 10, 14), PlannedSpan("rollout", 14, 30)]


def test_a_failed_build_fails_the_build_and_the_reconcile_with_the_reason() -> None:
    root, children = DeployTrace(TP, 10, build_start=11, build_end=19).spans(20, "Failed", "build failed: pip")
    assert root.error == "build failed: pip" and children == [PlannedSpan("build", 11, 19, "build failed: pip")]


def test_a_failed_rollout_fails_the_rollout_not_the_build() -> None:
    _, children = DeployTrace(TP, 10, build_start=11, build_end=12, rollout_start=13).spans(20, "Failed", "stuck")
    assert children == [PlannedSpan("build", 11, 12), PlannedSpan("rollout", 13, 20, "stuck")]


def test_times_outside_the_reconcile_are_clamped_into_it() -> None:
    root, [build] = DeployTrace(TP, 10, build_start=5, build_end=40).spans(30, "Ready", "")
    assert (root.start, root.end, build.start, build.end) == (10, 30, 10, 30)


def test_a_run_reads_its_traceparent_and_the_api_servers_times() -> None:
    assert traceparent_of({"annotations": {crd.ANNOTATION_TRACEPARENT: TP}}) == TP
    assert traceparent_of({}) == ""
    assert timestamp_ns("2024-05-01T10:00:00Z", 0) == 1714557600 * 1_000_000_000
    assert timestamp_ns("", 7) == 7
