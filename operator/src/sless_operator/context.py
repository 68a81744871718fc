"""What every handler shares: configuration, the API client, locks, caches and Kopf's indices.

Kopf hands each object a shallow copy of the memo, so everything mutable lives in ``State``,
one instance referenced by every copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sless_operator.config import OperatorConfig
from sless_operator.kube import ApiError, Kube
from sless_operator.observe import DeploymentSummary, JobSummary, TriggerSummary

log = logging.getLogger(__name__)
T = TypeVar("T")

# Retries of a reconcile started by a child's event (Kopf does not retry event handlers).
EVENT_RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class KeyedLocks:
    """One asyncio lock per key (e.g. a Function), dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)


def _first(store: Any) -> Any:
    for value in store or ():
        return value
    return None


@dataclass
class State:
    """Mutable, process-wide state."""

    locks: KeyedLocks = field(default_factory=KeyedLocks)
    tenants_ready: set[str] = field(default_factory=set)
    build_namespace_ready: bool = False
    # what was last applied per child, to skip writes that would change nothing
    applied: dict[tuple[str, str, str], str] = field(default_factory=dict)
    # the last summary of each child an event was handled for (events repeat a lot)
    seen: dict[tuple[str, str, str], Hashable] = field(default_factory=dict)
    retries: dict[Hashable, asyncio.Task[None]] = field(default_factory=dict)
    # Functions reconciled at least once by this process (their status may have changed since)
    reconciled: set[tuple[str, str]] = field(default_factory=set)
    # Kopf's live indices, taken at start-up
    indices: dict[str, Mapping[Any, Any]] = field(default_factory=dict)


class Context:
    """The Kopf memo: shared by reference, so a shallow copy is the same context."""

    def __init__(self, config: OperatorConfig, kube: Kube | None = None, watch_streams: int = 8) -> None:
        self.config = config
        self.kube = kube or Kube(concurrency=config.api_concurrency)
        self.state = State()
        # Kopf's pool: its long-lived watch streams plus as many requests as our own client
        self.kopf_connections = watch_streams + config.api_concurrency

    # -- indices ----------------------------------------------------------------------------------

    def job(self, namespace: str, name: str) -> JobSummary | None:
        value: JobSummary | None = _first(self.state.indices.get("sless_jobs", {}).get((namespace, name)))
        return value

    def deployment(self, namespace: str, name: str) -> DeploymentSummary | None:
        index = self.state.indices.get("sless_deployments", {})
        value: DeploymentSummary | None = _first(index.get((namespace, name)))
        return value

    def triggers_of(self, namespace: str, function: str) -> list[TriggerSummary]:
        return list(self.state.indices.get("sless_triggers", {}).get((namespace, function)) or ())

    # -- retries of event-driven work ------------------------------------------------------------------

    def retry_later(self, key: Hashable, work: Callable[[], Awaitable[None]]) -> None:
        """Run WORK again with backoff until it succeeds (once per KEY at a time)."""
        if key in self.state.retries:
            return

        async def loop() -> None:
            try:
                for delay in EVENT_RETRY_DELAYS:
                    await asyncio.sleep(delay)
                    try:
                        await work()
                        return
                    except ApiError as exc:
                        log.warning("retrying %s after %s", key, exc)
                    except Exception:
                        log.exception("%s failed; not retrying", key)
                        return
                log.error("giving up on %s after %d retries", key, len(EVENT_RETRY_DELAYS))
            finally:
                self.state.retries.pop(key, None)

        self.state.retries[key] = asyncio.create_task(loop())

    async def close(self) -> None:
        for task in list(self.state.retries.values()):
            task.cancel()
        await self.kube.close()
