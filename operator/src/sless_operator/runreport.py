"""A finished run's record for its owner's status (``status.runRecord``, ``sless_core.runrecord``).

The operator is the one component that sees a run's Job end and may read its pod's log before the Job's TTL or
the next run removes the pod; the API stores what it leaves here as the run's invocation record. Read once per
Job: a FunctionJob reports a run once (``job._reported``), a cron Trigger keeps the uid of the Job it recorded.
"""

from __future__ import annotations

import time
from typing import Any

from sless_core import crd
from sless_core.runrecord import STATUS_FIELD, RunRecord
from sless_operator import capture, manifests
from sless_operator.context import Context
from sless_operator.observe import JobSummary
from sless_operator.status import now

__all__ = ["STATUS_FIELD", "record"]


async def record(ctx: Context, job: JobSummary, pods: list[dict[str, Any]], trigger: str, path: str,
                 error: str) -> dict[str, object]:
    """The status value for the finished JOB (its pods among PODS, ``capture.job_pods``), a run of TRIGGER ("job"
    or "cron") shown at PATH, with ERROR when it failed."""
    lines, truncated = await capture.run_output(ctx.kube, job.namespace, pods, job.uid, manifests.CONTAINER,
                                                default_ts=time.time())  # fmt: skip
    return RunRecord(uid=job.uid, job=job.name, function=job.labels.get(crd.LABEL_FUNCTION, ""), trigger=trigger,
                     path=path, start_time=job.start_time, completion_time=job.completion_time or now(),
                     succeeded=job.state == "complete", error="" if job.state == "complete" else error,
                     version=job.version, lines=lines, truncated=truncated).to_status()  # fmt: skip
