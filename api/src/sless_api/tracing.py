"""Traces of the calls through the platform: W3C trace context in, OpenTelemetry spans out over OTLP.

The generic part (when traces are wanted, the SDK's set-up, spans, carriers) is ``sless_core.tracing``, shared
with the operator; this module speaks HTTP headers and the API's spans on top of it. Off by default, and then
free: every entry point checks ``enabled()`` (one global read) before it touches a header or a span.

What is traced: a call through ``/fn`` (a server span continuing the caller's ``traceparent``, its upstream
exchange as a client span, and the runtime's phases — waiting in the platform, a cold start, the handler — as child
spans), and the calls the platform makes (async calls, event deliveries), each continuing the context it was given:
an async call the context of the request that queued it, an event the ``traceparent`` of its message (the
CloudEvents distributed-tracing extension). The function gets the context of the platform's upstream span in its
``traceparent`` header (the event's ``_headers``), so its own OpenTelemetry SDK continues the trace. A deploy
(``deploy <namespace>/<function>``) and a job's creation are server spans too; on Kubernetes their context goes
on the custom resource (``sless.dev/traceparent``), where the operator continues it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sless_core.tracing import (
    TRACE_KEYS,
    configure,
    current_traceparent,
    enabled,
    now_ns,
    recorded,
    set_error,
    shutdown,
    span_if_enabled,
    wanted,
)
from sless_core.tracing import inject as _inject
from sless_core.tracing import span as _span

__all__ = ["TRACE_HEADERS", "configure", "current_traceparent", "enabled", "failed", "now_ns", "phases",
           "record_status", "request_span", "shutdown", "span", "step", "wanted", "with_context"]  # fmt: skip

TRACE_HEADERS = TRACE_KEYS


def _carrier(headers: Sequence[tuple[str, str]]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers if k.lower() in TRACE_HEADERS}


@contextmanager
def span(name: str, kind: str, headers: Sequence[tuple[str, str]] = (), **attributes: Any) -> Iterator[Any]:
    """A span named NAME of KIND (server, client, consumer, internal): the child of the trace context in HEADERS
    when they carry one, else of the current span."""
    with _span(name, kind, _carrier(headers), **attributes) as current:
        yield current


@contextmanager
def request_span(name: str, headers: Sequence[tuple[str, str]], **attributes: Any) -> Iterator[Any]:
    """A REST request as a server span continuing the caller's ``traceparent`` while tracing is on (else nothing,
    None yielded); an error that escapes it marks it failed with its HTTP status when it has one."""
    with span_if_enabled(name, "server", _carrier(headers), **attributes) as current:
        try:
            yield current
        except Exception as exc:
            status = getattr(exc, "status", None)
            if current is not None and isinstance(status, int):
                current.set_attribute("http.response.status_code", status)
            raise


@contextmanager
def step(name: str, **attributes: Any) -> Iterator[Any]:
    """An internal span NAME under the current one while tracing is on (a deploy's build and rollout on
    ``sless up``, in the build's task, which holds the deploy's context); else nothing, None yielded."""
    with span_if_enabled(name, "internal", None, **attributes) as current:
        yield current


def failed(current: Any, reason: str) -> None:
    """Mark a span from ``step`` failed with REASON (nothing when tracing is off)."""
    if current is not None:
        set_error(current, reason)


def with_context(headers: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """HEADERS with the current span's trace context in place of any they had (what the next hop continues)."""
    return [*((k, v) for k, v in headers if k.lower() not in TRACE_HEADERS), *_inject().items()]


def record_status(current: Any, status: int) -> None:
    """The HTTP status of the call on its span; a 5xx marks it failed."""
    current.set_attribute("http.response.status_code", status)
    if status >= 500:
        set_error(current, f"HTTP {status}")


def phases(began_ns: int, queue_ms: float | None, start_ms: float | None, handler_ms: float | None,
           cold: bool) -> None:
    """The runtime's phases of one call as child spans of the current one, laid end to end from BEGAN_NS:
    waiting in the platform, a process or pod starting (a cold start), the handler itself."""
    at = began_ns
    for name, ms in (("queue", queue_ms), ("cold start" if cold else "start", start_ms), ("handler", handler_ms)):
        if ms is None or ms <= 0:
            continue
        end = at + int(ms * 1_000_000)
        recorded(name, at, end)
        at = end
