"""Traces of deploys, jobs and cron firings on Kubernetes: the API and the real operator exporting over OTLP to a
real OpenTelemetry Collector (``otlp_receiver``), on the kwok test bed.

A deploy through the API is a server span ``deploy <namespace>/<function>`` whose context goes on the Function
(``sless.dev/traceparent``); the operator, once that change is Ready or Failed, records ``reconcile`` with its
``build`` (or ``fetch``) and ``rollout`` under it, once. A FunctionJob's run pod gets ``TRACEPARENT`` and the
operator records ``job <namespace>/<job>``; a cron firing is a root span ``cron <namespace>/<trigger>``. kwok
runs no containers: build, run and cron pods end as its Stages say (they succeed unless a test's Stage fails them).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sless_core import crd
from tests.support.kube_api import HELLO, KubeApi, start_api, wait_api, zip_hash
from tests.support.kube_operator import CODE_A, Operator, Sless, operator_for
from tests.support.otlp import OtlpReceiver, Span
from tests.support.platform import Tenant
from tests.support.poll import holds, until
from tests.support.services import S3Endpoint
from tests.support.testbed import Testbed

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def otel_env(receiver: OtlpReceiver) -> dict[str, str]:
    return {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100"}  # fmt: skip


def caller() -> tuple[str, str, str]:
    """A caller's trace id, span id and ``traceparent``."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def of_trace(receiver: OtlpReceiver, trace_id: str, names: set[str], timeout: float = 60) -> dict[str, Span]:
    """The spans of TRACE_ID by name, once every one of NAMES has arrived."""
    def found() -> dict[str, Span] | None:
        spans = {s["name"]: s for s in receiver.spans() if s["trace_id"] == trace_id}
        return spans if names <= set(spans) else None
    try:
        return until(f"spans {sorted(names)} of trace {trace_id}", found, timeout, 0.1)
    except AssertionError as exc:
        seen = sorted((s["trace_id"] == trace_id, s["service_name"], s["name"]) for s in receiver.spans())
        raise AssertionError(f"{exc}; received (of this trace, service, name): {seen[-20:]}") from None


def named(receiver: OtlpReceiver, name: str) -> list[Span]:
    return [s for s in receiver.spans() if s["name"] == name]


@pytest.fixture(scope="module")
def traced_api(k8s_testbed: Testbed, s3_endpoint: S3Endpoint, otlp_receiver: OtlpReceiver,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApi]:  # fmt: skip
    """The API on the kubernetes backend, tracing to the receiver."""
    api = start_api(k8s_testbed, s3_endpoint, tmp_path_factory.mktemp("traced-kube-api"), otel_env(otlp_receiver))
    yield api
    api.stop()
    api.gate.close()


@pytest.fixture
def served(traced_api: KubeApi, otlp_receiver: OtlpReceiver, tmp_path: Path) -> Iterator[tuple[Tenant, Operator]]:
    """A tenant the API created, served by its own operator process tracing to the receiver."""
    bed = traced_api.bed
    t = traced_api.tenant("traced")
    t.api("POST", "/ensure", expect=201)
    with operator_for(bed, t.ns, tmp_path, {**traced_api.s3.env(), **otel_env(otlp_receiver)}) as op:
        yield t, op


@pytest.fixture
def traced_sless(sless_crds: Testbed, tenant: str, otlp_receiver: OtlpReceiver, tmp_path: Path) -> Iterator[Sless]:
    """Our resources in a fresh tenant namespace, served by an operator tracing to the receiver."""
    build_ns = f"sless-build-{secrets.token_hex(4)}"
    op = Operator(sless_crds, tenant, build_ns, tmp_path, extra_env=otel_env(otlp_receiver)).start()
    try:
        yield Sless(sless_crds, tenant, op)
    finally:
        op.stop()
        sless_crds.kubectl("delete", "namespace", build_ns, "--wait=false", "--ignore-not-found", check=False)


def traced_function(sless: Sless, name: str, traceparent: str) -> None:
    """A Function to build (an image from a build context), applied with a deploy's ``traceparent``."""
    sless.bed.apply({"apiVersion": crd.API_VERSION, "kind": "Function",
                     "metadata": {"name": name, "namespace": sless.ns,
                                  "annotations": {crd.ANNOTATION_TRACEPARENT: traceparent}},
                     "spec": {"runtime": "python3.11", "codeHash": CODE_A,
                              "contextKey": f"contexts/{sless.ns}/{name}/{CODE_A[:8]}.tar.gz"}})  # fmt: skip


