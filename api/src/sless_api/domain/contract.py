"""The backend-neutral rules of :mod:`sless_core.contract` as the API's errors, for both backends."""

from __future__ import annotations

from collections.abc import Iterable

from sless_api.domain.errors import Conflict
from sless_api.domain.records import JobRecord, TriggerRecord
from sless_core import contract
from sless_core.models import TriggerSpec


def check_queue_free(spec: TriggerSpec, existing: Iterable[TriggerRecord]) -> None:
    """409 when another event trigger of the namespace already consumes SPEC's queue."""
    records = {r.spec.name: r for r in existing}
    holder = contract.queue_holder(spec, (r.spec for r in records.values()))
    if holder is not None:
        raise Conflict(contract.queue_taken_message(spec.queue, holder.name), existing=records[holder.name].to_api())


def check_rerun(job: JobRecord, run_id: int) -> contract.Rerun:
    """What a new RUN_ID does to JOB: nothing or run (400 when it shrinks, 409 while a run is in progress)."""
    decision = contract.rerun(job.spec.run_id, job.phase, run_id)
    if decision is contract.Rerun.BUSY:
        raise Conflict(f"job {job.spec.name!r} is still {job.phase}", existing=job.to_api())
    return decision
