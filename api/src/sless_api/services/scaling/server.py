"""The scaler's gRPC server: KEDA's ``externalscaler.ExternalScaler``, the load report ingest, gRPC health.

One port serves all three. KEDA's calls read counts only and need no credentials (KEDA's operator has none to
give an external scaler by default); a report changes what gets scaled, so it needs the bearer token: a tenant's
pod that reaches the port cannot fake load. The health service (``grpc.health.v1.Health``, what the kubelet's
``grpc`` probe asks) answers SERVING until shutdown begins.

KEDA's metadata of the trigger: ``function`` (required), ``target`` (calls in flight per pod, default 10); the
function's namespace is the ScaledObject's. The metric is the function's calls in flight plus those waiting for
a replica (:mod:`.aggregator` sums the processes' reports).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from sless_api.services.scaling.aggregator import FunctionKey, Load, LoadAggregator, TooManyReporters
from sless_api.services.scaling.config import ScalerConfig
from sless_api.services.scaling.proto import (
    externalscaler_pb2,
    externalscaler_pb2_grpc,
    loadreports_pb2,
    loadreports_pb2_grpc,
)

log = logging.getLogger("sless.scaler")

METRIC_NAME = "inflight"
DEFAULT_TARGET = 10
MAX_TARGET = 1_000_000
MAX_REPORTER_CHARS = 128
MAX_NAMESPACE_CHARS = 63
MAX_FUNCTION_CHARS = 253
MAX_COUNT = 1_000_000
#: A report of max_functions entries of the longest names stays below this.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: The expiry sweep runs at least this often (a dead reporter's counts vanish within ttl + this).
SWEEP_SEC = 0.5

AnyContext = grpc.aio.ServicerContext[object, object]


class ScalerState:
    """The aggregator and the wake-ups of the streams that watch a function's activity."""

    def __init__(self, config: ScalerConfig) -> None:
        self.config = config
        self.loads = LoadAggregator(config.max_reporters)
        self.closing = False
        self._signals: dict[FunctionKey, asyncio.Event] = {}
        self._watchers: Counter[FunctionKey] = Counter()

    def load(self, key: FunctionKey) -> Load:
        self.notify(self.loads.expire())
        return self.loads.load(key)

    def notify(self, keys: set[FunctionKey]) -> None:
        """Wake the streams watching KEYS (their activity changed)."""
        for key in keys:
            signal = self._signals.get(key)
            if signal is not None:
                signal.set()
                self._signals[key] = asyncio.Event()

    def signal(self, key: FunctionKey) -> asyncio.Event:
        """The event set at KEY's next change (take it before reading the state: no change falls between)."""
        return self._signals.setdefault(key, asyncio.Event())

    @property
    def streams(self) -> int:
        return self._watchers.total()

    def watch(self, key: FunctionKey) -> None:
        self._watchers[key] += 1

    def unwatch(self, key: FunctionKey) -> None:
        self._watchers[key] -= 1
        if self._watchers[key] <= 0:
            del self._watchers[key]
            self._signals.pop(key, None)

    def close(self) -> None:
        """Let every stream end: they see ``closing`` when woken."""
        self.closing = True
        self.notify(set(self._signals))

    async def sweep(self) -> None:
        """Expire dead reporters' snapshots as they run out, so a stream hears of the idle function at once."""
        while True:
            self.notify(self.loads.expire())
            next_expiry = self.loads.next_expiry()  # on the aggregator's clock, time.monotonic
            delay = SWEEP_SEC if next_expiry is None else min(SWEEP_SEC, max(0.0, next_expiry - time.monotonic()))
            await asyncio.sleep(delay)


async def _invalid(context: AnyContext, message: str) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)


async def _target(request: externalscaler_pb2.ScaledObjectRef, context: AnyContext) -> tuple[FunctionKey, float]:
    """The function and the target of a ScaledObject's trigger metadata; INVALID_ARGUMENT when unusable."""
    where = f"ScaledObject {request.namespace}/{request.name}"
    metadata = request.scalerMetadata
    function = metadata.get("function", "").strip()
    if not function:
        await _invalid(context, f"{where}: the trigger's metadata needs `function` (the function's name)")
    if len(function) > MAX_FUNCTION_CHARS:
        await _invalid(context, f"{where}: `function` is longer than {MAX_FUNCTION_CHARS} characters")
    if not request.namespace or len(request.namespace) > MAX_NAMESPACE_CHARS:
        await _invalid(context, f"{where}: the ScaledObject's namespace must be 1 to {MAX_NAMESPACE_CHARS} "
                                "characters")
    raw = metadata.get("target", "").strip()
    target = float(DEFAULT_TARGET)
    if raw:
        try:
            target = float(raw)
        except ValueError:
            target = math.nan
        if not (math.isfinite(target) and 0 < target <= MAX_TARGET):
            await _invalid(context, f"{where}: `target` must be a number of calls in flight per pod, more than 0 "
                                    f"and at most {MAX_TARGET}, got {raw!r}")
    return (request.namespace, function), target


