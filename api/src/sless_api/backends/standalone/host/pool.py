"""How a scaled function's calls are shared among its processes, and how many processes its demand needs.

The rule is the Kubernetes activator's, on one host: a call goes to the process with the fewest calls in flight
(ties: the oldest process, so that when demand falls the newest ones get no calls and idle out); another
process is wanted while every running one has its ``target`` calls in flight, up to ``max`` (demand-driven:
about ceil(calls in flight and waiting / target) processes, at least ``min``). A process beyond what the
demand of the last ``idle_sec`` needed is surplus: the supervisor retires it, and it finishes its calls first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar


class Busy(Protocol):
    """What the pool reads of a process: the calls it has in flight."""

    inflight: int


P = TypeVar("P", bound=Busy)


@dataclass(frozen=True)
class Scale:
    """A function's scaling on `sless up` (``scale`` and its ``max_concurrency``, which is per process there)."""

    min: int = 0
    max: int = 1
    #: calls in flight per process before another is wanted
    target: int = 1
    #: calls one process takes at once (a scaled function's ``max_concurrency``); 0: no limit
    limit: int = 0

    @property
    def per_process(self) -> int:
        """Calls in flight that make a process busy: its ``target``, or its limit when that is lower (a full
        process asks for another as a busy one does, as waiting calls count as demand on Kubernetes)."""
        return min(self.target, self.limit) if self.limit > 0 else self.target

    def wanted(self, demand: int) -> int:
        """Processes for DEMAND calls (in flight and waiting): ceil(demand / per_process), between min and max."""
        return max(self.min, min(self.max, math.ceil(demand / max(1, self.per_process))))


def pick(procs: Sequence[P], below: int) -> P | None:
    """The process with the fewest calls in flight among those with fewer than BELOW (0: no bound); ties go to
    the first (the oldest). None: every process has BELOW or more."""
    best: P | None = None
    for proc in procs:
        if (below <= 0 or proc.inflight < below) and (best is None or proc.inflight < best.inflight):
            best = proc
    return best


@dataclass
class DemandMemory:
    """When the function last needed each number of processes, so that scale-in waits ``idle_sec`` after the
    demand for a process went away (one short lull does not stop a process the next burst would start again)."""

    #: ``needed_at[k]``: the last time k + 1 processes were needed (monotonic seconds)
    needed_at: list[float] = field(default_factory=list)

    def note(self, processes: int, now: float) -> None:
        """PROCESSES were needed at NOW (so were fewer)."""
        if processes > len(self.needed_at):
            self.needed_at.extend([now] * (processes - len(self.needed_at)))
        for k in range(processes):
            self.needed_at[k] = now

    def needed_within(self, since: float) -> int:
        """The most processes needed at or after SINCE."""
        return sum(1 for at in self.needed_at if at >= since)
