"""How the async call runner works: its workers, retries, result size and retention, and where callbacks may go."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from sless_api.services.asynccalls.callback import CallbackPolicy
from sless_core.envconfig import ConfigError, EnvReader


@dataclass(frozen=True)
class AsyncSettings:
    workers: int = 8  # calls in flight per process
    max_retries: int = 3
    backoff_sec: float = 1.0
    backoff_max_sec: float = 60.0
    result_max_bytes: int = 256 * 1024
    retention_sec: float = 7 * 86400.0
    lease_sec: float = 960.0  # longer than any call (900 s maximum timeout + margin)
    poll_sec: float = 1.0  # how often an idle runner looks for due calls another process queued
    callback_policy: CallbackPolicy = field(default_factory=CallbackPolicy)  # where callbacks may go, how tried

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AsyncSettings:
        reader = EnvReader(env)
        settings = cls(
            workers=reader.integer("SLESS_ASYNC_WORKERS", cls.workers, 1, 1000),
            max_retries=reader.integer("SLESS_ASYNC_MAX_RETRIES", cls.max_retries, 0, 100),
            backoff_sec=reader.number("SLESS_ASYNC_RETRY_BACKOFF_SEC", cls.backoff_sec, low=0.001),
            backoff_max_sec=reader.number("SLESS_ASYNC_RETRY_BACKOFF_MAX_SEC", cls.backoff_max_sec, low=0.001),
            result_max_bytes=reader.integer("SLESS_ASYNC_RESULT_MAX_BYTES", cls.result_max_bytes, low=0),
            retention_sec=reader.number("SLESS_ASYNC_RETENTION_SEC", cls.retention_sec, low=1),
            callback_policy=CallbackPolicy(
                allowed_nets=CallbackPolicy.parse_nets(reader.text("SLESS_CALLBACK_ALLOWED_NETS", "")),
                timeout_sec=reader.number("SLESS_CALLBACK_TIMEOUT_SEC", CallbackPolicy.timeout_sec, 0.001, 300),
                attempts=reader.integer("SLESS_CALLBACK_ATTEMPTS", CallbackPolicy.attempts, 1, 10)),
        )
        if settings.backoff_max_sec < settings.backoff_sec:
            raise ConfigError(f"SLESS_ASYNC_RETRY_BACKOFF_MAX_SEC must be at least SLESS_ASYNC_RETRY_BACKOFF_SEC "
                              f"({settings.backoff_sec:g}), got {settings.backoff_max_sec:g}")
        return settings

    def backoff(self, attempts: int) -> float:
        """Delay before the next attempt: doubling from backoff_sec, capped, ±20 % so retries spread."""
        delay = min(self.backoff_max_sec, self.backoff_sec * 2 ** max(0, attempts - 1))
        return float(delay * random.uniform(0.8, 1.2))
