"""Status building: conditions with stable transition times, and writing only real changes.

A status patch wakes every watcher of the resource, so an unchanged status is never written;
``lastTransitionTime`` moves only when a condition's status really changes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sless_operator.kube import Kube

MESSAGE_LIMIT = 2000
_TIME_KEYS = ("lastTransitionTime",)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def keep_head(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """A result: its beginning matters (truncated with a marker)."""
    return text if len(text) <= limit else text[: limit - 15] + "\n…(truncated)"


def keep_tail(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """An error or a build log: its end says why (truncated with a marker)."""
    return text if len(text) <= limit else "(truncated)…\n" + text[-(limit - 14) :]


def condition_of(status: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in status.get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


class StatusBuilder:
    """Collects the new status of one object, starting from its current one."""

    def __init__(self, old: dict[str, Any] | None, generation: int) -> None:
        self.old = dict(old or {})
        self.generation = generation
        self.fields: dict[str, Any] = {"observedGeneration": generation}
        self._conditions: dict[str, dict[str, Any]] = {}

    def set(self, **fields: Any) -> StatusBuilder:
        self.fields.update(fields)
        return self

    def condition(self, kind: str, state: bool | None, reason: str, message: str = "") -> StatusBuilder:
        value = "Unknown" if state is None else ("True" if state else "False")
        previous = condition_of(self.old, kind)
        since = previous.get("lastTransitionTime") if previous.get("status") == value else None
        self._conditions[kind] = {
            "type": kind,
            "status": value,
            "reason": reason,
            "message": message,
            "observedGeneration": self.generation,
            "lastTransitionTime": since or now(),
        }
        return self

    def build(self) -> dict[str, Any]:
        status = dict(self.fields)
        if self._conditions:
            others = [c for c in self.old.get("conditions") or [] if c.get("type") not in self._conditions]
            status["conditions"] = sorted([*others, *self._conditions.values()], key=lambda c: str(c.get("type")))
        return status

    def changed(self) -> bool:
        new = self.build()
        for key, value in new.items():
            old = self.old.get(key)
            if key == "conditions":
                if _strip(old or []) != _strip(value):
                    return True
            elif old != value:
                return True
        return False


def _strip(conditions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in c.items() if k not in _TIME_KEYS} for c in conditions]


async def write(kube: Kube, path: str, builder: StatusBuilder) -> bool:
    """Merge-patch the ``/status`` subresource at PATH when something changed; True if written."""
    if not builder.changed():
        return False
    await kube.patch(path + "/status", {"status": builder.build()})
    return True
