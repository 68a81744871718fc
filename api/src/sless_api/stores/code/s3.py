"""Code store in an S3 bucket through the ``minio`` client (MinIO, AWS S3, any S3 server).

The platform only ever speaks S3 through this class, so the same code runs against
MinIO in a cluster and against the S3 server the tests start.
"""

from __future__ import annotations

import io
from pathlib import Path

from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import S3Error

from sless_api.stores.code.keys import ObjectNotFoundError, StorageError, validate_key, validate_prefix

_MISSING_CODES = frozenset({"NoSuchKey", "NoSuchObject", "NotFound", "ResourceNotFound"})
_BUCKET_RACE_CODES = frozenset({"BucketAlreadyOwnedByYou", "BucketAlreadyExists"})


class S3CodeStore:
    """A :class:`~sless_api.stores.code.base.CodeStore` in BUCKET, created on first use if missing."""

    def __init__(
        self,
        endpoint: str,
        access_key: str,
        secret_key: str,
        bucket: str,
        *,
        secure: bool = False,
        region: str | None = None,
    ) -> None:
        self.bucket = bucket
        self.endpoint = endpoint
        self.client = Minio(endpoint, access_key=access_key, secret_key=secret_key, secure=secure, region=region)
        self._bucket_ready = False

    def __repr__(self) -> str:
        return f"S3CodeStore({self.endpoint!r}, bucket={self.bucket!r})"

    def ensure_bucket(self) -> None:
        """Create the bucket unless it exists (two replicas racing to create it is fine)."""
        if self._bucket_ready:
            return
        if not self.client.bucket_exists(self.bucket):
            try:
                self.client.make_bucket(self.bucket)
            except S3Error as exc:
                if exc.code not in _BUCKET_RACE_CODES:
                    raise StorageError(f"cannot create bucket {self.bucket!r}: {exc.code}") from exc
        self._bucket_ready = True

    def put_bytes(self, key: str, data: bytes) -> None:
        validate_key(key)
        self.ensure_bucket()
        self.client.put_object(self.bucket, key, io.BytesIO(data), len(data))

    def put_file(self, key: str, path: str | Path) -> None:
        validate_key(key)
        self.ensure_bucket()
        self.client.fput_object(self.bucket, key, str(path))

    def get_bytes(self, key: str) -> bytes:
        validate_key(key)
        self.ensure_bucket()
        try:
            response = self.client.get_object(self.bucket, key)
        except S3Error as exc:
            raise self._translate(key, exc) from exc
        try:
            return bytes(response.read())
        finally:
            response.close()
            response.release_conn()

    def get_to_file(self, key: str, path: str | Path) -> None:
        validate_key(key)
        self.ensure_bucket()
        try:
            # minio writes to a temporary file beside PATH and renames it into place.
            self.client.fget_object(self.bucket, key, str(path))
        except S3Error as exc:
            raise self._translate(key, exc) from exc

    def exists(self, key: str) -> bool:
        validate_key(key)
        self.ensure_bucket()
        try:
            self.client.stat_object(self.bucket, key)
        except S3Error as exc:
            if exc.code in _MISSING_CODES:
                return False
            raise StorageError(f"stat {key!r}: {exc.code}") from exc
        return True

    def list(self, prefix: str = "") -> list[str]:
        validate_prefix(prefix)
        self.ensure_bucket()
        objects = self.client.list_objects(self.bucket, prefix=prefix or None, recursive=True)
        return sorted(str(obj.object_name) for obj in objects if obj.object_name and not obj.is_dir)

    def delete_prefix(self, prefix: str) -> int:
        keys = self.list(prefix)
        if not keys:
            return 0
        errors = list(self.client.remove_objects(self.bucket, (DeleteObject(k) for k in keys)))
        if errors:
            first = errors[0]
            raise StorageError(f"{len(errors)} objects under {prefix!r} not deleted, e.g. {first.name}: {first.code}")
        return len(keys)

    @staticmethod
    def _translate(key: str, exc: S3Error) -> StorageError:
        if exc.code in _MISSING_CODES:
            return ObjectNotFoundError(key)
        return StorageError(f"{key!r}: {exc.code} {exc.message}")