def test_a_deploy_is_one_trace_from_the_request_to_the_rollout_and_a_restart_does_not_repeat_it(
        served: tuple[Tenant, Operator], otlp_receiver: OtlpReceiver) -> None:
    t, op = served
    t.api("POST", "/functions", json={"name": "deps", "runtime": "python3.11"}, expect=201)
    trace_id, caller_span, header = caller()
    data, digest = zip_hash({**HELLO, "requirements.txt": "six==1.16.0\n"})
    t.api("POST", "/functions/deps/upload", files={"code": ("code.zip", data, "application/zip")},
          headers={"traceparent": header}, expect=202)
    wait_api(op, "Ready", t, "/functions/deps", lambda b: b["phase"] == "Ready" and b["code_hash"] == digest)

    reconcile_name = f"reconcile {t.ns}/deps"
    spans = of_trace(otlp_receiver, trace_id, {f"deploy {t.ns}/deps", reconcile_name, "build", "rollout"})
    deploy, reconcile = spans[f"deploy {t.ns}/deps"], spans[reconcile_name]
    build, rollout = spans["build"], spans["rollout"]
    assert (deploy["parent_span_id"], deploy["kind"], deploy["service_name"]) == (caller_span, "SERVER", "sless-api")
    assert (reconcile["parent_span_id"], reconcile["service_name"]) == (deploy["span_id"], "sless-operator")
    assert build["parent_span_id"] == rollout["parent_span_id"] == reconcile["span_id"]
    assert reconcile["status_code"] != "ERROR" and reconcile["attributes"]["sless.phase"] == "Ready"
    # the operator sees the change once the API wrote it; its parts follow each other inside the reconcile
    assert deploy["start_ns"] <= reconcile["start_ns"] <= build["start_ns"] <= build["end_ns"]
    assert build["end_ns"] <= rollout["start_ns"] <= rollout["end_ns"] <= reconcile["end_ns"]
    for span in (deploy, reconcile, build, rollout):
        print(f"{span['name']:<40} parent={span['parent_span_id'] or '-':<16} "
              f"start=+{(span['start_ns'] - deploy['start_ns']) / 1e6:9.1f} ms "
              f"duration={(span['end_ns'] - span['start_ns']) / 1e6:9.1f} ms")
    status = t.api("GET", "/functions/deps", expect=200).json()
    assert status["phase"] == "Ready"

    # a restart resumes every Function: the emitted marker in the status keeps the spans from coming again
    op.stop()
    op.start()
    later_trace, _, later_header = caller()
    t.api("POST", "/functions", json={"name": "after", "runtime": "python3.11"}, expect=201)
    t.api("POST", "/functions/after/upload", files={"code": ("code.zip", zip_hash(HELLO)[0], "application/zip")},
          headers={"traceparent": later_header}, expect=202)
    wait_api(op, "the later function Ready", t, "/functions/after", lambda b: b["phase"] == "Ready")
    later = of_trace(otlp_receiver, later_trace, {f"reconcile {t.ns}/after", "fetch", "rollout"})
    assert later["fetch"]["parent_span_id"] == later[f"reconcile {t.ns}/after"]["span_id"]  # code fetched, no build
    assert len(named(otlp_receiver, reconcile_name)) == 1, "the restarted operator emitted the reconcile again"
    holds("one reconcile span per change", lambda: len(named(otlp_receiver, reconcile_name)) == 1, for_sec=2,
          why="the restarted operator resumed every Function before it made the later one Ready (its start-up "
              "resumes them first) and spans reach the receiver within 0.1 s (OTEL_BSP_SCHEDULE_DELAY); 2 s more "
              "covers a late export of a repeated span")  # fmt: skip


