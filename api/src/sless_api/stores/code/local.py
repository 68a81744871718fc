"""Code store in a local directory: the standalone backend's S3.

Writes go to a hidden temporary file in the target's folder and are renamed into place,
so a reader (or a crash) never sees a partial archive. Every key is resolved and checked
to stay under the root, including through symlinks planted inside it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from sless_api.stores.code.keys import InvalidKeyError, ObjectNotFoundError, validate_key, validate_prefix

_TMP_PREFIX = ".tmp-"
_COPY_CHUNK = 1024 * 1024


class LocalCodeStore:
    """A :class:`~sless_api.stores.code.base.CodeStore` under ROOT_DIR (created if missing)."""

    def __init__(self, root_dir: str | Path) -> None:
        self.root = Path(root_dir).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalCodeStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        path = self.root.joinpath(*validate_key(key).split("/"))
        resolved = path.resolve()
        if not resolved.is_relative_to(self.root) or resolved == self.root:
            raise InvalidKeyError(f"object key {key!r} resolves outside the store")
        return path

    def _write_atomic(self, key: str, fill: Callable[[IO[bytes]], object]) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.parent.resolve().is_relative_to(self.root):
            raise InvalidKeyError(f"object key {key!r} resolves outside the store")
        fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                fill(out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def put_bytes(self, key: str, data: bytes) -> None:
        self._write_atomic(key, lambda out: out.write(data))

    def put_file(self, key: str, path: str | Path) -> None:
        with open(path, "rb") as src:
            self._write_atomic(key, lambda out: shutil.copyfileobj(src, out, _COPY_CHUNK))

    def get_bytes(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFoundError(key) from exc

    def get_to_file(self, key: str, path: str | Path) -> None:
        src_path = self._path(key)
        dest = Path(path)
        try:
            src = src_path.open("rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFoundError(key) from exc
        with src:
            fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=dest.parent)
            try:
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(src, out, _COPY_CHUNK)
                os.replace(tmp, dest)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def _walk(self, prefix: str) -> Iterator[str]:
        # Only descend into the folder the prefix's complete segments name.
        folder, _, _ = validate_prefix(prefix).rpartition("/")
        start = self.root.joinpath(*folder.split("/")) if folder else self.root
        if not start.resolve().is_relative_to(self.root) or not start.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel_dir = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if name.startswith("."):
                    continue  # temporaries of writes in progress
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                if key.startswith(prefix):
                    yield key

    def list(self, prefix: str = "") -> list[str]:
        return sorted(self._walk(prefix))

    def delete_prefix(self, prefix: str) -> int:
        deleted = 0
        folders: set[Path] = set()
        for key in self.list(prefix):
            path = self._path(key)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                deleted += 1
            folders.add(path.parent)
        # Remove the folders the deletion emptied, deepest first, never the root itself.
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            current = folder
            while current != self.root and current.is_relative_to(self.root):
                try:
                    current.rmdir()
                except OSError:
                    break
                current = current.parent
        return deleted
