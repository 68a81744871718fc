"""Traces of the calls through the platform: W3C trace context in, OpenTelemetry spans out over OTLP.

Off by default, and then free: every entry point checks ``enabled()`` (one global read) before it touches a header
or a span. On when ``OTEL_TRACES_EXPORTER=otlp`` or an ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (and ``OTEL_SDK_DISABLED`` is not ``true``); the OpenTelemetry SDK
then reads the other standard variables itself: the endpoint, headers and timeout of the exporter,
``OTEL_TRACES_SAMPLER``/``_ARG`` (parent-based, always on, by default), ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES`` and the batch processor's ``OTEL_BSP_*``.

What is traced: a call through ``/fn`` (a server span continuing the caller's ``traceparent``, its upstream
exchange as a client span, and the runtime's phases — waiting in the platform, a cold start, the handler — as child
spans), and the calls the platform makes (async calls, event deliveries), each continuing the context it was given:
an async call the context of the request that queued it, an event the ``traceparent`` of its message (the
CloudEvents distributed-tracing extension). The function gets the context of the platform's upstream span in its
``traceparent`` header (the event's ``_headers``), so its own OpenTelemetry SDK continues the trace.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("sless.tracing")
TRACE_HEADERS = ("traceparent", "tracestate")
_state: dict[str, Any] = {"provider": None}


def enabled() -> bool:
    return _state["provider"] is not None


def wanted(env: Mapping[str, str]) -> bool:
    """Whether ENV asks for traces (the platform's default is none, unlike the SDK's)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter == "otlp"
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def configure(service_name: str, env: Mapping[str, str]) -> bool:
    """Install the SDK's tracer provider when ENV (the process's environment, which the SDK's exporter and
    sampler read themselves) asks for traces; whether it did."""
    if enabled() or not wanted(env):
        return enabled()
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _state["provider"] = provider
    log.info("traces go to %s", env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
             or "the OTLP default endpoint")
    return True


def shutdown() -> None:
    """Send what is buffered and stop (at the process's end)."""
    provider = _state["provider"]
    if provider is not None:
        provider.shutdown()
        _state["provider"] = None


def _tracer() -> Any:
    from opentelemetry import trace

    return trace.get_tracer("sless")


def _carrier(headers: Sequence[tuple[str, str]]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers if k.lower() in TRACE_HEADERS}


@contextmanager
def span(name: str, kind: str, headers: Sequence[tuple[str, str]] = (), **attributes: Any) -> Iterator[Any]:
    """A span named NAME of KIND (server, client, consumer, internal): the child of the trace context in HEADERS
    when they carry one, else of the current span."""
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    carrier = _carrier(headers)
    parent = propagate.extract(carrier) if carrier else None
    with _tracer().start_as_current_span(name, context=parent, kind=getattr(SpanKind, kind.upper()),
                                         attributes={k.replace("_", "."): v for k, v in attributes.items()
                                                     if v is not None}) as current:
        yield current


def with_context(headers: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """HEADERS with the current span's trace context in place of any they had (what the next hop continues)."""
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [*((k, v) for k, v in headers if k.lower() not in TRACE_HEADERS), *carrier.items()]


def record_status(current: Any, status: int) -> None:
    """The HTTP status of the call on its span; a 5xx marks it failed."""
    from opentelemetry.trace import Status, StatusCode

    current.set_attribute("http.response.status_code", status)
    if status >= 500:
        current.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))


def phases(began_ns: int, queue_ms: float | None, start_ms: float | None, handler_ms: float | None,
           cold: bool) -> None:
    """The runtime's phases of one call as child spans of the current one, laid end to end from BEGAN_NS:
    waiting in the platform, a process or pod starting (a cold start), the handler itself."""
    at = began_ns
    for name, ms in (("queue", queue_ms), ("cold start" if cold else "start", start_ms), ("handler", handler_ms)):
        if ms is None or ms <= 0:
            continue
        end = at + int(ms * 1_000_000)
        _tracer().start_span(name, start_time=at).end(end_time=end)
        at = end


def now_ns() -> int:
    return time.time_ns()
