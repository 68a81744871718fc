"""Where ``sless-events`` listens and which broker and database it uses (see :mod:`.service` for the table)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ServiceSettings:
    rabbitmq_url: str
    database_url: str
    host: str = "127.0.0.1"
    port: int = 8091

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ServiceSettings:
        source = os.environ if env is None else env
        rabbitmq = (source.get("SLESS_RABBITMQ_URL") or "").strip()
        if not rabbitmq:
            raise ValueError("SLESS_RABBITMQ_URL is required: the broker whose queues event triggers name")
        database = (source.get("SLESS_DATABASE_URL") or "").strip()
        if database.split(":", 1)[0].lower() not in ("postgresql", "postgres"):
            raise ValueError("SLESS_DATABASE_URL must be a postgresql:// URL: the invocation log and the "
                             "idempotency store that all dispatcher replicas share")
        raw_port = (source.get("SLESS_EVENTS_PORT") or "").strip() or str(cls.port)
        if not raw_port.isdigit() or not 0 < int(raw_port) < 65536:
            raise ValueError(f"SLESS_EVENTS_PORT must be a TCP port, got {raw_port!r}")
        host = (source.get("SLESS_EVENTS_HOST") or "").strip() or cls.host
        return cls(rabbitmq_url=rabbitmq, database_url=database, host=host, port=int(raw_port))
