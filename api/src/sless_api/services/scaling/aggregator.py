"""The load of each function: the sum of the latest snapshot of every live reporter.

A reporter (one API or event process) sends its whole snapshot each time; a new one replaces its previous one,
and a snapshot not renewed within its ttl expires, so the counts of a process that died vanish by themselves.
Totals are kept up to date on each change (a read is a dictionary look-up, whatever the number of reporters).
Not thread-safe: the scaler uses it from its one event loop.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

#: (namespace, function)
FunctionKey = tuple[str, str]


@dataclass(frozen=True)
class Load:
    """Calls of one function: served by a replica now, and waiting for one."""

    inflight: int = 0
    waiting: int = 0

    @property
    def total(self) -> int:
        return self.inflight + self.waiting

    @property
    def active(self) -> bool:
        return self.total > 0


IDLE = Load()


class TooManyReporters(Exception):
    """A new reporter would pass the bound of live reporters."""


@dataclass
class _Snapshot:
    expires_at: float
    loads: dict[FunctionKey, Load]


class LoadAggregator:
    """Snapshots by reporter, and their sums by function."""

    def __init__(self, max_reporters: int = 1000, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_reporters = max_reporters
        self._clock = clock
        self._reporters: dict[str, _Snapshot] = {}
        self._totals: dict[FunctionKey, Load] = {}
        # (expires_at, reporter): stale entries (a reporter that renewed since) are skipped when popped.
        self._expiries: list[tuple[float, str]] = []

    def report(self, reporter: str, loads: Mapping[FunctionKey, Load], ttl_sec: float) -> set[FunctionKey]:
        """Replace REPORTER's snapshot with LOADS, valid for TTL_SEC; the functions whose activity changed
        (idle <-> active). Zero loads are dropped. :class:`TooManyReporters` for a new reporter past the bound."""
        changed = self.expire()
        now = self._clock()
        if reporter not in self._reporters and len(self._reporters) >= self.max_reporters:
            raise TooManyReporters(f"{len(self._reporters)} reporters are live, the most this scaler keeps")
        kept = {key: load for key, load in loads.items() if load.active}
        old = self._reporters.get(reporter)
        touched = set(kept)
        if old is not None:
            touched |= old.loads.keys()
        before = {key: self.load(key).active for key in touched}
        if old is not None:
            self._apply(old.loads, -1)
        self._apply(kept, 1)
        expires_at = now + ttl_sec
        self._reporters[reporter] = _Snapshot(expires_at, kept)
        heapq.heappush(self._expiries, (expires_at, reporter))
        changed |= {key for key, was in before.items() if was != self.load(key).active}
        return changed

    def forget(self, reporter: str) -> set[FunctionKey]:
        """Drop REPORTER's snapshot now; the functions that became idle."""
        old = self._reporters.pop(reporter, None)
        if old is None:
            return set()
        self._apply(old.loads, -1)
        return {key for key in old.loads if not self.load(key).active}

    def expire(self) -> set[FunctionKey]:
        """Drop the snapshots past their ttl; the functions that became idle."""
        now = self._clock()
        changed: set[FunctionKey] = set()
        while self._expiries and self._expiries[0][0] <= now:
            expires_at, reporter = heapq.heappop(self._expiries)
            snapshot = self._reporters.get(reporter)
            if snapshot is not None and snapshot.expires_at == expires_at:
                changed |= self.forget(reporter)
        return changed

    def next_expiry(self) -> float | None:
        """When (on the clock) the earliest snapshot expires, if any is live (maybe a renewed one's old time)."""
        return self._expiries[0][0] if self._expiries else None

    def load(self, key: FunctionKey) -> Load:
        """The sum of the live snapshots for KEY (call :meth:`expire` first for an up-to-date answer)."""
        return self._totals.get(key, IDLE)

    @property
    def reporters(self) -> int:
        return len(self._reporters)

    def functions(self) -> Iterable[tuple[FunctionKey, Load]]:
        """Every function with a non-zero load."""
        return list(self._totals.items())

    def _apply(self, loads: Mapping[FunctionKey, Load], sign: int) -> None:
        for key, load in loads.items():
            now = self._totals.get(key, IDLE)
            summed = Load(now.inflight + sign * load.inflight, now.waiting + sign * load.waiting)
            if summed.active:
                self._totals[key] = summed
            else:
                self._totals.pop(key, None)
