"""One asynchronous call: what was asked, where it stands, what came back."""

from __future__ import annotations

import base64
import re
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sless_api.domain.records import iso
from sless_api.services.asynccalls.callback import shown_url

_ID = re.compile(r"[0-9a-f]{32}")


class CallState(StrEnum):
    QUEUED = "queued"  # waiting for its first attempt or for its next one (after a backoff)
    RUNNING = "running"  # claimed by a runner whose lease has not ended
    SUCCEEDED = "succeeded"  # the function answered below 500
    DEAD = "dead"  # attempts exhausted, or the function is gone: the dead-letter record


FINISHED = frozenset({CallState.SUCCEEDED, CallState.DEAD})


def new_call_id() -> str:
    return uuid.uuid4().hex


def is_call_id(value: str) -> bool:
    return bool(_ID.fullmatch(value))


@dataclass
class AsyncCall:
    id: str
    namespace: str
    function: str
    method: str
    path: str  # with the query string, as the function gets it
    headers: list[tuple[str, str]]
    body: bytes
    request_id: str
    created_at: float
    state: CallState = CallState.QUEUED
    attempts: int = 0
    next_attempt_at: float = 0.0
    lease_owner: str = ""
    lease_until: float = 0.0
    result_status: int | None = None
    result_headers: list[tuple[str, str]] = field(default_factory=list)
    result_body: bytes = b""
    result_truncated: bool = False
    error: str | None = None
    finished_at: float | None = None
    callback_url: str | None = None  # checked when the call was submitted, and again when it is delivered
    callback_state: str | None = None  # None without a callback; "pending"; then "delivered: ..." / "failed: ..."

    def to_api(self, namespace_path: str) -> dict[str, Any]:
        """What the caller's tenant reads: never the request's headers (they may hold the caller's secrets)."""
        out: dict[str, Any] = {
            "id": self.id, "function": self.function, "method": self.method, "path": self.path,
            "state": self.state.value, "attempts": self.attempts, "request_id": self.request_id,
            "created_at": iso(self.created_at), "finished_at": iso(self.finished_at),
            "next_attempt_at": iso(self.next_attempt_at) if self.state == CallState.QUEUED else None,
            "error": self.error, "status_url": f"{namespace_path}/calls/{self.id}", "result": None,
            "callback": None,
        }  # fmt: skip
        if self.callback_url is not None:
            out["callback"] = {"url": shown_url(self.callback_url), "state": self.callback_state}
        if self.result_status is not None:
            result: dict[str, Any] = {"status": self.result_status, "headers": dict(self.result_headers),
                                      "truncated": self.result_truncated}
            try:
                result["body"] = self.result_body.decode("utf-8")
            except UnicodeDecodeError:
                result["body_base64"] = base64.b64encode(self.result_body).decode()
            out["result"] = result
        return out
