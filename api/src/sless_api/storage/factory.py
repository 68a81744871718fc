"""Pick the code store from the environment: S3 when SLESS_S3_ENDPOINT is set, else a folder."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sless_api.storage.base import CodeStore
from sless_api.storage.local import LocalCodeStore
from sless_api.storage.s3 import S3CodeStore

DEFAULT_BUCKET = "sless"


def store_from_env(environ: Mapping[str, str], default_local_dir: str | Path) -> CodeStore:
    """The code store the environment configures.

    ``SLESS_S3_ENDPOINT`` is ``host:port`` (plain HTTP) or a URL whose scheme chooses
    ``http``/``https``; ``SLESS_S3_ACCESS_KEY``, ``SLESS_S3_SECRET_KEY`` and
    ``SLESS_S3_BUCKET`` (default ``sless``) complete it. Without an endpoint the store is
    the local folder DEFAULT_LOCAL_DIR (standalone).
    """
    endpoint = environ.get("SLESS_S3_ENDPOINT", "").strip()
    if not endpoint:
        return LocalCodeStore(default_local_dir)
    secure = False
    if endpoint.startswith("https://"):
        secure, endpoint = True, endpoint.removeprefix("https://")
    elif endpoint.startswith("http://"):
        endpoint = endpoint.removeprefix("http://")
    return S3CodeStore(
        endpoint.rstrip("/"),
        environ.get("SLESS_S3_ACCESS_KEY", ""),
        environ.get("SLESS_S3_SECRET_KEY", ""),
        environ.get("SLESS_S3_BUCKET", "") or DEFAULT_BUCKET,
        secure=secure,
        region=environ.get("SLESS_S3_REGION") or None,
    )
