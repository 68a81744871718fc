"""Where ``sless-events`` listens and which broker and database it uses (see :mod:`.service` for the table)."""

from __future__ import annotations

from dataclasses import dataclass

from sless_api.config import ApiConfig
from sless_core.envconfig import ConfigError


@dataclass(frozen=True)
class ServiceSettings:
    rabbitmq_url: str
    database_url: str
    host: str = "127.0.0.1"
    port: int = 8091

    @classmethod
    def from_config(cls, config: ApiConfig) -> ServiceSettings:
        """What this process needs beyond the API's config: a broker, and a database all replicas share."""
        if not config.rabbitmq_url:
            raise ConfigError("SLESS_RABBITMQ_URL is required: the broker whose queues event triggers name")
        database = config.database_url
        if database.split(":", 1)[0].lower() not in ("postgresql", "postgres"):
            raise ConfigError("SLESS_DATABASE_URL must be a postgresql:// URL: the invocation log and the "
                              "idempotency store that all dispatcher replicas share")
        return cls(rabbitmq_url=config.rabbitmq_url, database_url=database, host=config.probes.host,
                   port=config.probes.port)
