"""Prometheus metrics of the API process (and ``sless up``): calls, cold starts, builds, dropped records.

Metrics live in prometheus_client's default registry. Under gunicorn every worker is a process of its
own, so ``sless-api`` points ``PROMETHEUS_MULTIPROC_DIR`` at a fresh folder before the workers start and
a scrape sums them (``MultiProcessCollector``); a single process (``sless up``) reads its registry
directly. Label values are names the API validated (tenant namespaces, function names, runtimes),
so the series stay bounded by what tenants deployed.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from sless_core.scrape import scrape_allowed

#: A warm call lasts about a millisecond, the longest the 900 s maximum timeout: buckets from 0.1 ms up.
CALL_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                30, 60, 300, 900)
BUILD_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

HTTP_REQUESTS = Counter("sless_http_requests_total", "Requests answered, by area (api, fn) and HTTP status",
                        ["area", "status"])
INVOCATIONS = Counter("sless_invocations_total", "Finished invocations by function, trigger and HTTP status",
                      ["namespace", "function", "trigger", "status"])
# The status as its class (2xx ... 5xx): a function answers any code it likes, and each label value is twenty
# bucket series; a cron run's latency and errors are told apart from an http call's by ``trigger``.
INVOCATION_SECONDS = Histogram("sless_invocation_duration_seconds", "Invocation duration seen by the platform",
                               ["namespace", "function", "trigger", "status_class"], buckets=CALL_BUCKETS)
IN_FLIGHT = Gauge("sless_invocations_in_flight", "Calls the platform holds for a function now: waiting for a "
                  "process or pod, or being answered", ["namespace", "function"], multiprocess_mode="livesum")
THROTTLED = Counter("sless_throttled_total", "Calls refused with 429 for a concurrency limit",
                    ["namespace", "function"])
UPSTREAM_ERRORS = Counter("sless_proxy_upstream_errors_total",
                          "Calls whose function did not answer: timeout or unreachable", ["kind"])
COLD_STARTS = Counter("sless_cold_starts_total", "Function processes started for a call", ["runtime"])
COLD_START_SECONDS = Histogram("sless_cold_start_duration_seconds", "From process start to its first health answer",
                               ["runtime"], buckets=CALL_BUCKETS)
WARM_SPARE_CLAIMS = Counter("sless_warm_spare_claims_total",
                            "Function processes that took over a warm spare instead of starting", ["runtime"])
BUILDS = Counter("sless_builds_total", "Finished builds by runtime and result (ready, failed)", ["runtime", "result"])
BUILD_SECONDS = Histogram("sless_build_duration_seconds", "Build duration", ["runtime"], buckets=BUILD_BUCKETS)
EVENT_MESSAGES = Counter("sless_event_messages_total",
                         "Event-trigger messages by outcome: delivered, done, retried, duplicate (skipped), dead",
                         ["namespace", "trigger", "outcome"])
EVENT_DEAD_LETTERS = Counter("sless_event_dead_letters_total",
                             "Messages moved to a trigger's dead-letter queue, by why (failed, rejected, malformed)",
                             ["namespace", "trigger", "kind"])
EVENT_QUEUE_MESSAGES = Gauge("sless_event_queue_messages", "Messages waiting in a trigger's queue or its DLQ",
                             ["namespace", "trigger", "queue"], multiprocess_mode="livemax")
RECORDS_DROPPED = Counter("sless_invocation_records_dropped_total",
                          "Invocation records lost: queue full, the database failing, or written after close")


# The labelled series each call touches, found once: ``labels()`` takes a lock and builds a key per call.
# They hold no more than the registry itself keeps (one entry per series ever used).
_calls: dict[tuple[str, str, str, int], Counter] = {}
_call_seconds: dict[tuple[str, str, str, int], Histogram] = {}
_in_flight: dict[tuple[str, str], Gauge] = {}
_requests: dict[tuple[str, int], Counter] = {}


def observe_invocation(namespace: str, function: str, trigger: str, status: int, seconds: float) -> None:
    key = (namespace, function, trigger, status)
    counter = _calls.get(key)
    if counter is None:
        counter = _calls[key] = INVOCATIONS.labels(namespace, function, trigger, str(status))
    counter.inc()
    klass = (namespace, function, trigger, status // 100)
    histogram = _call_seconds.get(klass)
    if histogram is None:
        histogram = _call_seconds[klass] = INVOCATION_SECONDS.labels(namespace, function, trigger,
                                                                      f"{status // 100}xx")
    histogram.observe(seconds)


def in_flight(namespace: str, function: str) -> Gauge:
    """The in-flight gauge of one function (``inc`` as a call begins, ``dec`` as it ends)."""
    gauge = _in_flight.get((namespace, function))
    if gauge is None:
        gauge = _in_flight[(namespace, function)] = IN_FLIGHT.labels(namespace, function)
    return gauge


def count_request(area: str, status: int) -> None:
    """One answered HTTP request, by area (``api`` or ``fn``) and status."""
    counter = _requests.get((area, status))
    if counter is None:
        counter = _requests[(area, status)] = HTTP_REQUESTS.labels(area, str(status))
    counter.inc()


__all__ = ["count_request", "exposition", "in_flight", "observe_invocation", "scrape_allowed"]


def exposition() -> tuple[bytes, str]:
    """The text a scrape gets, summed over gunicorn's workers when they share a multiprocess folder."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
