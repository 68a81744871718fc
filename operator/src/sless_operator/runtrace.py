"""Spans of one-shot runs seen after the fact: a FunctionJob's run (``job <namespace>/<job>``) and a cron
firing (``cron <namespace>/<trigger>``), from their Job's start to its end, with the outcome.

A FunctionJob made through the API carries the context of the request that made it (``sless.dev/traceparent``):
its run's pod gets it as ``TRACEPARENT`` and the ``job`` span is its child, so the runner's own spans and the
operator's share that trace. A cron firing has no request before it and its pod comes from a CronJob's template
(one value for every firing), so its span is a root of its own and the runner starts its own trace.
"""

from __future__ import annotations

from datetime import datetime

from sless_core import crd, tracing
from sless_operator.observe import JobSummary


def traceparent_of(meta: dict[str, object]) -> str:
    """The ``sless.dev/traceparent`` annotation of an object's METADATA ("" without one)."""
    annotations = meta.get("annotations")
    return str(annotations.get(crd.ANNOTATION_TRACEPARENT) or "") if isinstance(annotations, dict) else ""


def timestamp_ns(value: str, default: int) -> int:
    """An RFC 3339 time of the API server (``2024-05-01T10:00:00Z``) in ns since the epoch, DEFAULT if none."""
    try:
        return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1_000_000_000)
    except ValueError:
        return default


def emit(name: str, job: JobSummary, message: str, parent: str = "", **attributes: str) -> None:
    """The span NAME of the finished JOB (ERROR with MESSAGE when it failed), the child of the PARENT
    traceparent when there is one, else a root (the operator's tracer must be on)."""
    end = timestamp_ns(job.completion_time, tracing.now_ns())
    start = min(timestamp_ns(job.start_time, end), end)
    error = None if job.state == "complete" else (message or job.reason or "failed")
    tracing.recorded(name, start, end, {tracing.TRACEPARENT: parent} if parent else None, error=error,
                     sless_job=job.name, sless_outcome="succeeded" if error is None else "failed",
                     **attributes)  # fmt: skip
