"""The spans of a Function's reconcile, recorded after the fact in the trace of the deploy that asked for it.

The API writes the context of its ``deploy <namespace>/<function>`` request on the Function with the change
(annotation ``sless.dev/traceparent``). The operator keeps what it saw of that change in ``status.trace``: the
annotation it belongs to, when the operator first saw the change, when the build (or compile) Job was created and
seen ending, when the Deployment was written; timestamps are the operator's own clock in nanoseconds since the
epoch (the Job's and Deployment's own timestamps have one-second resolution). Once the change ends Ready or Failed,
``reconcile <namespace>/<function>`` is emitted with its children ``build`` (or ``fetch``: code the pods fetch,
with nothing to build) and ``rollout``, and ``status.trace.emitted`` set in the same status write, so neither a
restart nor a later event emits them again. Kept in the status rather than in memory so a restart in the middle
of a build still knows when the change began.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from typing import Any

from sless_core import crd, tracing
from sless_core.models import Phase

log = logging.getLogger(__name__)
ENDED = (Phase.READY.value, Phase.FAILED.value)


@dataclass(frozen=True)
class PlannedSpan:
    """One span to emit: NAME from START to END (ns), ERROR saying why it failed (None: it did not)."""

    name: str
    start: int
    end: int
    error: str | None = None


@dataclass(frozen=True)
class DeployTrace:
    """What the operator saw of one traced change (``status.trace``)."""

    traceparent: str
    seen: int  # the first reconcile of the change
    build_start: int = 0  # the build (or compile) Job created or found running for it
    build_end: int = 0  # that Job seen ending
    rollout_start: int = 0  # the Deployment written with the change
    fetched: bool = False  # the pods fetch the code: nothing to build (a ``fetch`` instead of a ``build``)
    emitted: bool = False

    @staticmethod
    def of(meta: dict[str, Any], old_status: dict[str, Any], now: int) -> DeployTrace | None:
        """The record of the change META's annotation belongs to: the one in OLD_STATUS when it is that one's,
        else a new one seen NOW; None for a Function whose change is not traced."""
        traceparent = str((meta.get("annotations") or {}).get(crd.ANNOTATION_TRACEPARENT) or "")
        if not traceparent:
            return None
        kept = old_status.get("trace")
        if isinstance(kept, dict) and kept.get("traceparent") == traceparent:
            try:
                return DeployTrace(traceparent, int(kept.get("seen") or now), int(kept.get("build_start") or 0),
                                   int(kept.get("build_end") or 0), int(kept.get("rollout_start") or 0),
                                   bool(kept.get("fetched")), bool(kept.get("emitted")))  # fmt: skip
            except (TypeError, ValueError):
                pass  # edited by hand: start again
        return DeployTrace(traceparent, now)

    def step(self, build: str, rolling_out: bool, fetched: bool, now: int) -> DeployTrace:
        """The record after a reconcile that found the build BUILD ("built" | "building" | "failed") and, when
        ROLLING_OUT, wrote or watched the Deployment; FETCHED: the pods fetch the code."""
        if self.emitted:
            return self
        marks = replace(self, fetched=fetched)
        if build == "building" and not marks.build_start:
            marks = replace(marks, build_start=now)
        if build in ("built", "failed") and marks.build_start and not marks.build_end:
            marks = replace(marks, build_end=now)
        if build == "built" and rolling_out and not marks.rollout_start:
            marks = replace(marks, rollout_start=now)
        return marks

    def to_status(self) -> dict[str, Any]:
        return asdict(self)

    def spans(self, end: int, phase: str, message: str) -> tuple[PlannedSpan, list[PlannedSpan]]:
        """The reconcile span (ending at END in PHASE, MESSAGE saying why when Failed) and its children, each
        inside its parent's time."""
        error = (message or "failed") if phase == Phase.FAILED.value else None
        end = max(end, self.seen)

        def within(start: int, stop: int) -> tuple[int, int]:
            start = min(max(start, self.seen), end)
            return start, min(max(stop, start), end)

        children = []
        if self.build_start:
            start, stop = within(self.build_start, self.build_end or end)
            failed = error if self.rollout_start == 0 and error is not None else None
            children.append(PlannedSpan("build", start, stop, failed))
        elif self.fetched:
            start, stop = within(self.seen, self.rollout_start or end)
            children.append(PlannedSpan("fetch", start, stop))
        if self.rollout_start:
            start, stop = within(self.rollout_start, end)
            children.append(PlannedSpan("rollout", start, stop, error))
        return PlannedSpan("reconcile", self.seen, end, error), children


def emit(trace: DeployTrace, namespace: str, name: str, end: int, phase: str, message: str) -> None:
    """Send the spans of TRACE's change, which ended at END in PHASE (the operator's tracer must be on)."""
    root, children = trace.spans(end, phase, message)
    attributes = {"sless_namespace": namespace, "sless_function": name, "sless_phase": phase}
    parent = tracing.recorded(f"reconcile {namespace}/{name}", root.start, root.end,
                              {tracing.TRACEPARENT: trace.traceparent}, error=root.error, **attributes)  # fmt: skip
    for child in children:
        tracing.recorded(child.name, child.start, child.end, parent, error=child.error, **attributes)
    log.debug("traced the reconcile of %s/%s (%s)", namespace, name, phase)
