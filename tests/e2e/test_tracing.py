"""Traces end to end: `sless up` exporting over OTLP to a real OpenTelemetry Collector (``otlp_receiver``).

A call through /fn continues its caller's trace (server span, upstream client span, the runtime's phases under it,
and the function gets the upstream span's context); an asynchronous call continues the trace of the request that
queued it; an event continues its message's ``traceparent`` (the CloudEvents distributed-tracing extension).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.otlp import OtlpReceiver
from tests.support.platform import SlessProcess, Tenant, make_zip, start_sless
from tests.support.poll import until
from tests.support.rabbitmq import RabbitBroker, queue_counts

pytestmark = [pytest.mark.e2e, pytest.mark.rabbitmq]
ECHO = "def handle(event):\n    return {'traceparent': event['_headers'].get('traceparent')}\n"


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, otlp_receiver: OtlpReceiver,
           rabbitmq_url: str) -> Iterator[SlessProcess]:
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.endpoint,
           "OTEL_BSP_SCHEDULE_DELAY": "100", "SLESS_RABBITMQ_URL": rabbitmq_url, "SLESS_SANDBOX": "off",
           "SLESS_EVENT_RECONNECT_MAX_SEC": "1"}
    sp = start_sless(Path(tmp_path_factory.mktemp("traced")), env)
    yield sp
    assert sp.stop() == 0, sp.log_tail()


def parent_header() -> tuple[str, str, str]:
    """A caller's traceparent: its trace id, its span id, and the header."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def of_trace(receiver: OtlpReceiver, trace_id: str, names: set[str]) -> dict[str, dict[str, Any]]:
    """The spans of TRACE_ID by name, once every one of NAMES has arrived."""
    def found() -> dict[str, dict[str, Any]] | None:
        spans = {s["name"]: s for s in receiver.spans() if s["trace_id"] == trace_id}
        return spans if names <= set(spans) else None
    return until(f"spans {sorted(names)} of trace {trace_id}", found, 30, 0.1)


def test_a_call_continues_its_callers_trace(traced: SlessProcess, otlp_receiver: OtlpReceiver) -> None:
    tenant = Tenant(traced.url, "traced-calls")
    tenant.deploy("echo", "python3.11", {"handler.py": ECHO})
    trace_id, caller_span, header = parent_header()
    answer = requests.get(tenant.fn_url("echo"), headers={"traceparent": header}, timeout=30)
    assert answer.status_code == 200, answer.text
    spans = of_trace(otlp_receiver, trace_id, {f"fn {tenant.ns}/echo", "upstream", "handler"})
    server, upstream = spans[f"fn {tenant.ns}/echo"], spans["upstream"]
    assert server["parent_span_id"] == caller_span and server["kind"] in ("SERVER", 2, "SPAN_KIND_SERVER")
    assert server["attributes"]["http.response.status_code"] == 200
    assert server["attributes"]["sless.function"] == "echo" and server["service_name"] == "sless-api"
    assert upstream["parent_span_id"] == server["span_id"]
    assert spans["handler"]["parent_span_id"] == upstream["span_id"]
    # the function got the upstream span's context: its own SDK would continue the same trace
    seen = answer.json()["traceparent"]
    assert seen == f"00-{trace_id}-{upstream['span_id']}-01", seen


def test_an_async_call_continues_the_trace_of_the_request_that_queued_it(
        traced: SlessProcess, otlp_receiver: OtlpReceiver) -> None:
    tenant = Tenant(traced.url, "traced-async")
    tenant.deploy("echo", "python3.11", {"handler.py": ECHO})
    trace_id, _, header = parent_header()
    queued = requests.post(tenant.fn_url("echo"), headers={"traceparent": header, "Prefer": "respond-async"},
                           timeout=30)
    assert queued.status_code == 202, queued.text
    spans = of_trace(otlp_receiver, trace_id, {f"fn {tenant.ns}/echo", f"async {tenant.ns}/echo"})
    run = spans[f"async {tenant.ns}/echo"]
    assert run["parent_span_id"] == spans[f"fn {tenant.ns}/echo"]["span_id"]
    assert run["attributes"]["sless.trigger"] == "async"
    call = tenant.api("GET", queued.json()["status_url"].removeprefix(f"/v1/namespaces/{tenant.ns}")).json()
    assert call["state"] == "succeeded" and json.loads(call["result"]["body"])["traceparent"].split("-")[1] == trace_id


def test_an_event_continues_its_messages_trace(traced: SlessProcess, otlp_receiver: OtlpReceiver,
                                               rabbitmq_broker: RabbitBroker) -> None:
    tenant = Tenant(traced.url, "traced-events")
    tenant.deploy("echo", "python3.11", {"handler.py": ECHO}, http=False)
    tenant.api("POST", "/triggers", json={"name": "on-orders", "type": "event", "function": "echo",
                                          "queue": "orders"}, expect=201)
    until("the consumer", lambda: queue_counts(rabbitmq_broker, f"{tenant.ns}.orders")[1] == 1, 60, 0.1)
    trace_id, publisher_span, header = parent_header()
    resp = requests.post(f"{traced.url}/v1/namespaces/{tenant.ns}/queues/orders/messages", data=b'{"n": 1}',
                         headers={"Authorization": f"Bearer {tenant.token}", "Content-Type": "application/json",
                                  "ce-specversion": "1.0", "ce-id": "e-1", "ce-source": "/shop",
                                  "ce-type": "order.created", "ce-traceparent": header}, timeout=30)
    assert resp.status_code == 202, resp.text
    spans = of_trace(otlp_receiver, trace_id, {f"event {tenant.ns}/echo"})
    delivered = spans[f"event {tenant.ns}/echo"]
    assert delivered["parent_span_id"] == publisher_span
    assert delivered["attributes"]["http.response.status_code"] == 200


