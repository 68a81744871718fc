"""A traffic split: a function's http calls shared by weight between its current version and one other.

One set of rules for the API (a ``PUT .../traffic`` body), the Kubernetes codec (``spec.traffic`` of a
Function) and the operator (which runs the other version): deny by default, so anything not exactly
``[{"version": N, "weight": W}, ...]`` with one or two distinct versions and integer weights 0-100 summing
to 100 is refused. Which versions exist, and that one of them is the current one, is checked against the
function's kept versions by :func:`check_versions`.

Calls are shared by smooth weighted round robin (:class:`WeightedRoundRobin`), not at random: over any run
of 100 calls each version gets exactly its weight, and the order interleaves them evenly (90/10 sends every
tenth call to the 10), so a test or a canary's error rate never depends on luck.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sless_core.errors import ValidationError
from sless_core.naming import NAME_MAX

MAX_ENTRIES = 2
TOTAL = 100
MAX_VERSION = 2**31 - 1


@dataclass(frozen=True)
class SplitEntry:
    version: int
    weight: int

    def to_dict(self) -> dict[str, int]:
        return {"version": self.version, "weight": self.weight}


@dataclass(frozen=True)
class TrafficSplit:
    """One or two ``(version, weight)`` entries in the order given; the weights sum to 100."""

    entries: tuple[SplitEntry, ...]

    def to_list(self) -> list[dict[str, int]]:
        return [e.to_dict() for e in self.entries]

    def versions(self) -> list[int]:
        return [e.version for e in self.entries]

    def other_than(self, current: int) -> SplitEntry | None:
        """The entry that is not the current version (the one that runs beside it), if any."""
        return next((e for e in self.entries if e.version != current), None)


def _integer(value: object, low: int, high: int, name: str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{name} must be an integer from {low} to {high}", field=field)
    if not low <= value <= high:
        raise ValidationError(f"{name} must be an integer from {low} to {high}", field=field)
    return value


def parse_entries(value: object, field: str = "split") -> TrafficSplit:
    """The entries of a split (``[{"version", "weight"}, ...]``) validated, or a ValidationError naming the field."""
    if not isinstance(value, list) or not value:
        raise ValidationError(f"{field} must be a list of 1 or 2 entries {{\"version\": N, \"weight\": W}}",
                              field=field)
    if len(value) > MAX_ENTRIES:
        raise ValidationError(f"{field} may name at most {MAX_ENTRIES} versions, not {len(value)}", field=field)
    entries: list[SplitEntry] = []
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(item, dict):
            raise ValidationError(f"{where} must be an object {{\"version\": N, \"weight\": W}}", field=where)
        unknown = sorted(set(item) - {"version", "weight"})
        if unknown:
            raise ValidationError(f"unknown field {unknown[0]!r} in {where}", field=f"{where}.{unknown[0]}")
        if "version" not in item or "weight" not in item:
            raise ValidationError(f"{where} needs both version and weight", field=where)
        version = _integer(item["version"], 1, MAX_VERSION, "version", f"{where}.version")
        weight = _integer(item["weight"], 0, TOTAL, "weight", f"{where}.weight")
        entries.append(SplitEntry(version, weight))
    if len({e.version for e in entries}) != len(entries):
        raise ValidationError(f"{field} names version {entries[0].version} twice", field=field)
    total = sum(e.weight for e in entries)
    if total != TOTAL:
        raise ValidationError(f"the weights of {field} must sum to {TOTAL}, not {total}", field=field)
    return TrafficSplit(tuple(entries))


def parse_request(body: object) -> TrafficSplit:
    """A ``PUT .../traffic`` body: exactly ``{"split": [...]}``."""
    if not isinstance(body, dict):
        raise ValidationError('the request body must be a JSON object: {"split": [{"version": N, "weight": W}]}')
    unknown = sorted(set(body) - {"split"})
    if unknown:
        raise ValidationError(f"unknown field {unknown[0]!r}", field=unknown[0])
    if "split" not in body:
        raise ValidationError("split is required", field="split")
    return parse_entries(body["split"])


class SplitRefused(Exception):
    """A well-formed split the function's versions do not allow; ``status``: 404 (no such version) or 409."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def check_versions(split: TrafficSplit, kept: Sequence[int], function: str) -> int:
    """The current version (the newest of KEPT) after checking SPLIT against it; SplitRefused otherwise.

    Every version must be kept (404 names the kept ones); the current one must be in the split (409), as a
    split only adds a second version beside what is deployed (to move all traffic, roll back).
    """
    if not kept:
        raise SplitRefused(409, f"function {function!r} has no deployed version yet")
    current = kept[-1]
    for entry in split.entries:
        if entry.version not in kept:
            listed = ", ".join(str(v) for v in kept)
            raise SplitRefused(404, f"function {function!r} has no version {entry.version} (kept: {listed})")
    if current not in split.versions():
        raise SplitRefused(409, f"a split must include the current version {current} of function {function!r} "
                                "(to move all traffic to another version, roll back to it)")
    return current


class WeightedRoundRobin:
    """Smooth weighted round robin (as nginx shares upstreams): deterministic, evenly interleaved.

    Each pick adds every entry's weight to its running score, takes the highest score (the first on a tie)
    and subtracts the total from it. Over any 100 consecutive picks each entry is chosen exactly its weight
    times. Not locked: it is used on one event loop.
    """

    def __init__(self, weights: Iterable[tuple[int, int]]) -> None:
        self._items = [(key, weight) for key, weight in weights if weight > 0]
        if not self._items:
            raise ValueError("a round robin needs a positive weight")
        self._total = sum(w for _, w in self._items)
        self._scores = [0] * len(self._items)

    def pick(self) -> int:
        best = 0
        for i, (_, weight) in enumerate(self._items):
            self._scores[i] += weight
            if self._scores[i] > self._scores[best]:
                best = i
        self._scores[best] -= self._total
        return self._items[best][0]


#: Kubernetes: the label on the Deployment, Service and code Secret that run a split's other version,
#: naming the Function they serve (they are named ``other_version_name``, not after the Function).
LABEL_SPLIT_OF = "sless.dev/split-of"


def other_version_name(function: str) -> str:
    """Kubernetes: the Deployment, Service and pod label of a split's other version.

    Always longer than a function name may be (``NAME_MAX``), so never another function's name: ``<f>-split``
    would be the name of a function ``<f>-split`` too, and the two would share objects and pods. At most
    55 characters (a Service name and a label value take 63).
    """
    digest = hashlib.sha256(function.encode()).hexdigest()
    return f"{function}-split-{digest[: max(8, NAME_MAX + 1 - len(function) - len('-split-'))]}"
