"""The operator's Prometheus metrics: builds and compiles, the outcomes of job and cron runs, and its own work:
each reconcile's duration and failures by kind, and the work queue's depth.

Counted from the Job watch (each Job's move to finished is seen once per operator process: the initial
listing after a restart counts nothing again). Served at ``/metrics`` on SLESS_OPERATOR_METRICS_HOST/PORT,
only with SLESS_METRICS_TOKEN set and only to that bearer token, as the API's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sized
from datetime import datetime

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sless_core.scrape import scrape_allowed
from sless_operator.observe import JobSummary

log = logging.getLogger(__name__)
#: The operator's own registry: the API's metrics have the same names, and tests import both in one process.
REGISTRY = CollectorRegistry()
BUILD_BUCKETS = (5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600, 900)

BUILDS = Counter("sless_builds_total", "Finished image builds by runtime and result (ready, failed)",
                 ["runtime", "result"], registry=REGISTRY)
BUILD_SECONDS = Histogram("sless_build_duration_seconds", "Image build duration (build Job start to end)",
                          ["runtime"], buckets=BUILD_BUCKETS, registry=REGISTRY)
RUNS = Counter("sless_job_runs_total", "Finished FunctionJob and cron runs by kind (job, cron) and result",
               ["namespace", "kind", "result"], registry=REGISTRY)
COMPILES = Counter("sless_compiles_total", "Finished Go compile Jobs by result (ready, failed)", ["result"],
                   registry=REGISTRY)
#: A reconcile is a few API calls (milliseconds) up to a slow API server's seconds.
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
RECONCILE_SECONDS = Histogram("sless_operator_reconcile_duration_seconds",
                              "One reconcile (or clean-up) of a resource, by kind (function, trigger, functionjob, "
                              "job)", ["kind"], buckets=RECONCILE_BUCKETS, registry=REGISTRY)
RECONCILE_ERRORS = Counter("sless_operator_reconcile_errors_total",
                           "Reconciles that failed (retried later, or reported in the resource's status), by kind",
                           ["kind"], registry=REGISTRY)
QUEUE_DEPTH = Gauge("sless_operator_queue_depth", "Reconciles waiting in the operator's work queue",
                    registry=REGISTRY)


def _seconds(start: str, end: str) -> float | None:
    try:
        began = datetime.fromisoformat(start.replace("Z", "+00:00"))
        ended = datetime.fromisoformat(end.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0.0, (ended - began).total_seconds())


def job_finished(kind: str, namespace: str, runtime: str, summary: JobSummary) -> None:
    """Count a Job that just finished: KIND is build, job or cron; RUNTIME is its function's (builds only)."""
    result = "ready" if summary.state == "complete" else "failed"
    if kind == "compile":
        COMPILES.labels(result).inc()
    elif kind == "build":
        BUILDS.labels(runtime, result).inc()
        took = _seconds(summary.start_time, summary.completion_time) if summary.completion_time else None
        if took is not None:
            BUILD_SECONDS.labels(runtime).observe(took)
    else:
        RUNS.labels(namespace, kind, "succeeded" if result == "ready" else "failed").inc()


async def reconciled(kind: str, work: Callable[[], Awaitable[None]]) -> None:
    """Run one reconcile of KIND, timed; a failure is counted and goes on to the caller's retry."""
    began = time.monotonic()
    try:
        await work()
    except BaseException:
        RECONCILE_ERRORS.labels(kind).inc()
        raise
    finally:
        RECONCILE_SECONDS.labels(kind).observe(time.monotonic() - began)


def watch_queue(queue: Sized) -> None:
    """The queue-depth gauge reads QUEUE's length at each scrape."""
    QUEUE_DEPTH.set_function(lambda: len(queue))


class MetricsServer:
    """``GET /metrics`` on its own port (Kopf's liveness port serves only Kopf's probe)."""

    def __init__(self, token: str, host: str, port: int) -> None:
        self.token, self.host, self.port = token, host, port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        if not self.token:
            return
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def metrics(self, request: web.Request) -> web.Response:
        if not scrape_allowed(request.headers.get("Authorization"), self.token):
            return web.json_response({"error": "a scrape needs the metrics token"}, status=401)
        return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})
