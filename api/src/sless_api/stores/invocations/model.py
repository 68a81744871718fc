"""One invocation record: what the invoke proxy (and cron/event/job triggers) observed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sless_api.domain import calloutput

#: Longest stored error text and path; records are diagnostics, not payload archives.
MAX_ERROR_CHARS = 2000
MAX_PATH_CHARS = 2048
_INT32 = 2**31 - 1
_INT64 = 2**63 - 1


@dataclass(slots=True)  # one is made per call on the invoke proxy's path: slots make that cheaper
class Invocation:
    """A finished invocation. ``id`` is set by the store when read back (keyset cursor)."""

    namespace: str
    function: str
    method: str
    path: str
    status: int
    duration_ms: float
    request_bytes: int
    response_bytes: int
    trigger: str
    error: str | None
    started_at: float  # seconds since the epoch
    request_id: str | None = None  # the call's X-Request-Id (accepted from the caller or made by the platform)
    #: A function process had to start for this call (None: unknown, e.g. it never reached a function).
    cold: bool | None = None
    #: Milliseconds waiting in the platform (not counting a start), waiting for a process to start, and in
    #: the handler as the runtime measured it; None where unknown.
    queue_ms: float | None = None
    start_ms: float | None = None
    handler_ms: float | None = None
    #: The function's version that answered (a traffic split shares calls between two); None where unknown.
    version: int | None = None
    #: Which attempt at the same work this was, from 1: an event's delivery (counted across redeliveries and
    #: restarts) or an asynchronous call's try; None for a call made once (HTTP, cron, a job).
    attempt: int | None = None
    #: What the call wrote before its answer, in the runtime's ``X-Sless-Output`` form (domain.calloutput),
    #: unchecked: the log's writer checks and decodes it off the call's path. Written, never read back here.
    output: bytes | None = None
    id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for the API: the three phases as one ``phases_ms`` object."""
        out = asdict(self)
        del out["output"]  # a call's lines have their own endpoint (``.../invocations/{id}/logs``)
        out["phases_ms"] = {"queue": out.pop("queue_ms"), "start": out.pop("start_ms"),
                            "handler": out.pop("handler_ms")}
        return out


#: A record as stored: the values of sink.COLUMNS in order, each within its column's range.
Row = tuple[str, str, str, str, int, float, int, int, str, str | None, float, str | None,
            bool | None, float | None, float | None, float | None, int | None, int | None]


def _text(value: object, limit: int) -> str:
    # PostgreSQL text cannot hold NUL; the cap keeps one runaway error from bloating the table.
    if type(value) is str and len(value) <= limit and "\x00" not in value:
        return value  # the common case, kept cheap: this runs once per field per record
    return str(value).replace("\x00", "")[:limit]


def _int(value: object, low: int, high: int) -> int:
    if type(value) is int and low <= value <= high:
        return value
    if not isinstance(value, int | float | str):
        return 0
    try:
        number = int(value)
    except (ValueError, OverflowError):
        return 0
    return max(low, min(high, number))


def _float(value: object, low: float, high: float) -> float:
    if type(value) is float and low <= value <= high:
        return value  # the common case (NaN and infinities fail the comparison and are caught below)
    if not isinstance(value, int | float | str):
        return 0.0
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return 0.0
    return number if math.isfinite(number) and low <= number <= high else 0.0


def sanitized_row(inv: Invocation) -> Row:
    """The values every store accepts: bounded text without NUL, numbers in column range.

    Done by the writer, not by ``record()``, so the caller's hot path stays a queue append;
    done at all so that one odd record cannot make a whole batch fail again and again.
    """
    row = _plain_row(inv)
    if row is not None:
        return row
    return (
        _text(inv.namespace, 253),
        _text(inv.function, 253),
        _text(inv.method, 16),
        _text(inv.path, MAX_PATH_CHARS),
        _int(inv.status, -_INT32, _INT32),
        _float(inv.duration_ms, 0.0, 1e12),
        _int(inv.request_bytes, 0, _INT64),
        _int(inv.response_bytes, 0, _INT64),
        _text(inv.trigger, 32),
        None if inv.error is None else _text(inv.error, MAX_ERROR_CHARS),
        _float(inv.started_at, 0.0, 1e11),
        None if inv.request_id is None else _text(inv.request_id, 128),
        None if inv.cold is None else bool(inv.cold),
        _optional_ms(inv.queue_ms),
        _optional_ms(inv.start_ms),
        _optional_ms(inv.handler_ms),
        None if inv.version is None else _int(inv.version, 0, _INT32),
        None if inv.attempt is None else _int(inv.attempt, 0, _INT32),
    )


