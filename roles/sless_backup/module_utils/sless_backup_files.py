"""The backup folder's files: private modes, safe paths, JSON written whole, checksums.

A backup holds the tenants' secrets: every folder is created 0700 and every file 0600, whatever the umask.
A name read back from a backup (an object key, a file listed in the manifest) becomes a path only through
``inside``, which refuses anything that could leave the backup folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

FOLDER_MODE = 0o700
FILE_MODE = 0o600
CHUNK = 1024 * 1024
#: One segment of a relative path in a backup: no slash, backslash, NUL or control character, not hidden.
_BAD = re.compile(r"[\\\x00-\x1f\x7f]")


class BackupError(Exception):
    """The backup cannot be written or read as it is; the message says why (never a secret value)."""


def relative(name: object, what: str = "path") -> str:
    """NAME if it is a safe relative path (``a/b.json``): not absolute, no ``..``, ``.`` or hidden segment."""
    if not isinstance(name, str) or not name or len(name) > 1024:
        raise BackupError(f"{what} {name!r} is not a non-empty string of at most 1024 characters")
    if _BAD.search(name) or name.startswith("/") or name.endswith("/"):
        raise BackupError(f"{what} {name!r} is absolute, names a folder or holds a backslash or control character")
    for segment in name.split("/"):
        if segment in ("", ".", "..") or segment.startswith("."):
            raise BackupError(f"{what} {name!r} has an empty, '.', '..' or hidden segment")
    return name


def inside(root: str | Path, name: str, what: str = "path") -> Path:
    """ROOT/NAME for a NAME ``relative`` accepts, checked once more after resolving (no symlink leads out)."""
    base = Path(root).resolve()
    path = (base / relative(name, what)).resolve()
    if base not in path.parents:
        raise BackupError(f"{what} {name!r} leads out of {base}")
    return path


def private_folder(path: str | Path) -> Path:
    """PATH and its missing parents created 0700 each (mkdir's parents would follow the umask); an existing PATH is
    tightened to 0700."""
    folder = Path(path)
    missing = [p for p in [folder, *folder.parents] if not p.exists()]
    for level in reversed(missing):
        level.mkdir(mode=FOLDER_MODE, exist_ok=True)
        os.chmod(level, FOLDER_MODE)
    os.chmod(folder, FOLDER_MODE)
    return folder


def open_private(path: str | Path) -> Any:
    """PATH opened for writing bytes, created 0600 (its folder 0700), truncated if it exists."""
    target = Path(path)
    private_folder(target.parent)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return os.fdopen(fd, "wb")


def write_json(path: str | Path, data: Any) -> None:
    """DATA as JSON (sorted keys) in PATH, 0600, flushed to disk."""
    with open_private(path) as out:
        out.write(json.dumps(data, indent=1, sort_keys=True).encode())
        out.flush()
        os.fsync(out.fileno())


def read_json(path: str | Path, what: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BackupError(f"{what}: {path} is missing") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BackupError(f"{what}: {path} is not complete JSON ({exc})") from None


def sha256_file(path: str | Path) -> tuple[str, int]:
    """(hex SHA-256, size) of the file at PATH."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as src:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fsync_folder(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
