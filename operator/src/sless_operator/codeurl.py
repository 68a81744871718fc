"""Signed download URLs of function code, and the Secret that hands one to a function's pods.

A function pod holds no S3 credential: its ``fetch-code`` init container reads a URL signed for
exactly the Function's current code archive, a Go function's compiled binary (SigV4, computed
locally: no S3 request). The URL lives in the Secret ``sless-code-<fn>`` (referenced by the pod,
so renewing it restarts nothing) and is renewed when half its lifetime is gone; when it was
signed and for which key is kept in the Function's ``status.codeUrl``, so a restarted operator
renews nothing early. The operator only creates and patches that Secret: it never reads Secrets.
A Go function's compile Job gets a PUT URL signed for exactly its binary's key.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from sless_operator import manifests
from sless_operator.config import OperatorConfig
from sless_operator.kube import ApiError, Kube, api_path
from sless_operator.manifests import FunctionRef


class NoSigningKey(Exception):
    """The operator has no S3 key to sign code URLs with."""


class Signer:
    """Signs GET URLs of objects in the code bucket (a minio client that never connects to sign)."""

    def __init__(self, config: OperatorConfig) -> None:
        self.config = config
        self._client: Any = None

    def sign(self, key: str, ttl_sec: int) -> str:
        """A GET URL of KEY."""
        url: str = self._minio().presigned_get_object(self.config.s3_bucket, key, expires=timedelta(seconds=ttl_sec))
        return url

    def sign_put(self, key: str, ttl_sec: int) -> str:
        """A PUT URL of KEY: whoever holds it may write that one object, nothing else (a compile Job's binary)."""
        url: str = self._minio().presigned_put_object(self.config.s3_bucket, key, expires=timedelta(seconds=ttl_sec))
        return url

    def _minio(self) -> Any:
        config = self.config
        if not (config.s3_access_key and config.s3_secret_key):
            raise NoSigningKey("SLESS_S3_ACCESS_KEY and SLESS_S3_SECRET_KEY are not set: the operator cannot "
                               "sign code download URLs")  # fmt: skip
        if self._client is None:
            from minio import Minio

            endpoint = config.s3_endpoint
            secure = endpoint.startswith("https://") or not endpoint
            host = endpoint.removeprefix("https://").removeprefix("http://").rstrip("/") or "s3.amazonaws.com"
            # the region given: the client asks S3 for nothing while signing
            self._client = Minio(host, access_key=config.s3_access_key, secret_key=config.s3_secret_key,
                                 secure=secure, region=config.s3_region)  # fmt: skip
        return self._client


def needs_renewal(config: OperatorConfig, ref: FunctionRef, current: dict[str, Any], now: float) -> bool:
    """Whether the Secret must get a new URL: another key to fetch, or less than half its lifetime left."""
    expires = current.get("expires")
    if current.get("key") != ref.fetch_key or not isinstance(expires, int):
        return True
    return expires - now < config.code_url_ttl_sec / 2


async def publish(kube: Kube, signer: Signer, config: OperatorConfig, ref: FunctionRef,
                  now: float | None = None) -> dict[str, Any]:  # fmt: skip
    """Sign a URL of what REF's pods fetch (code archive, Go binary) and write it to the Secret; returns the
    new ``status.codeUrl``."""
    now = time.time() if now is None else now
    ttl = config.code_url_ttl_sec
    expires = int(now) + ttl
    secret = manifests.code_secret(ref, signer.sign(ref.fetch_key, ttl), expires)
    collection = api_path("v1", "secrets", ref.namespace)
    try:
        await kube.create(collection, secret)
    except ApiError as exc:
        if not exc.conflict:
            raise
        patch = {"metadata": {k: secret["metadata"][k] for k in ("labels", "annotations", "ownerReferences")},
                 "stringData": secret["stringData"]}  # fmt: skip
        await kube.patch(f"{collection}/{secret['metadata']['name']}", patch)
    return {"key": ref.fetch_key, "expires": expires}
