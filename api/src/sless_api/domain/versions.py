"""Deployed versions of a function and the choice of a rollback target, the same for both backends.

Every deploy that became Ready is a version: its number (1, 2, ... per function, never reused), its
code hash and the configuration it ran with. A rollback deploys an earlier version's code and
configuration again, which, once Ready, is recorded as a new version (so the history says what
happened, and rolling back twice returns to where one started). Only the newest ``KEEP`` versions
are kept, as many as the code store keeps archives of.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sless_api.domain.errors import Conflict, NotFound
from sless_api.domain.records import iso
from sless_core.errors import ValidationError
from sless_core.models import FunctionSpec
from sless_core.traffic import MAX_VERSION

KEEP = 10


@dataclass(frozen=True)
class Version:
    """One deployed version: what ran (code hash + configuration) and when it became Ready."""

    version: int
    code_hash: str
    #: the function's configuration (``FunctionSpec.to_dict()`` without its name)
    config: dict[str, Any]
    deployed_at: float
    #: what the backend needs to deploy it again (object keys and digests); never shown
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_api(self, current: bool) -> dict[str, Any]:
        return {"version": self.version, "code_hash": self.code_hash, **self.config,
                "deployed_at": iso(self.deployed_at), "current": current}  # fmt: skip


def function_config(spec: FunctionSpec) -> dict[str, Any]:
    """What a version records of a function's configuration: its spec without the name."""
    return {k: v for k, v in spec.to_dict().items() if k != "name"}


def same_deploy(version: Version | None, code_hash: str, config: dict[str, Any]) -> bool:
    return version is not None and version.code_hash == code_hash and version.config == config


def append(history: Sequence[Version], code_hash: str, config: dict[str, Any], now: float,
           extra: dict[str, Any] | None = None) -> list[Version] | None:  # fmt: skip
    """HISTORY (oldest first) with the deploy that just became Ready added; None when it is the newest already."""
    newest = history[-1] if history else None
    if same_deploy(newest, code_hash, config):
        return None
    number = (newest.version + 1) if newest else 1
    added = Version(number, code_hash, dict(config), now, dict(extra or {}))
    return [*history, added][-KEEP:]


def number_of(history: Sequence[Version], code_hash: str, config: dict[str, Any]) -> int:
    """The number of the deploy CODE_HASH + CONFIG: the newest version's when it is that one, else the next
    (what :func:`append` gives it once Ready), so a call is recorded with its version even before that."""
    newest = history[-1] if history else None
    if newest is None:
        return 1
    return newest.version if same_deploy(newest, code_hash, config) else newest.version + 1


def requested_version(body: object) -> int | None:
    """The ``version`` of a rollback request (None: the previous one); a ValidationError for anything else."""
    if body is None:
        return None
    if not isinstance(body, dict):
        raise ValidationError("the request body must be a JSON object: {\"version\": N} or {}")
    unknown = sorted(set(body) - {"version"})
    if unknown:
        raise ValidationError(f"unknown field {unknown[0]!r}", field=unknown[0])
    value = body.get("version")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_VERSION:
        raise ValidationError(f"version must be an integer from 1 to {MAX_VERSION}", field="version")
    return value


def choose(history: Sequence[Version], requested: int | None, function: str) -> Version:
    """The version to roll back to: REQUESTED, or the one before the current (newest) one."""
    if not history:
        raise Conflict(f"function {function!r} has no deployed version yet")
    current = history[-1]
    if requested is None:
        if len(history) < 2:
            raise Conflict(f"function {function!r} has no earlier version to roll back to")
        return history[-2]
    if requested == current.version:
        raise Conflict(f"version {requested} of function {function!r} is the one deployed")
    for version in history:
        if version.version == requested:
            return version
    kept = ", ".join(str(v.version) for v in history)
    raise NotFound(f"function {function!r} has no version {requested} (kept: {kept})")


def listing(history: Sequence[Version]) -> dict[str, Any]:
    """The API's answer: newest first, the newest marked current."""
    newest = history[-1].version if history else None
    return {"items": [v.to_api(v.version == newest) for v in reversed(history)]}
