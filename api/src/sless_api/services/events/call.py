"""One event's call to its function, the same on both backends: ``POST /`` through the invoker (the path HTTP
and cron calls take), recorded with trigger type ``event``; only how the route is found differs per backend."""

from __future__ import annotations

from sless_api.domain.ports import CallInvoker
from sless_api.domain.routing import Route
from sless_api.services.events.model import CallResult, EventTarget


async def call_function(invoker: CallInvoker, route: Route, target: EventTarget, body: bytes) -> CallResult:
    """Deliver BODY to TARGET's function at ROUTE. A 4xx carries ``error`` only when the platform answered (not
    deployed, ...), not the function: that is what the dispatcher treats as the platform's refusal."""
    result = await invoker.call(
        route, "POST", "/", [("Content-Type", "application/json"), ("X-Sless-Trigger", target.trigger)],
        body, trigger="event")
    platform_error = 400 <= result.status < 500 and result.error is not None
    return CallResult(result.status, result.error, platform_error=platform_error)
