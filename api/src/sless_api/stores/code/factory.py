"""Pick the code store: S3 when ``SLESS_S3_ENDPOINT`` is set, else a folder."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sless_api.stores.code.base import CodeStore
from sless_api.stores.code.local import LocalCodeStore
from sless_api.stores.code.s3 import S3CodeStore
from sless_core.envconfig import EnvReader

DEFAULT_BUCKET = "sless"


@dataclass(frozen=True)
class StorageSettings:
    """Where code archives and build contexts live (``SLESS_S3_*``), read once with the API's config.

    ``endpoint`` is ``host:port`` (plain HTTP) or a URL whose scheme chooses ``http``/``https``; empty
    means the local folder (standalone).
    """

    endpoint: str = ""
    access_key: str = ""
    secret_key: str = field(default="", repr=False)
    bucket: str = DEFAULT_BUCKET
    region: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> StorageSettings:
        reader = EnvReader(env)
        return cls(
            endpoint=reader.text("SLESS_S3_ENDPOINT", ""),
            access_key=reader.text("SLESS_S3_ACCESS_KEY", ""),
            secret_key=reader.text("SLESS_S3_SECRET_KEY", ""),
            bucket=reader.text("SLESS_S3_BUCKET", DEFAULT_BUCKET),
            region=reader.optional("SLESS_S3_REGION"),
        )


def code_store(settings: StorageSettings, default_local_dir: str | Path) -> CodeStore:
    """The code store SETTINGS name: S3, or the local folder DEFAULT_LOCAL_DIR without an endpoint."""
    endpoint = settings.endpoint
    if not endpoint:
        return LocalCodeStore(default_local_dir)
    secure = False
    if endpoint.startswith("https://"):
        secure, endpoint = True, endpoint.removeprefix("https://")
    elif endpoint.startswith("http://"):
        endpoint = endpoint.removeprefix("http://")
    return S3CodeStore(endpoint.rstrip("/"), settings.access_key, settings.secret_key, settings.bucket,
                       secure=secure, region=settings.region)
