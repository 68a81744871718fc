"""The code store contract shared by the local directory and the S3 implementation."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable


@runtime_checkable
class CodeStore(Protocol):
    """Blob storage for code archives and build contexts, addressed by validated keys.

    Every method raises ``InvalidKeyError`` for a key that breaks the key rules and
    ``ObjectNotFoundError`` when reading a key that holds nothing. Methods block (disk or
    network I/O): async callers go through ``asyncio.to_thread``.
    """

    def put_bytes(self, key: str, data: bytes) -> None:
        """Store DATA under KEY, replacing what was there; readers never see half an object."""

    def put_file(self, key: str, path: str | Path) -> None:
        """Store the file at PATH under KEY (streamed, not read into memory)."""

    def get_bytes(self, key: str) -> bytes:
        """The object under KEY."""

    def get_to_file(self, key: str, path: str | Path) -> None:
        """Write the object under KEY to PATH (replaced atomically)."""

    def exists(self, key: str) -> bool:
        """Whether an object is stored under KEY."""

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object whose key starts with PREFIX; return how many were deleted."""

    def list(self, prefix: str = "") -> list[str]:
        """Every key that starts with PREFIX (string match, S3-style), sorted."""
