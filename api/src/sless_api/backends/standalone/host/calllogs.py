"""What each call of a standalone function wrote, kept in memory for ``GET .../invocations/{id}/logs``.

The supervisor hands every tagged line of a function's output here (see sless_core.calllines), filed
under the function's key and the call's request id, so one function's output can never show up under
another function's (or tenant's) calls, whatever it prints. Bounded twice: a call keeps at most
``max_call_bytes`` of text (then ``truncated``), and the store keeps the most recent ``max_calls``
calls within ``max_total_bytes`` (older calls are forgotten first). Memory only: `sless up` is one
process, and a call's output is a diagnostic, not state; after a restart older calls have no lines.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sless_core.calllines import TAG, parse_line

#: Bytes of text one call keeps (UTF-8), then its later lines are dropped and it says ``truncated``.
DEFAULT_CALL_BYTES = 64 * 1024
DEFAULT_MAX_CALLS = 5000
DEFAULT_TOTAL_BYTES = 64 * 1024 * 1024


@dataclass
class _Call:
    lines: list[dict[str, Any]] = field(default_factory=list)
    size: int = 0
    truncated: bool = False


class CallLogStore:
    """Lines per (function key, request id); all methods run on the supervisor's event loop."""

    def __init__(self, max_call_bytes: int = DEFAULT_CALL_BYTES, max_calls: int = DEFAULT_MAX_CALLS,
                 max_total_bytes: int = DEFAULT_TOTAL_BYTES) -> None:
        if max_call_bytes < 1 or max_calls < 1 or max_total_bytes < max_call_bytes:
            raise ValueError("limits must be positive, and the total at least one call's")
        self.max_call_bytes = max_call_bytes
        self.max_calls = max_calls
        self.max_total_bytes = max_total_bytes
        self._calls: OrderedDict[tuple[str, str], _Call] = OrderedDict()
        self._total = 0

    def add(self, key: str, call_id: str, stream: str, text: str, ts: float) -> None:
        """One line of call ``call_id`` of function ``key``."""
        ident = (key, call_id)
        call = self._calls.get(ident)
        if call is None:
            call = self._calls[ident] = _Call()
        if call.truncated:
            return
        size = len(text.encode("utf-8", "replace"))
        if call.size + size > self.max_call_bytes:
            call.truncated = True
            return
        call.lines.append({"stream": stream, "text": text, "ts": round(ts, 3)})
        call.size += size
        self._total += size
        self._evict()

    def get(self, key: str, call_id: str) -> dict[str, Any] | None:
        """``{"lines": [...], "truncated": bool}`` of a call, or None when nothing of it is kept."""
        call = self._calls.get((key, call_id))
        if call is None:
            return None
        return {"lines": list(call.lines), "truncated": call.truncated}

    def __len__(self) -> int:
        return len(self._calls)

    @property
    def total_bytes(self) -> int:
        return self._total

    def _evict(self) -> None:
        while len(self._calls) > self.max_calls or self._total > self.max_total_bytes:
            _, oldest = self._calls.popitem(last=False)
            self._total -= oldest.size


_TAG = TAG.encode()


class LineRouter:
    """Splits one output pipe of one function process into lines and files the tagged ones.

    Fed the raw chunks the supervisor reads (which also go to the function's log file unchanged);
    a line cut between two chunks waits for its end, one longer than a call may keep is routed as is.
    """

    def __init__(self, store: CallLogStore, key: str, stream: str) -> None:
        self.store = store
        self.key = key
        self.stream = stream
        self._partial = b""

    def feed(self, chunk: bytes, ts: float) -> None:
        data = self._partial + chunk if self._partial else chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > self.store.max_call_bytes + 256:
            lines.append(self._partial)
            self._partial = b""
        for raw in lines:
            if raw.startswith(_TAG):  # most output of a busy function is tagged; untagged lines cost nothing
                self._route(raw, ts)

    def finish(self, ts: float) -> None:
        """The pipe ended: a last line without a newline still counts."""
        if self._partial.startswith(_TAG):
            self._route(self._partial, ts)
        self._partial = b""

    def _route(self, raw: bytes, ts: float) -> None:
        call_id, text = parse_line(raw.decode("utf-8", "replace").rstrip("\r"))
        if call_id is not None:
            self.store.add(self.key, call_id, self.stream, text, ts)
