"""The event dispatcher's own typed configuration, read with the API's config (``ApiConfig.events``).

The dispatcher sees this object only, not the API's config: it runs inside `sless up` and as the
``sless-events`` process, and the event modules never import a backend or the API's wiring.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sless_core.envconfig import EnvReader


@dataclass(frozen=True)
class EventsConfig:
    """Every knob of the dispatcher; the README's configuration table lists the variables."""

    url: str
    #: Unacknowledged messages per trigger (= calls in flight per trigger). 1 keeps queue order.
    prefetch: int = 32
    #: Retries after the first failed call; the message is dead-lettered after the last one.
    max_retries: int = 3
    #: First retry delay; doubles per retry (with +-20 % jitter) up to ``retry_backoff_max_sec``.
    retry_backoff_sec: float = 1.0
    retry_backoff_max_sec: float = 30.0
    #: How long a message id is remembered to suppress a second run (see the events README).
    dedup_window_sec: float = 86400.0
    #: Reconnect delays after the broker went away: doubling from 0.5 s up to this cap.
    reconnect_max_sec: float = 10.0
    #: How often the trigger list is re-read even without a change notification.
    resync_sec: float = 30.0
    #: The longest function timeout the platform allows, plus the invoke proxy's margin:
    #: sizes the consumer timeout asked of the broker.
    max_call_sec: float = 905.0
    #: On shutdown, how long calls in flight may finish before their messages are left to redelivery.
    drain_sec: float = 30.0

    @classmethod
    def from_env(cls, url: str, env: Mapping[str, str], max_call_sec: float = 905.0) -> EventsConfig:
        reader = EnvReader(env)
        return cls(
            url=url,
            prefetch=reader.integer("SLESS_EVENT_PREFETCH", 32, 1, 1000),
            max_retries=reader.integer("SLESS_EVENT_MAX_RETRIES", 3, 0, 100),
            retry_backoff_sec=reader.number("SLESS_EVENT_RETRY_BACKOFF_SEC", 1.0, 0, 3600),
            retry_backoff_max_sec=reader.number("SLESS_EVENT_RETRY_BACKOFF_MAX_SEC", 30.0, 0, 3600),
            dedup_window_sec=reader.number("SLESS_EVENT_DEDUP_WINDOW_SEC", 86400.0, 60, 90 * 86400),
            reconnect_max_sec=reader.number("SLESS_EVENT_RECONNECT_MAX_SEC", 10.0, 0.5, 600),
            drain_sec=reader.number("SLESS_EVENT_DRAIN_SEC", 30.0, 0, 3600),
            max_call_sec=max_call_sec,
        )

    def backoff(self, retry: int) -> float:
        """Delay before retry number ``retry`` (1-based), without jitter."""
        return float(min(self.retry_backoff_max_sec, self.retry_backoff_sec * 2 ** (retry - 1)))

    def longest_hold_sec(self) -> float:
        """The longest one message can stay unacknowledged: every attempt at the longest timeout, plus the delays."""
        attempts = self.max_retries + 1
        delays = sum(self.backoff(r) * 1.2 for r in range(1, attempts))
        return attempts * self.max_call_sec + delays + 60.0

    def consumer_timeout_ms(self) -> int:
        """What the dispatcher asks the broker for (``x-consumer-timeout``; brokers that ignore it need the
        ``consumer_timeout`` setting instead, see the events README)."""
        return int(self.longest_hold_sec() * 1000)
