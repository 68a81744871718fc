"""What every handler shares: configuration, the API client, locks, caches and Kopf's indices.

Kopf hands each object a shallow copy of the memo, so everything mutable lives in ``State``,
one instance referenced by every copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sless_operator.codeurl import Signer
from sless_operator.config import OperatorConfig
from sless_operator.kube import Kube
from sless_operator.metrics import MetricsServer, reconciled, watch_queue
from sless_operator.observe import DeploymentSummary, JobSummary, TriggerSummary
from sless_operator.workqueue import WorkQueue

log = logging.getLogger(__name__)


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
    # (namespace, Deployment) -> the generation its template was last written at (observe.DeploymentSummary)
    template_generations: dict[tuple[str, str], int] = field(default_factory=dict)
    # the last summary of each child an event was handled for (events repeat a lot)
    seen: dict[tuple[str, str, str], tuple[Any, ...]] = field(default_factory=dict)
    # the status this process last wrote per Function: (uid, status)
    statuses: dict[tuple[str, str], tuple[str, dict[str, Any]]] = field(default_factory=dict)
    # Kopf's live indices, taken at start-up
    indices: dict[str, Mapping[Any, Any]] = field(default_factory=dict)
    # (namespace, function) -> (code archive key, why): a function pod could not fetch that archive
    fetch_failures: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    # (namespace, compile Job) -> what its upload-binary step reported (its termination message), seen on the
    # pod before the Job controller marks the Job complete
    compiled: dict[tuple[str, str], str] = field(default_factory=dict)
    # does the cluster serve KEDA's ScaledObjects: (answer, time.monotonic() of the discovery), None: not asked yet
    keda: tuple[bool, float] | None = None


def work_kind(key: Hashable) -> str:
    """The metrics' kind of a work queue key: ("function", ns, name) is a function's, ("Job", ns, name) a
    FunctionJob's or cron run's Job."""
    head = key[0] if isinstance(key, tuple) and key else key
    return str(head).lower()


class Context:
    """The Kopf memo: shared by reference, so a shallow copy is the same context."""

    def __init__(self, config: OperatorConfig, kube: Kube | None = None, watch_streams: int | None = 8) -> None:
        self.config = config
        self.kube = kube or Kube(concurrency=config.api_concurrency)
        self.state = State()
        self.signer = Signer(config)
        # Kopf's pool: its long-lived watch streams plus as many requests as our own client; 0 (no bound)
        # when the streams are not known in advance (namespace patterns): a bound would starve new watches
        self.kopf_connections = 0 if watch_streams is None else watch_streams + config.api_concurrency
        # reconciles woken by children's events; Kopf's change handlers share the same bound
        self.queue = WorkQueue(config.api_concurrency, runner=lambda key, work: reconciled(work_kind(key), work))
        watch_queue(self.queue)
        self.slots = asyncio.Semaphore(config.api_concurrency)
        self.metrics = MetricsServer(config.metrics_token, config.metrics_host, config.metrics_port)

    # -- indices ----------------------------------------------------------------------------------

    def function(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Function's slim body from the watch (``observe.slim_function``), if indexed."""
        value: dict[str, Any] | None = _first(self.state.indices.get("sless_functions", {}).get((namespace, name)))
        return value

    def job(self, namespace: str, name: str) -> JobSummary | None:
        value: JobSummary | None = _first(self.state.indices.get("sless_jobs", {}).get((namespace, name)))
        return value

    def deployment(self, namespace: str, name: str) -> DeploymentSummary | None:
        index = self.state.indices.get("sless_deployments", {})
        value: DeploymentSummary | None = _first(index.get((namespace, name)))
        return value

    def functions_in(self, namespace: str) -> list[dict[str, Any]]:
        """Every indexed Function of NAMESPACE (slim bodies)."""
        index = self.state.indices.get("sless_functions", {})
        return [body for key in list(index) if key[0] == namespace if (body := _first(index.get(key)))]

    def triggers_of(self, namespace: str, function: str) -> list[TriggerSummary]:
        return list(self.state.indices.get("sless_triggers", {}).get((namespace, function)) or ())

    async def close(self) -> None:
        await self.queue.stop()
        await self.kube.close()
