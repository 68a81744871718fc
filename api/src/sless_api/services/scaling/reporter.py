"""The load reporter of an API or event process: its calls per function, sent to ``sless-scaler``.

Usage (one per process, on its event loop)::

    reporter = LoadReporter("sless-scaler:9090", token, default_reporter_id())
    await reporter.start()
    async with reporter.waiting(namespace, function):   # no replica yet: the scaler hears at once
        await replica_ready()
    async with reporter.inflight(namespace, function):  # a replica serves it
        await proxy_the_call()
    await reporter.aclose()

Waiting and in flight are two stages of one call (the scaler adds them up): a call counts in one at a time.
Every ``interval`` seconds the whole snapshot is sent while any count is non-zero (a function that went back to 0
is sent once at 0, then left out; nothing is sent while all are 0). A function's first waiting call (0 -> 1)
sends a report at once: KEDA is told by the scaler's stream without waiting for a tick. Counting never blocks
and never fails: the sending happens in a task of its own; when the scaler cannot be reached, a warning is
logged (at most once a minute) and the next tick tries again. :meth:`aclose` sends an empty snapshot so the
scaler forgets this process at once, rather than after the ttl.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator

import grpc

from sless_api.services.scaling.proto import loadreports_pb2, loadreports_pb2_grpc

log = logging.getLogger("sless.scaler.reporter")

#: How often an unreachable scaler is logged at most.
WARN_EVERY_SEC = 60.0
#: Functions in one report at most (the scaler's default bound); past it the busiest are sent.
MAX_FUNCTIONS = 5000

Key = tuple[str, str]


def default_reporter_id(kind: str = "api") -> str:
    """``<kind>-<host>-<pid>-<random>``: unique per process, even for a pid reused after a restart."""
    return f"{kind}-{socket.gethostname()[:60]}-{os.getpid()}-{secrets.token_hex(4)}"


class LoadReporter:
    """Counts calls per function (in flight, waiting for a replica) and reports them to the scaler."""

    def __init__(self, address: str, token: str, reporter_id: str, interval: float = 1.0,
                 ttl: float | None = None, timeout: float | None = None) -> None:
        """ADDRESS: the scaler's ``host:port``. TOKEN: its bearer token. REPORTER_ID: unique per process.
        INTERVAL: seconds between reports while something is counted. TTL: how long the scaler keeps a report
        without a newer one (default ``max(5 * interval, 3)``). TIMEOUT: of one report (default
        ``min(max(interval, 1), 5)``)."""
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.address = address
        self.reporter_id = reporter_id
        self.interval = interval
        self.ttl = ttl if ttl is not None else max(5 * interval, 3.0)
        self.timeout = timeout if timeout is not None else min(max(interval, 1.0), 5.0)
        self._metadata = (("authorization", f"Bearer {token}"),)
        self._inflight: dict[Key, int] = {}
        self._waiting: dict[Key, int] = {}
        self._sent: set[Key] = set()  # the functions the scaler holds non-zero for us
        self._dirty = False  # a count changed since the last report
        self._wake = asyncio.Event()
        self._sending = asyncio.Lock()  # one report at a time: a newer snapshot never lands before an older one
        self._channel: grpc.aio.Channel | None = None
        self._stub: loadreports_pb2_grpc.LoadReportsAsyncStub | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_warning = -WARN_EVERY_SEC
        #: Reports accepted by the scaler, and reports that failed since the last accepted one.
        self.reports_sent = 0
        self.failures = 0

    async def start(self) -> None:
        """Open the channel and start the reporting task (on the running loop)."""
        if self._task is not None:
            return
        self._channel = grpc.aio.insecure_channel(self.address)
        self._stub = loadreports_pb2_grpc.LoadReportsStub(self._channel)
        self._task = asyncio.create_task(self._run(), name=f"load-reporter {self.reporter_id}")

    async def aclose(self) -> None:
        """Stop reporting; tell the scaler to forget this process's counts (best effort, one timeout)."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if self._sent:
            await self._send(loadreports_pb2.LoadReport(reporter=self.reporter_id, ttl_ms=1))
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def __aenter__(self) -> LoadReporter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --------------------------------------------------------------------------------------- counting

    def begin(self, namespace: str, function: str, waiting: bool = False) -> None:
        """Count one call of NAMESPACE/FUNCTION in flight (or WAITING for a replica); pair with :meth:`end`."""
        counts = self._waiting if waiting else self._inflight
        key = (namespace, function)
        before = counts.get(key, 0)
        counts[key] = before + 1
        self._dirty = True
        if waiting and before == 0:
            self._wake.set()  # the first waiter: report now, the function may be at zero replicas

    def end(self, namespace: str, function: str, waiting: bool = False) -> None:
        """The call counted by :meth:`begin` (same WAITING) is over."""
        counts = self._waiting if waiting else self._inflight
        key = (namespace, function)
        left = counts.get(key, 0) - 1
        if left > 0:
            counts[key] = left
        else:
            counts.pop(key, None)
        self._dirty = True

    # The four calls of the Kubernetes activator's ``Demand`` sink (backends.kube.activator): a LoadReporter is one.
    # The activator counts a call from its start to its end and marks the part it waits for a replica; here a call
    # counts in one stage at a time, so its waiting moves it from in flight to waiting and back.

    def call_started(self, namespace: str, function: str) -> None:
        self.begin(namespace, function)

    def call_ended(self, namespace: str, function: str) -> None:
        self.end(namespace, function)

    def waiting_started(self, namespace: str, function: str) -> None:
        self.end(namespace, function)
        self.begin(namespace, function, waiting=True)

    def waiting_ended(self, namespace: str, function: str) -> None:
        self.end(namespace, function, waiting=True)
        self.begin(namespace, function)

    @contextlib.asynccontextmanager
    async def inflight(self, namespace: str, function: str) -> AsyncIterator[None]:
        """Count a call in flight (served by a replica) for the block."""
        self.begin(namespace, function)
        try:
            yield
        finally:
            self.end(namespace, function)

    @contextlib.asynccontextmanager
    async def waiting(self, namespace: str, function: str) -> AsyncIterator[None]:
        """Count a call waiting for a replica for the block; the function's first waiter is reported at once."""
        self.begin(namespace, function, waiting=True)
        try:
            yield
        finally:
            self.end(namespace, function, waiting=True)

    def counts(self) -> dict[Key, tuple[int, int]]:
        """(inflight, waiting) of every function with a call now."""
        keys = self._inflight.keys() | self._waiting.keys()
        return {key: (self._inflight.get(key, 0), self._waiting.get(key, 0)) for key in keys}

    # --------------------------------------------------------------------------------------- reporting

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval)
            self._wake.clear()
            try:
                await self.report_now()
            except Exception:  # a bug here must not end the reports of a process that keeps serving
                log.exception("load report failed; retrying at the next tick")

    async def report_now(self) -> bool:
        """Send the snapshot if anything is counted or changed since the last one; False when it failed."""
        async with self._sending:
            return await self._report()

    async def _report(self) -> bool:
        counts = self.counts()
        if not counts and not self._sent and not self._dirty:
            return True
        self._dirty = False
        if len(counts) > MAX_FUNCTIONS:
            busiest = sorted(counts, key=lambda key: -sum(counts[key]))[:MAX_FUNCTIONS]
            log.warning("%d functions have calls; the report carries the %d busiest", len(counts), MAX_FUNCTIONS)
            counts = {key: counts[key] for key in busiest}
        loads = [loadreports_pb2.FunctionLoad(namespace=ns, function=fn, inflight=inflight, waiting=waiting)
                 for (ns, fn), (inflight, waiting) in counts.items()]
        # Functions back to 0 since the last report are sent once at 0 (a scaler that missed it still has them).
        loads += [loadreports_pb2.FunctionLoad(namespace=ns, function=fn) for ns, fn in self._sent - counts.keys()]
        report = loadreports_pb2.LoadReport(reporter=self.reporter_id, functions=loads,
                                            ttl_ms=max(1, round(self.ttl * 1000)))
        if await self._send(report):
            self._sent = set(counts)
            return True
        self._dirty = True  # retried at the next tick
        return False

    async def _send(self, report: loadreports_pb2.LoadReport) -> bool:
        if self._stub is None:
            return False
        try:
            await self._stub.Report(report, metadata=self._metadata, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            self._warn(f"{exc.code().name}: {exc.details()}")
            return False
        except (OSError, RuntimeError) as exc:  # a channel closed under us
            self._warn(f"{type(exc).__name__}: {exc}")
            return False
        if self.failures:
            log.info("load reports reach %s again (after %d failed)", self.address, self.failures)
            self.failures = 0
        self.reports_sent += 1
        return True

    def _warn(self, why: str) -> None:
        self.failures += 1
        now = time.monotonic()
        if now - self._last_warning >= WARN_EVERY_SEC:
            self._last_warning = now
            log.warning("cannot send the load report to the scaler at %s (%s); %d failed so far, retrying "
                        "every %gs", self.address, why, self.failures, self.interval)
