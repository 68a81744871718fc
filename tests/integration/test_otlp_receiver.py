"""The ``otlp_receiver`` fixture is a real OTLP receiver: spans exported to it over HTTP, by the OpenTelemetry
Python SDK's OTLP exporter (protobuf) and as OTLP JSON, are read back with their ids, parents, links, kinds,
statuses, attributes and service names."""

from __future__ import annotations

import json
import secrets
import time
import urllib.request

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.support.otlp import BUILD_TIMEOUT, OtlpReceiver, Span

# The first test to take the fixture builds the collector when scripts/test.sh has not (minutes cold).
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + 120)


def _of(service: str, spans: list[Span]) -> dict[str, Span]:
    return {s["name"]: s for s in spans if s["service_name"] == service}


def test_sdk_spans_read_back_with_parent_and_attributes(otlp_receiver: OtlpReceiver) -> None:
    service = f"otlp-test-{secrets.token_hex(4)}"
    provider = TracerProvider(resource=Resource.create({"service.name": service, "deployment.environment": "test"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=otlp_receiver.traces_endpoint)))
    tracer = provider.get_tracer("sless.tests.otlp")
    try:
        with (
            tracer.start_as_current_span("parent", kind=trace.SpanKind.SERVER,
                                         attributes={"http.request.method": "POST", "sless.attempt": 2}) as parent,
            tracer.start_as_current_span("child", kind=trace.SpanKind.CLIENT) as child,
        ):  # fmt: skip
            child.set_attribute("sless.ratio", 0.5)
            child.set_attribute("sless.cold", True)
            child.set_attribute("sless.tags", ["a", "b"])
            child.add_event("retry")
            child.set_status(trace.Status(trace.StatusCode.ERROR, "upstream refused"))
    finally:
        provider.shutdown()  # SimpleSpanProcessor exported each span as it ended; this closes the exporter

    spans = _of(service, otlp_receiver.wait_for(lambda got: len(_of(service, got)) == 2, timeout=30,
                                                what=f"the two spans of {service}"))  # fmt: skip
    p, c = spans["parent"], spans["child"]
    parent_ctx, child_ctx = parent.get_span_context(), child.get_span_context()
    assert p["trace_id"] == c["trace_id"] == f"{parent_ctx.trace_id:032x}"
    assert p["span_id"] == f"{parent_ctx.span_id:016x}" and c["span_id"] == f"{child_ctx.span_id:016x}"
    assert p["parent_span_id"] == "" and c["parent_span_id"] == p["span_id"]
    assert (p["kind"], c["kind"]) == ("SERVER", "CLIENT")
    assert p["attributes"] == {"http.request.method": "POST", "sless.attempt": 2}
    assert c["attributes"] == {"sless.ratio": 0.5, "sless.cold": True, "sless.tags": ["a", "b"]}
    assert c["events"] == ["retry"]
    assert (p["status_code"], c["status_code"], c["status_message"]) == ("UNSET", "ERROR", "upstream refused")
    assert p["resource"]["deployment.environment"] == "test" and p["scope"] == "sless.tests.otlp"
    assert p["start_ns"] <= c["start_ns"] <= c["end_ns"] <= p["end_ns"]
    assert p["links"] == c["links"] == []


def test_otlp_json_span_with_a_link(otlp_receiver: OtlpReceiver) -> None:
    """OTLP/HTTP with a JSON body, as a producer that links its consumer's span to the message's trace."""
    service = f"otlp-json-{secrets.token_hex(4)}"
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    linked = (secrets.token_hex(16), secrets.token_hex(8))
    now = time.time_ns()
    body = {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
        "scopeSpans": [{"scope": {"name": "raw"}, "spans": [{
            "traceId": trace_id, "spanId": span_id, "name": "consume", "kind": 5,
            "startTimeUnixNano": str(now), "endTimeUnixNano": str(now + 1000),
            "attributes": [{"key": "messaging.system", "value": {"stringValue": "rabbitmq"}},
                           {"key": "messaging.batch.message_count", "value": {"intValue": "3"}}],
            "links": [{"traceId": linked[0], "spanId": linked[1]}],
            "status": {"code": 1},
        }]}],
    }]}  # fmt: skip
    request = urllib.request.Request(otlp_receiver.traces_endpoint, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200

    (span,) = _of(service, otlp_receiver.wait_for(lambda got: bool(_of(service, got)), timeout=30)).values()
    assert (span["trace_id"], span["span_id"], span["parent_span_id"]) == (trace_id, span_id, "")
    assert (span["kind"], span["status_code"]) == ("CONSUMER", "OK")
    assert span["links"] == [linked]
    assert span["attributes"] == {"messaging.system": "rabbitmq", "messaging.batch.message_count": 3}
    assert span["end_ns"] - span["start_ns"] == 1000
