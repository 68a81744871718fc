"""What the dispatcher needs to know about a trigger and what it learns from a call.

These are the only two shapes a backend provides: "the enabled event triggers" as a list of
:class:`EventTarget` and "invoke this function with this event" returning a :class:`CallResult`.
Keeping them plain lets the same dispatcher run in `sless up` or as a process of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

DLQ_SUFFIX = ".dlq"
#: The header the dispatcher gives every dead letter: its own id, by which a tenant inspects, redrives or purges it.
DEAD_ID_HEADER = "x-sless-dead-id"


def broker_queue(namespace: str, queue: str) -> str:
    """The queue a trigger consumes on the shared broker: the tenant's namespace, a dot, the queue.

    Broker queue names are global to a virtual host, so a bare ``orders`` would let one tenant read
    another tenant's messages; the prefix keeps each tenant in its own names, and lets an operator
    grant a tenant's broker user exactly ``^<namespace>\\.`` (configure/write/read permissions).
    """
    return f"{namespace}.{queue}"


def dead_letter_queue(queue: str) -> str:
    return queue + DLQ_SUFFIX


@dataclass(frozen=True)
class EventTarget:
    """One enabled event trigger whose function can be called now."""

    namespace: str
    trigger: str
    function: str
    queue: str  # as the user wrote it
    timeout_sec: float  # the function's timeout: bounds one call, and how long a call's claim is held
    #: a call a crash interrupted: dead-lettered (at most once) or called again (at least once)
    at_least_once: bool = False
    #: the function's limit of calls in flight (0: none); the trigger takes at most this many messages at once
    concurrency: int = 0

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.trigger)

    @property
    def broker_queue(self) -> str:
        return broker_queue(self.namespace, self.queue)

    @property
    def dlq(self) -> str:
        return dead_letter_queue(self.broker_queue)

    def same_consumer(self, other: EventTarget) -> bool:
        """Whether a running consumer can keep going for ``other`` (only the timeout may differ)."""
        return (self.namespace, self.trigger, self.function, self.queue, self.at_least_once,
                self.concurrency) == (other.namespace, other.trigger, other.function, other.queue,
                                      other.at_least_once, other.concurrency)

    def prefetch(self, default: int) -> int:
        """Messages to take at once: the platform's setting, never more than the function can run at once (more
        would only wait in the dispatcher's hands, holding the broker's redelivery back)."""
        return min(default, self.concurrency) if self.concurrency > 0 else default


@dataclass(frozen=True)
class CallResult:
    """One call's answer. ``platform_error`` marks answers the platform gave instead of the function
    (not deployed, failed to start, unreachable): never the function's verdict on the event."""

    status: int
    error: str | None = None
    platform_error: bool = False


class Verdict(StrEnum):
    OK = "ok"
    RETRY = "retry"
    REJECT = "reject"


def judge(result: CallResult) -> Verdict:
    """Success is any status below 400. Errors, 5xx, timeouts (504), 408, 429 and platform trouble are
    retried; any other 4xx is the function refusing the event, which a retry would not change."""
    if result.status < 400:
        return Verdict.OK
    if result.platform_error or result.status >= 500 or result.status in (408, 429):
        return Verdict.RETRY
    return Verdict.REJECT


ListTargets = Callable[[], Awaitable[list[EventTarget]]]
#: Call the target with the event; the third argument is which attempt this is (from 1, across redeliveries).
Invoke = Callable[[EventTarget, bytes, int], Awaitable[CallResult]]
#: (target, status message, whether messages were handled since the last report)
Report = Callable[[EventTarget, str, bool], Awaitable[None]]
