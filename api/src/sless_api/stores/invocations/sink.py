"""The storage side of the invocation log: write batches, read pages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sless_api.stores.invocations.model import Invocation

COLUMNS = (
    "namespace",
    "function",
    "method",
    "path",
    "status",
    "duration_ms",
    "request_bytes",
    "response_bytes",
    "trigger",
    "error",
    "started_at",
    "request_id",
    "cold",
    "queue_ms",
    "start_ms",
    "handler_ms",
    "version",
    "attempt",
)
#: What is written: the columns read back with every record, and a call's output (read on its own: ``get_output``).
WRITE_COLUMNS = (*COLUMNS, "output")


class Sink(Protocol):
    """Where invocation records end up. Called from one writer thread plus readers."""

    def write_batch(self, batch: Sequence[Invocation]) -> None:
        """Insert BATCH in one transaction; raise on failure (the log retries and counts)."""

    def record_once(self, key: str, inv: Invocation) -> bool:
        """Store INV now unless a record was stored under KEY before (by any process sharing the store): the key's
        claim and the record in one transaction. True when this call stored it; raise on failure."""

    def list(self, namespace: str, function: str | None, limit: int, before_id: int | None,
             since: float | None = None) -> list[Invocation]:
        """Up to LIMIT records of the function (or the whole namespace), newest first,
        only ids below BEFORE_ID and records started at or after SINCE (epoch seconds) when given."""

    def get(self, namespace: str, function: str, ident: int) -> Invocation | None:
        """The record ``ident`` when it belongs to that function of that namespace, else None."""

    def get_output(self, namespace: str, function: str, ident: int) -> dict[str, Any] | None:
        """The output kept with record ``ident`` of that function (``{"lines", "truncated"}``), else None."""

    def find_request(self, namespace: str, function: str, request_id: str) -> Invocation | None:
        """The newest record of that function with that request id, else None."""

    def close(self) -> None:
        """Release connections."""
