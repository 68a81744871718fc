"""OpenTelemetry plumbing the API and the operator share: configure from the environment, spans, W3C carriers.

Off by default, and then free: callers check ``enabled()`` (one global read) before they touch a carrier or a
span, and the SDK is imported only once traces are wanted. On when ``OTEL_TRACES_EXPORTER=otlp`` or an
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (and ``OTEL_SDK_DISABLED`` is not
``true``); the SDK then reads the other standard variables itself (the exporter's endpoint, headers and timeout,
``OTEL_TRACES_SAMPLER``/``_ARG``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*``).

A carrier is a ``{"traceparent": ..., "tracestate": ...}`` mapping (W3C trace context): what an HTTP header, a
custom resource's annotation or a pod's ``TRACEPARENT`` variable holds. Work the operator only sees after the
fact (a build Job, a rollout) is recorded with explicit start and end times (``recorded``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("sless.tracing")
TRACEPARENT = "traceparent"
TRACE_KEYS = (TRACEPARENT, "tracestate")
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


def tracer() -> Any:
    from opentelemetry import trace

    return trace.get_tracer("sless")


def now_ns() -> int:
    return time.time_ns()


def _attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword names as attribute names (``sless_function`` -> ``sless.function``), None left out."""
    return {k.replace("_", "."): v for k, v in attributes.items() if v is not None}


def _kind(kind: str) -> Any:
    from opentelemetry.trace import SpanKind

    return getattr(SpanKind, kind.upper())


def extract(carrier: Mapping[str, str]) -> Any:
    """The context CARRIER's ``traceparent`` names (None without one: the current context stays the parent)."""
    from opentelemetry import propagate

    found = {k.lower(): v for k, v in carrier.items() if k.lower() in TRACE_KEYS and v}
    return propagate.extract(found) if TRACEPARENT in found else None


def inject() -> dict[str, str]:
    """The current span's context as a carrier (empty outside a span)."""
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def current_traceparent() -> str:
    """The current span's ``traceparent`` ("" when tracing is off or no span is current)."""
    return inject().get(TRACEPARENT, "") if enabled() else ""


@contextmanager
def span(name: str, kind: str, carrier: Mapping[str, str] | None = None, **attributes: Any) -> Iterator[Any]:
    """A span named NAME of KIND (server, client, consumer, internal) around the body: the child of CARRIER's
    context when it carries one, else of the current span."""
    parent = extract(carrier) if carrier else None
    with tracer().start_as_current_span(name, context=parent, kind=_kind(kind),
                                        attributes=_attributes(attributes)) as current:
        yield current


@contextmanager
def span_if_enabled(name: str, kind: str, carrier: Mapping[str, str] | None = None,
                    **attributes: Any) -> Iterator[Any]:  # fmt: skip
    """``span`` while tracing is on; else nothing at all (the body runs, None is yielded)."""
    if not enabled():
        yield None
        return
    with span(name, kind, carrier, **attributes) as current:
        yield current


def set_error(current: Any, message: str) -> None:
    """Mark CURRENT failed, saying why."""
    from opentelemetry.trace import Status, StatusCode

    current.set_status(Status(StatusCode.ERROR, message))


def recorded(name: str, start_ns: int, end_ns: int, parent: Mapping[str, str] | None = None, kind: str = "internal",
             error: str | None = None, **attributes: Any) -> dict[str, str]:  # fmt: skip
    """A span of work seen after the fact, from START_NS to END_NS (an end before the start is taken as the
    start): the child of PARENT's context (a carrier), else of the current span; ERROR says it failed and why.
    Its own context as a carrier, the parent of its children."""
    from opentelemetry import trace

    context = extract(parent) if parent else None
    done = tracer().start_span(name, context=context, kind=_kind(kind), attributes=_attributes(attributes),
                               start_time=start_ns)  # fmt: skip
    if error is not None:
        set_error(done, error)
    with trace.use_span(done, end_on_exit=False):
        carrier = inject()
    done.end(end_time=max(start_ns, end_ns))
    return carrier
