"""One event's call to its function, the same on both backends: the route as the backend's router gives it to
any trigger (``event_route``: a deployed function, its limits, its current version), then ``POST /`` through the
invoker (the path HTTP and cron calls take), recorded with trigger type ``event``."""

from __future__ import annotations

import json
from typing import Any

from sless_api import tracing
from sless_api.domain.errors import PlatformError
from sless_api.domain.ports import CallInvoker, Router
from sless_api.services.events.model import CallResult, EventTarget


async def call_function(router: Router, invoker: CallInvoker, target: EventTarget, body: bytes,
                        attempt: int) -> CallResult:
    """Deliver BODY to TARGET's function, recorded as delivery ATTEMPT. A function that is gone or not ready is the
    platform's refusal, as is a 4xx that carries ``error`` (the platform answered, not the function): the
    dispatcher tells them apart."""
    try:
        route = await router.event_route(target.namespace, target.function)
    except PlatformError as exc:
        return CallResult(exc.status, exc.message, platform_error=True)
    headers = [("Content-Type", "application/json"), ("X-Sless-Trigger", target.trigger)]
    if tracing.enabled():
        headers.extend(trace_context(body))
    result = await invoker.call(route, "POST", "/", headers, body, trigger="event", attempt=attempt)
    platform_error = 400 <= result.status < 500 and result.error is not None
    return CallResult(result.status, result.error, platform_error=platform_error)


def trace_context(body: bytes) -> list[tuple[str, str]]:
    """The trace context an event carries, as headers: the CloudEvents distributed-tracing extension
    (``traceparent``/``tracestate`` attributes: a structured event's keys, a binary one's ``ce-`` headers), else the
    AMQP message's own ``traceparent`` header. Read only while tracing is on."""
    try:
        event: Any = json.loads(body)
    except ValueError:
        return []
    if not isinstance(event, dict):
        return []
    amqp: dict[str, Any] = event["_amqp"] if isinstance(event.get("_amqp"), dict) else {}
    message_headers: dict[str, Any] = amqp["headers"] if isinstance(amqp.get("headers"), dict) else {}
    found = []
    for name in tracing.TRACE_HEADERS:
        value = event.get(name) or message_headers.get(name)
        if isinstance(value, str) and value:
            found.append((name, value))
    return found