def _plain_row(inv: Invocation) -> Row | None:
    """The row as it is when every value is already what its column takes (a proxied call's record, nearly
    always): one check of it all instead of a function call per field. None: some value needs sanitizing."""
    namespace, function, method, path, trigger = inv.namespace, inv.function, inv.method, inv.path, inv.trigger
    error, request_id, status, duration, started = inv.error, inv.request_id, inv.status, inv.duration_ms, \
        inv.started_at
    texts = (namespace, function, method, path, trigger, error or "", request_id or "")
    if not (all(type(t) is str for t in texts) and len(namespace) <= 253 and len(function) <= 253
            and len(method) <= 16 and len(path) <= MAX_PATH_CHARS and len(trigger) <= 32
            and (error is None or len(error) <= MAX_ERROR_CHARS) and (request_id is None or len(request_id) <= 128)
            and "\x00" not in "".join(texts)):
        return None
    numbers_plain = (type(status) is int and -_INT32 <= status <= _INT32
                     and type(duration) is float and 0.0 <= duration <= 1e12
                     and type(started) is float and 0.0 <= started <= 1e11
                     and type(inv.request_bytes) is int and 0 <= inv.request_bytes <= _INT64
                     and type(inv.response_bytes) is int and 0 <= inv.response_bytes <= _INT64
                     and (inv.cold is None or type(inv.cold) is bool)
                     and all(v is None or (type(v) is float and 0.0 <= v <= 1e12)
                             for v in (inv.queue_ms, inv.start_ms, inv.handler_ms))
                     and all(v is None or (type(v) is int and 0 <= v <= _INT32) for v in (inv.version, inv.attempt)))
    if not numbers_plain:
        return None
    return (namespace, function, method, path, status, duration, inv.request_bytes, inv.response_bytes, trigger,
            error, started, request_id, inv.cold, inv.queue_ms, inv.start_ms, inv.handler_ms, inv.version,
            inv.attempt)


def output_text(inv: Invocation) -> str | None:
    """The record's output as its column keeps it: checked and decoded (None when it has none, or none that
    holds to the contract)."""
    if inv.output is None:
        return None
    decoded = calloutput.decode(inv.output)
    return None if decoded is None else calloutput.stored(decoded)


def _optional_ms(value: object) -> float | None:
    return None if value is None else _float(value, 0.0, 1e12)


def from_row(row: Sequence[Any]) -> Invocation:
    """An Invocation from a database row ``(id, *COLUMNS)``."""
    (ident, namespace, function, method, path, status, duration_ms, request_bytes, response_bytes,
     trigger, error, started_at, request_id, cold, queue_ms, start_ms, handler_ms, version, attempt) = row  # fmt: skip
    return Invocation(
        namespace=namespace,
        function=function,
        method=method,
        path=path,
        status=int(status),
        duration_ms=float(duration_ms),
        request_bytes=int(request_bytes),
        response_bytes=int(response_bytes),
        trigger=trigger,
        error=error,
        started_at=float(started_at),
        request_id=request_id,
        cold=None if cold is None else bool(cold),
        queue_ms=None if queue_ms is None else float(queue_ms),
        start_ms=None if start_ms is None else float(start_ms),
        handler_ms=None if handler_ms is None else float(handler_ms),
        version=None if version is None else int(version),
        attempt=None if attempt is None else int(attempt),
        id=int(ident),
    )