class ExternalScaler(externalscaler_pb2_grpc.ExternalScalerServicer):
    """KEDA's external (push) scaler over the summed load reports."""

    def __init__(self, state: ScalerState) -> None:
        self.state = state

    async def IsActive(self, request: externalscaler_pb2.ScaledObjectRef,  # noqa: N802 (the proto's name)
                       context: AnyContext) -> externalscaler_pb2.IsActiveResponse:
        key, _ = await _target(request, context)
        return externalscaler_pb2.IsActiveResponse(result=self.state.load(key).active)

    async def StreamIsActive(self, request: externalscaler_pb2.ScaledObjectRef,  # noqa: N802
                             context: AnyContext) -> AsyncIterator[externalscaler_pb2.IsActiveResponse]:
        """The state now, then again at each change (idle <-> active) and every keepalive_sec; ends when KEDA
        cancels (the generator is closed) or the server shuts down."""
        key, _ = await _target(request, context)
        state = self.state
        if state.streams >= state.config.max_streams:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{state.streams} streams are open, the most this scaler serves")
        state.watch(key)
        log.debug("stream opened for %s/%s", *key)
        try:
            while not state.closing:
                signal = state.signal(key)
                yield externalscaler_pb2.IsActiveResponse(result=state.load(key).active)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(signal.wait(), state.config.keepalive_sec)
        finally:
            state.unwatch(key)
            log.debug("stream closed for %s/%s", *key)

    async def GetMetricSpec(self, request: externalscaler_pb2.ScaledObjectRef,  # noqa: N802
                            context: AnyContext) -> externalscaler_pb2.GetMetricSpecResponse:
        _, target = await _target(request, context)
        spec = externalscaler_pb2.MetricSpec(metricName=METRIC_NAME, targetSize=max(1, math.ceil(target)),
                                             targetSizeFloat=target)
        return externalscaler_pb2.GetMetricSpecResponse(metricSpecs=[spec])

    async def GetMetrics(self, request: externalscaler_pb2.GetMetricsRequest,  # noqa: N802
                         context: AnyContext) -> externalscaler_pb2.GetMetricsResponse:
        key, _ = await _target(request.scaledObjectRef, context)
        total = self.state.load(key).total
        value = externalscaler_pb2.MetricValue(metricName=request.metricName or METRIC_NAME, metricValue=total,
                                               metricValueFloat=float(total))
        return externalscaler_pb2.GetMetricsResponse(metricValues=[value])


def _bearer(context: AnyContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return ""


class LoadReports(loadreports_pb2_grpc.LoadReportsServicer):
    """The ingest of the processes' snapshots: authenticated, bounded."""

    def __init__(self, state: ScalerState) -> None:
        self.state = state
        self._token = state.config.token.encode()

    async def Report(self, request: loadreports_pb2.LoadReport,  # noqa: N802 (the proto's name)
                     context: AnyContext) -> loadreports_pb2.ReportAck:
        if not hmac.compare_digest(_bearer(context).encode(), self._token):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "a load report needs the scaler's bearer token")
        config = self.state.config
        reporter = request.reporter
        if not reporter or len(reporter) > MAX_REPORTER_CHARS:
            await _invalid(context, f"`reporter` must be 1 to {MAX_REPORTER_CHARS} characters")
        if len(request.functions) > config.max_functions:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{len(request.functions)} functions in one report, more than the "
                                f"{config.max_functions} this scaler takes")
        loads: dict[FunctionKey, Load] = {}
        for item in request.functions:
            if not item.namespace or len(item.namespace) > MAX_NAMESPACE_CHARS:
                await _invalid(context, f"a function's namespace must be 1 to {MAX_NAMESPACE_CHARS} characters")
            if not item.function or len(item.function) > MAX_FUNCTION_CHARS:
                await _invalid(context, f"a function's name must be 1 to {MAX_FUNCTION_CHARS} characters")
            if item.inflight > MAX_COUNT or item.waiting > MAX_COUNT:
                await _invalid(context, f"counts above {MAX_COUNT} for {item.namespace}/{item.function}")
            key = (item.namespace, item.function)
            before = loads.get(key, Load())
            loads[key] = Load(before.inflight + item.inflight, before.waiting + item.waiting)
        ttl = request.ttl_ms / 1000 if request.ttl_ms else config.report_ttl_sec
        ttl = min(ttl, config.max_ttl_sec)
        try:
            changed = self.state.loads.report(reporter, loads, ttl)
        except TooManyReporters as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        self.state.notify(changed)
        if changed:
            log.debug("activity changed by %s: %s", reporter, sorted(changed))
        return loadreports_pb2.ReportAck(ttl_ms=round(ttl * 1000))


class ScalerServer:
    """The gRPC server with its three services and the expiry sweep."""

    def __init__(self, config: ScalerConfig) -> None:
        self.config = config
        self.state = ScalerState(config)
        self.health = health.aio.HealthServicer()
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._sweep: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Listen on ``config.listen``; the port bound (the one asked, or the one given for port 0)."""
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                          ("grpc.so_reuseport", 0)])
        externalscaler_pb2_grpc.add_ExternalScalerServicer_to_server(ExternalScaler(self.state), server)
        loadreports_pb2_grpc.add_LoadReportsServicer_to_server(LoadReports(self.state), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        self.port = server.add_insecure_port(self.config.listen)
        if not self.port:
            raise OSError(f"cannot listen on {self.config.listen}")
        await server.start()
        self._server = server
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._sweep = asyncio.create_task(self.state.sweep(), name="scaler-sweep")
        return self.port

    async def stop(self) -> None:
        """NOT_SERVING, end the streams (KEDA reconnects to another replica or after the restart), stop."""
        await self.health.enter_graceful_shutdown()
        self.state.close()
        if self._sweep is not None:
            self._sweep.cancel()
        if self._server is not None:
            await self._server.stop(self.config.grace_sec)