def test_a_job_run_is_a_span_whose_context_the_runner_gets(traced: SlessProcess, otlp_receiver: OtlpReceiver) -> None:
    tenant = Tenant(traced.url, "traced-jobs")
    code = "import os\n\ndef handle(event):\n    return {'traceparent': os.environ.get('TRACEPARENT')}\n"
    tenant.deploy("worker", "python3.11", {"handler.py": code}, http=False)
    tenant.api("POST", "/jobs", json={"name": "once", "function": "worker", "event": {}}, expect=201)
    done = tenant.wait_job("once")
    assert done["phase"] == "Succeeded", done
    _, trace_id, span_id, _ = json.loads(done["message"])["traceparent"].split("-")
    spans = of_trace(otlp_receiver, trace_id, {f"job {tenant.ns}/worker", f"submit job {tenant.ns}/once"})
    run, submit = spans[f"job {tenant.ns}/worker"], spans[f"submit job {tenant.ns}/once"]
    assert run["span_id"] == span_id and run["attributes"]["sless.trigger"] == "job"
    # the run continues the trace of the request that created the job, a root without a caller's traceparent
    assert run["parent_span_id"] == submit["span_id"] and submit["parent_span_id"] == ""


def test_a_deploys_build_and_rollout_are_spans_under_it(traced: SlessProcess, otlp_receiver: OtlpReceiver) -> None:
    """An upload continuing its caller's trace: ``deploy`` (the request), and under it the build (dependencies,
    the load check) and the rollout (the new version started and serving) that its task ran after the answer; a
    build that fails is an ERROR span and has no rollout."""
    tenant = Tenant(traced.url, "traced-deploys")
    tenant.api("POST", "/ensure", expect=(200, 201))
    for name, handler in (("good", ECHO), ("broken", "import not_a_module\n")):
        tenant.api("POST", "/functions", json={"name": name, "runtime": "python3.11"}, expect=201)
        trace_id, caller_span, header = parent_header()
        tenant.api("POST", f"/functions/{name}/upload", expect=202, headers={"traceparent": header},
                   files={"code": ("code.zip", make_zip({"handler.py": handler}), "application/zip")})
        tenant.wait_phase(name, ("Ready", "Failed"))
        deploy_name = f"deploy {tenant.ns}/{name}"
        spans = of_trace(otlp_receiver, trace_id, {deploy_name, "build"} | ({"rollout"} if name == "good" else set()))
        deploy, build = spans[deploy_name], spans["build"]
        assert deploy["parent_span_id"] == caller_span and deploy["attributes"]["sless.function"] == name
        assert build["parent_span_id"] == deploy["span_id"] and build["start_ns"] >= deploy["start_ns"]
        if name == "good":
            rollout = spans["rollout"]
            assert rollout["parent_span_id"] == deploy["span_id"] and rollout["start_ns"] >= build["end_ns"]
            assert build["status_code"] != "ERROR" and rollout["status_code"] != "ERROR"
        else:
            assert build["status_code"] == "ERROR" and "rollout" not in spans, spans


def test_a_token_triggers_check_is_a_span_of_the_call(traced: SlessProcess, otlp_receiver: OtlpReceiver) -> None:
    """Behind a token trigger the token's check is ``authenticate`` under the call's server span, before the
    upstream exchange; a refused token ends the call there (the check's span failed, no upstream span)."""
    tenant = Tenant(traced.url, "traced-auth")
    tenant.deploy("guarded", "python3.11", {"handler.py": ECHO}, http=False)
    tenant.api("POST", "/triggers", json={"name": "web", "type": "http", "function": "guarded", "auth": "token"},
               expect=201)
    for token, status in ((tenant.token, 200), ("not-a-token", 401)):
        trace_id, _, header = parent_header()
        answer = requests.get(tenant.fn_url("guarded"), timeout=30,
                              headers={"traceparent": header, "Authorization": f"Bearer {token}"})
        assert answer.status_code == status, answer.text
        server_name = f"fn {tenant.ns}/guarded"
        spans = of_trace(otlp_receiver, trace_id, {server_name, "authenticate"} | ({"upstream"} if status == 200
                                                                                    else set()))
        check, server = spans["authenticate"], spans[server_name]
        assert check["parent_span_id"] == server["span_id"]
        if status == 200:
            assert check["status_code"] != "ERROR" and check["end_ns"] <= spans["upstream"]["start_ns"]
        else:
            assert check["status_code"] == "ERROR" and "upstream" not in spans, spans