def test_a_failed_build_is_an_error_reconcile_with_the_reason(
        traced_sless: Sless, pod_outcome: Callable[..., str], otlp_receiver: OtlpReceiver) -> None:
    sless = traced_sless
    pod_outcome(labels={"sless.dev/function": "broken", "sless.dev/code-hash": CODE_A[:16]},
                namespace=sless.op.build_namespace, succeed=False,
                message="ERROR: No matching distribution found for nosuchpkg")  # fmt: skip
    trace_id, caller_span, header = caller()
    traced_function(sless, "broken", header)
    sless.wait_phase("Function", "broken", "Failed", timeout=120)
    spans = of_trace(otlp_receiver, trace_id, {f"reconcile {sless.ns}/broken", "build"})
    reconcile, build = spans[f"reconcile {sless.ns}/broken"], spans["build"]
    assert reconcile["parent_span_id"] == caller_span and build["parent_span_id"] == reconcile["span_id"]
    assert reconcile["status_code"] == build["status_code"] == "ERROR"
    assert "nosuchpkg" in reconcile["status_message"], reconcile
    assert "rollout" not in spans  # nothing was rolled out
    assert sless.status("Function", "broken")["trace"]["emitted"] is True


def test_untraced_the_operator_exports_nothing_and_keeps_no_marker(sless: Sless) -> None:
    """An operator without OTEL_* (the ``sless`` fixture's) leaves a traced Function's status as it was."""
    _, _, header = caller()
    traced_function(sless, "plain", header)
    status = sless.wait_phase("Function", "plain", "Ready")["status"]
    assert "trace" not in status
    assert "OTEL_TRACES_EXPORTER" not in sless.op.env and "OTEL_EXPORTER_OTLP_ENDPOINT" not in sless.op.env


def test_a_job_run_continues_the_trace_of_its_creation(served: tuple[Tenant, Operator],
                                                       otlp_receiver: OtlpReceiver) -> None:
    t, op = served
    t.api("POST", "/functions", json={"name": "worker", "runtime": "python3.11"}, expect=201)
    t.api("POST", "/functions/worker/upload", files={"code": ("code.zip", zip_hash(HELLO)[0], "application/zip")},
          expect=202)
    wait_api(op, "worker Ready", t, "/functions/worker", lambda b: b["phase"] == "Ready")
    trace_id, caller_span, header = caller()
    t.api("POST", "/jobs", json={"name": "once", "function": "worker", "event": {}}, headers={"traceparent": header},
          expect=201)
    done = wait_api(op, "job finished", t, "/jobs/once", lambda b: b["phase"] in ("Succeeded", "Failed"))
    assert done["phase"] == "Succeeded", done

    spans = of_trace(otlp_receiver, trace_id, {f"submit job {t.ns}/once", f"job {t.ns}/once"})
    submit, run = spans[f"submit job {t.ns}/once"], spans[f"job {t.ns}/once"]
    assert submit["parent_span_id"] == caller_span and run["parent_span_id"] == submit["span_id"]
    assert run["service_name"] == "sless-operator" and run["attributes"]["sless.outcome"] == "succeeded"
    assert run["start_ns"] <= run["end_ns"]
    [job] = (op.bed.get("jobs", "-n", t.ns, "-l", f"{crd.LABEL_JOB}=once") or {})["items"]
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TRACEPARENT"] == f"00-{trace_id}-{submit['span_id']}-01"


def test_a_cron_firing_is_a_root_span_with_its_outcome(traced_sless: Sless, otlp_receiver: OtlpReceiver) -> None:
    sless = traced_sless
    sless.function("ticker")
    sless.wait_phase("Function", "ticker", "Ready")
    sless.apply("Trigger", "nightly", {"type": "cron", "function": "ticker", "schedule": "0 3 * * *"})
    sless.op.wait("the CronJob", lambda: sless.get("cronjobs", "nightly-cron"))
    # fired now rather than at 03:00: a Job from the CronJob's template, as the CronJob controller makes them
    sless.bed.kubectl("-n", sless.ns, "create", "job", "--from=cronjob/nightly-cron", "nightly-now")

    [span] = sless.op.wait("the firing's span", lambda: named(otlp_receiver, f"cron {sless.ns}/nightly"), timeout=90)
    assert span["parent_span_id"] == "" and span["service_name"] == "sless-operator"
    assert span["attributes"]["sless.outcome"] == "succeeded" and span["attributes"]["sless.job"] == "nightly-now"
    assert sless.status("Trigger", "nightly")["tracedRun"] == "nightly-now"
