"""Functions, triggers and jobs as a backend holds them, and their REST shape (``to_api``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sless_core.models import FunctionSpec, JobSpec, TriggerSpec


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


@dataclass
class FunctionRecord:
    namespace: str
    spec: FunctionSpec
    phase: str = "Pending"
    message: str = "waiting for code: upload a zip"
    code_hash: str | None = None
    image: str | None = None
    created_at: float = field(default_factory=time.time)
    last_built_at: float | None = None

    def to_api(self) -> dict[str, Any]:
        body = self.spec.to_dict()
        body.update(
            namespace=self.namespace,
            phase=self.phase,
            message=self.message,
            code_hash=self.code_hash,
            image=self.image,
            created_at=iso(self.created_at),
            last_built_at=iso(self.last_built_at),
        )
        return body


@dataclass
class TriggerRecord:
    namespace: str
    spec: TriggerSpec
    created_at: float = field(default_factory=time.time)
    last_fired_at: float | None = None
    message: str = ""

    def to_api(self, base_url: str = "") -> dict[str, Any]:
        body = self.spec.to_dict()
        body.update(namespace=self.namespace, created_at=iso(self.created_at),
                    last_fired_at=iso(self.last_fired_at), message=self.message)
        if self.spec.type == "http":
            # a path pattern's URL names its parameters as the trigger does: /fn/ns/fn/users/{id}
            body["url"] = f"{base_url}/fn/{self.namespace}/{self.spec.function}{self.spec.path or ''}"
        return body


@dataclass
class JobRecord:
    namespace: str
    spec: JobSpec
    phase: str = "Pending"
    message: str = ""
    started_at: float | None = None
    completed_at: float | None = None
    created_at: float = field(default_factory=time.time)

    def to_api(self) -> dict[str, Any]:
        body = self.spec.to_dict()
        body.update(namespace=self.namespace, phase=self.phase, message=self.message,
                    started_at=iso(self.started_at), completed_at=iso(self.completed_at),
                    created_at=iso(self.created_at))
        return body
