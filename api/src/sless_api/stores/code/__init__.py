"""Code storage: uploaded archives and build contexts, in S3/MinIO or a local folder."""

from sless_api.stores.code.base import CodeStore
from sless_api.stores.code.factory import StorageSettings, code_store
from sless_api.stores.code.keys import (
    InvalidKeyError,
    ObjectNotFoundError,
    StorageError,
    code_key,
    context_key,
    function_prefixes,
    validate_key,
    validate_prefix,
    zip_key,
)
from sless_api.stores.code.local import LocalCodeStore
from sless_api.stores.code.s3 import S3CodeStore

__all__ = [
    "CodeStore",
    "InvalidKeyError",
    "LocalCodeStore",
    "ObjectNotFoundError",
    "S3CodeStore",
    "StorageError",
    "StorageSettings",
    "code_key",
    "code_store",
    "context_key",
    "function_prefixes",
    "validate_key",
    "validate_prefix",
    "zip_key",
]
