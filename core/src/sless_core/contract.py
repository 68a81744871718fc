"""The platform's rules that do not depend on a backend, stated once for both.

The standalone backend, the kubernetes backend and the operator each used to decide these on
their own, and drifted. Each rule here is a pure function of what a backend has read; the backend
only maps the answer onto its own state and errors.

- Which spec changes need a new build (runtime, entrypoint: both are baked into the build).
- Whether an upload builds: new code always; identical code (same SHA-256) only when the function
  is ``Failed`` (the failure may have passed, e.g. a dependency download, or have been fixed by a
  change that does not rebuild, e.g. an environment variable read at import).
- How a job's ``run_id`` moves: 0 records, growing runs again, the same value changes nothing,
  shrinking is refused, and a run in progress is not replaced.
- One event trigger per queue within a tenant.
- Cron: what a firing carries, that a missed tick is not replayed beyond a short start deadline,
  and that firings of one trigger never overlap.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from croniter import croniter

from sless_core.errors import ValidationError
from sless_core.models import FunctionSpec, JobPhase, Phase, TriggerSpec, TriggerType

# -- functions ------------------------------------------------------------------------------------

#: Spec fields baked into the build (the build context's Dockerfile, the standalone load check).
REBUILD_FIELDS = ("runtime", "entrypoint")
IDENTICAL_UPLOAD = "identical code uploaded: no rebuild"


def spec_change_rebuilds(old: FunctionSpec, new: FunctionSpec) -> bool:
    """Whether going from OLD to NEW needs a new build; other changes only restart or roll out."""
    return any(getattr(old, field) != getattr(new, field) for field in REBUILD_FIELDS)


def upload_builds(current_hash: str | None, phase: str, new_hash: str) -> bool:
    """Whether an upload of NEW_HASH builds a function that has CURRENT_HASH in PHASE."""
    return current_hash != new_hash or phase == Phase.FAILED


def identical_upload_message(message: str) -> str:
    """The function's message after an upload that built nothing."""
    return f"{IDENTICAL_UPLOAD} ({message})" if message else IDENTICAL_UPLOAD


# -- jobs -----------------------------------------------------------------------------------------

#: A job created with run_id 0 (or not yet run): it waits for a larger run_id.
RECORDED_MESSAGE = "recorded: set run_id above 0 to run it"


class Rerun(Enum):
    """What ``PATCH /jobs/{name} {"run_id": n}`` does."""

    NOTHING = "nothing"  # the same run_id: the job is left as it is
    RUN = "run"  # a larger run_id: the job runs again
    BUSY = "busy"  # a larger run_id while the current run is Pending or Running: 409


def rerun(current_run_id: int, phase: str, requested: int) -> Rerun:
    """The decision for REQUESTED (already range-checked); raises ValidationError when it shrinks."""
    if requested == current_run_id:
        return Rerun.NOTHING
    if requested < current_run_id:
        raise ValidationError(f"run_id can only grow (now {current_run_id})", field="run_id")
    if phase in (JobPhase.PENDING, JobPhase.RUNNING):
        return Rerun.BUSY
    return Rerun.RUN


# -- event triggers -------------------------------------------------------------------------------

def queue_holder(spec: TriggerSpec, others: Iterable[TriggerSpec]) -> TriggerSpec | None:
    """The other trigger of the namespace that already consumes SPEC's queue, if any.

    Two consumers on one queue would each get a share of the messages (not a copy), which nobody
    means; for fan-out, bind several queues to an exchange. A disabled trigger keeps its queue.
    """
    if spec.type != TriggerType.EVENT:
        return None
    for other in others:
        if other.type == TriggerType.EVENT and other.queue == spec.queue and other.name != spec.name:
            return other
    return None


def queue_taken_message(queue: str | None, holder: str) -> str:
    return (f"queue {queue!r} is already consumed by trigger {holder!r}; bind another queue to your exchange "
            "for a second consumer")


# -- cron -----------------------------------------------------------------------------------------

#: A tick that cannot start within this long of its time (the platform was down, busy) is skipped:
#: only the latest missed tick may still fire, late, and older ones are never replayed.
CRON_START_DEADLINE_SEC = 300
#: A tick whose previous firing of the same trigger still runs is skipped (no overlap).
CRON_OVERLAP = False


def scheduled_at(tick: float) -> str:
    """A tick as the firing carries it: RFC 3339 in UTC to the second, ``2026-01-02T03:04:00Z``."""
    return datetime.fromtimestamp(int(tick), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cron_event(trigger: str, schedule: str, tick: float) -> dict[str, Any]:
    """The event of one firing: the same object on every backend."""
    return {"type": "cron", "trigger": trigger, "schedule": schedule, "scheduled_at": scheduled_at(tick)}


def next_tick(schedule: str, after: float) -> float:
    """The first tick of SCHEDULE (UTC) strictly after AFTER."""
    value: float = croniter(schedule, datetime.fromtimestamp(after, UTC)).get_next(float)
    return value


def due_tick(schedule: str, now: float, last_fired: float | None) -> float | None:
    """The tick to fire now, if any: the latest tick at or before NOW, when it is within the start
    deadline and later than LAST_FIRED (the tick fired last). Older missed ticks are not replayed."""
    tick: float = croniter(schedule, datetime.fromtimestamp(now + 1e-6, UTC)).get_prev(float)
    if now - tick > CRON_START_DEADLINE_SEC:
        return None
    if last_fired is not None and tick <= last_fired:
        return None
    return tick
