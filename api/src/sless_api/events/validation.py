"""Rules for event triggers that need more than the shared model's field checks."""

from __future__ import annotations

from collections.abc import Iterable

from sless_api.platform import Conflict, TriggerRecord
from sless_core.models import TriggerSpec, TriggerType


def check_queue_free(spec: TriggerSpec, existing: Iterable[TriggerRecord]) -> None:
    """One trigger per queue within a tenant: two consumers on one queue would each get a share of the
    messages (not a copy), which nobody means. For fan-out, bind several queues to an exchange."""
    if spec.type != TriggerType.EVENT:
        return
    for other in existing:
        if other.spec.type == TriggerType.EVENT and other.spec.queue == spec.queue and other.spec.name != spec.name:
            raise Conflict(f"queue {spec.queue!r} is already consumed by trigger {other.spec.name!r}; "
                           "bind another queue to your exchange for a second consumer",
                           existing=other.to_api())
