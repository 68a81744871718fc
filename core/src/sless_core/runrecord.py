"""A finished one-shot run on Kubernetes (a FunctionJob's run, a cron firing) as the operator hands it to the API.

On Kubernetes only the API and ``sless-events`` write invocation records, and only the operator sees a run's Job
end and may read its pod's log. So the operator leaves the finished run in its owner's status (``status.runRecord``
of the FunctionJob or the cron Trigger): which Job, how it ended, when, the function's version and the lines the
pod printed (bounded as a call's output is, before the pod and its log go). Every API process watches those
objects and stores the record; the Job's uid is the record's key, claimed once in the invocation store, so any
number of API replicas record each run exactly once.

The shape is shared here so both sides read one definition; :func:`parse` treats a status as untrusted (anyone
who may write the status subresource could have written it) and returns None for anything malformed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: The status field of a FunctionJob or a cron Trigger that holds its last finished run.
STATUS_FIELD = "runRecord"
#: Bytes of text and lines a run keeps, the same bounds as a call's output (runtimes/README.md).
MAX_TEXT_BYTES = 16 * 1024
MAX_LINES = 1024
MAX_ERROR_CHARS = 2000
#: A pod's log does not tell stdout from stderr: its lines are "log", as a live call's lines from a pod are.
STREAMS = ("stdout", "stderr", "log")
TRIGGERS = ("job", "cron")


@dataclass(frozen=True)
class RunRecord:
    """One finished run. ``lines`` are ``(stream, text, ts)``; ``ts`` in seconds since the epoch."""

    uid: str  # the Job's uid: the record's key
    job: str  # the Job's name
    function: str
    trigger: str  # "job" | "cron"
    path: str  # what the record shows as its path: /jobs/<name> or /triggers/<name>
    start_time: str  # RFC 3339, the Job's start
    completion_time: str  # RFC 3339, its end (the time it was seen to fail, when it failed)
    succeeded: bool
    error: str = ""
    version: int | None = None
    lines: tuple[tuple[str, str, float], ...] = field(default_factory=tuple)
    truncated: bool = False

    def to_status(self) -> dict[str, Any]:
        """The status field's value: every key always present, so a merge patch replaces the previous run whole."""
        return {
            "uid": self.uid, "job": self.job, "function": self.function, "trigger": self.trigger, "path": self.path,
            "startTime": self.start_time, "completionTime": self.completion_time, "succeeded": self.succeeded,
            "error": self.error, "version": self.version, "truncated": self.truncated,
            "lines": [{"stream": s, "text": t, "ts": round(ts, 3)} for s, t, ts in self.lines],
        }  # fmt: skip

    @property
    def started_at(self) -> float:
        """The start in seconds since the epoch (the end when the start is unknown)."""
        return epoch(self.start_time) or epoch(self.completion_time) or 0.0

    @property
    def duration_ms(self) -> float:
        start, end = epoch(self.start_time), epoch(self.completion_time)
        return max(0.0, (end - start) * 1000) if start is not None and end is not None else 0.0


def epoch(value: str) -> float | None:
    """An RFC 3339 time (``2026-05-01T10:00:00Z``) in seconds since the epoch, None when it is not one."""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return None
    return parsed.timestamp() if parsed.tzinfo is not None else None


def bounded_lines(lines: list[tuple[str, str, float]]) -> tuple[tuple[tuple[str, str, float], ...], bool]:
    """LINES within the caps: once a line does not fit, it and the later ones are left out (``truncated``)."""
    kept: list[tuple[str, str, float]] = []
    size = 0
    for line in lines:
        size += len(line[1].encode("utf-8", "replace"))
        if size > MAX_TEXT_BYTES or len(kept) >= MAX_LINES:
            return tuple(kept), True
        kept.append(line)
    return tuple(kept), False


def parse(status: object) -> RunRecord | None:
    """The ``runRecord`` of an object's STATUS, or None when there is none or it is not well formed."""
    if not isinstance(status, dict):
        return None
    raw = status.get(STATUS_FIELD)
    if not isinstance(raw, dict):
        return None
    texts = {key: raw.get(key) for key in ("uid", "job", "function", "trigger", "path", "startTime",
                                           "completionTime", "error")}  # fmt: skip
    if not all(isinstance(value, str) for value in texts.values()):
        return None
    version, succeeded, truncated = raw.get("version"), raw.get("succeeded"), raw.get("truncated")
    if not isinstance(succeeded, bool) or not isinstance(truncated, bool):
        return None
    if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 0):
        return None
    if not texts["uid"] or not texts["function"] or texts["trigger"] not in TRIGGERS:
        return None
    if epoch(str(texts["completionTime"])) is None:
        return None
    lines = _lines(raw.get("lines"))
    if lines is None:
        return None
    kept, cut = bounded_lines(lines)
    return RunRecord(uid=str(texts["uid"]), job=str(texts["job"]), function=str(texts["function"]),
                     trigger=str(texts["trigger"]), path=str(texts["path"]), start_time=str(texts["startTime"]),
                     completion_time=str(texts["completionTime"]), succeeded=succeeded,
                     error=str(texts["error"])[-MAX_ERROR_CHARS:], version=version, lines=kept,
                     truncated=truncated or cut)  # fmt: skip


def _lines(value: object) -> list[tuple[str, str, float]] | None:
    if not isinstance(value, list) or len(value) > MAX_LINES:
        return None
    lines: list[tuple[str, str, float]] = []
    for item in value:
        if not isinstance(item, dict):
            return None
        stream, text, ts = item.get("stream"), item.get("text"), item.get("ts")
        if stream not in STREAMS or not isinstance(text, str):
            return None
        if not isinstance(ts, int | float) or isinstance(ts, bool) or not 0 <= ts < 1e11:
            return None
        lines.append((str(stream), text, float(ts)))
    return lines
