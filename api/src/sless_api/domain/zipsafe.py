"""Safe inspection and extraction of uploaded code zips, and reading extracted code back for display.

An upload is hostile until proven otherwise: names may climb out of the target (``../``, absolute paths,
drive letters, backslashes), entries may be symlinks or devices, and sizes in the headers may lie. So:

- every name and entry type is checked before a single byte is written;
- sizes are checked from the headers up front (cheap rejection) and counted again while writing, since a
  header is only a claim;
- everything is written into a fresh temporary directory next to ``dest_dir`` and renamed into place only
  when the whole archive was good, so a rejected zip leaves nothing behind.

Paths are kept exactly as given: a zip whose files all sit under one top-level folder is NOT flattened, so
what the user sees in ``GET .../source`` matches their archive. Nested archives are stored as plain files;
nothing is extracted recursively.

No falcon here: the API and the standalone backend both use this module.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import posixpath
import re
import shutil
import stat
import tempfile
import unicodedata
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sless_core.errors import ValidationError

MIB = 1 << 20
CHUNK = 64 * 1024
# Entries below this size are not ratio-checked: small highly compressible files are normal.
RATIO_MIN_BYTES = 1 * MIB
MAX_NAME_BYTES = 1024
MAX_COMPONENT_BYTES = 255
_DRIVE = re.compile(r"^[A-Za-z]:")


@dataclass(frozen=True)
class ZipLimits:
    """Upper bounds for one uploaded archive (uncompressed sizes)."""

    max_entries: int = 2000
    max_total_bytes: int = 256 * MIB
    max_file_bytes: int = 64 * MIB
    # Uncompressed/compressed size allowed for an entry larger than RATIO_MIN_BYTES.
    max_ratio: float = 200


class ZipRejected(ValidationError):
    """The upload is not an acceptable zip; the message names the offending entry."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="code")


@dataclass(frozen=True)
class _Entry:
    info: zipfile.ZipInfo
    name: str  # normalised relative path, no trailing slash
    is_dir: bool
    executable: bool


def extract_zip(
    source: str | os.PathLike[str] | IO[bytes],
    dest_dir: str | os.PathLike[str],
    limits: ZipLimits | None = None,
) -> list[str]:
    """Extract ``source`` into ``dest_dir`` (which must not exist yet, or be an empty directory).

    Returns the relative names of the files written, sorted. Raises ``ZipRejected`` for any unacceptable
    archive; ``dest_dir`` then does not exist (or stays the empty directory it was) and nothing else was
    written.
    """
    limits = limits or ZipLimits()
    dest = Path(dest_dir)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FileExistsError(f"{dest} exists and is not an empty directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        archive = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as exc:
        raise ZipRejected(f"upload is not a valid zip archive: {exc}") from None
    with archive:
        entries = _inspect(archive, limits)
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
        try:
            written = _write_all(archive, entries, staging, limits)
            staging.chmod(0o755)
            if dest.exists():
                dest.rmdir()
            staging.rename(dest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return sorted(written)


def _inspect(archive: zipfile.ZipFile, limits: ZipLimits) -> list[_Entry]:
    """Check every entry's name, type and declared size; nothing is read or written yet."""
    infos = archive.infolist()
    if len(infos) > limits.max_entries:
        raise ZipRejected(f"zip has {len(infos)} entries; at most {limits.max_entries} are allowed")
    entries: list[_Entry] = []
    files: dict[str, str] = {}  # collision key -> name as given
    dirs: dict[str, str] = {}
    declared_total = 0
    for info in infos:
        entry = _check_entry(info, limits)
        key = _collision_key(entry.name)
        if entry.is_dir:
            if key in files:
                raise ZipRejected(f"zip entry {info.orig_filename!r} clashes with file {files[key]!r}")
            dirs[key] = entry.name
        else:
            if key in files or key in dirs:
                other = files.get(key) or dirs[key]
                raise ZipRejected(f"zip entry {info.orig_filename!r} duplicates {other!r}")
            files[key] = entry.name
            declared_total += info.file_size
            if declared_total > limits.max_total_bytes:
                raise ZipRejected(
                    f"zip expands to more than {limits.max_total_bytes} bytes "
                    f"(limit reached at entry {info.orig_filename!r})"
                )
        entries.append(entry)
    # A file used as a parent folder of another entry ("a" and "a/b") cannot be extracted.
    for entry in entries:
        parent = posixpath.dirname(entry.name)
        while parent:
            pkey = _collision_key(parent)
            if pkey in files:
                raise ZipRejected(f"zip entry {entry.info.orig_filename!r} is inside file {files[pkey]!r}")
            parent = posixpath.dirname(parent)
    if not files:
        raise ZipRejected("zip contains no files")
    return entries


def _check_entry(info: zipfile.ZipInfo, limits: ZipLimits) -> _Entry:
    raw = info.orig_filename  # zipfile silently cuts ``filename`` at a NUL; the original keeps it
    shown = repr(raw)
    if info.flag_bits & 0x1:
        raise ZipRejected(f"zip entry {shown} is encrypted")
    if not raw:
        raise ZipRejected("zip has an entry with an empty name")
    if "\x00" in raw:
        raise ZipRejected(f"zip entry {shown} has a NUL character in its name")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        raise ZipRejected(f"zip entry {shown} has a control character in its name")
    if "\\" in raw:
        raise ZipRejected(f"zip entry {shown} has a backslash in its name")
    if raw.startswith("/"):
        raise ZipRejected(f"zip entry {shown} is an absolute path")
    if _DRIVE.match(raw):
        raise ZipRejected(f"zip entry {shown} starts with a drive letter")
    is_dir = raw.endswith("/")
    parts = raw.rstrip("/").split("/")
    if ".." in parts:
        raise ZipRejected(f"zip entry {shown} has a '..' component")
    parts = [p for p in parts if p not in ("", ".")]
    if not parts:
        raise ZipRejected(f"zip entry {shown} has no usable name")
    name = "/".join(parts)
    if len(name.encode("utf-8")) > MAX_NAME_BYTES or any(len(p.encode("utf-8")) > MAX_COMPONENT_BYTES for p in parts):
        raise ZipRejected(f"zip entry {shown} has a name that is too long")
    mode = info.external_attr >> 16
    kind = stat.S_IFMT(mode)
    if kind == stat.S_IFLNK:
        raise ZipRejected(f"zip entry {shown} is a symbolic link")
    if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise ZipRejected(f"zip entry {shown} is a special file (device, pipe or socket)")
    if kind == stat.S_IFDIR and not is_dir:
        raise ZipRejected(f"zip entry {shown} is a directory without a trailing '/'")
    if not is_dir:
        if info.file_size > limits.max_file_bytes:
            raise ZipRejected(
                f"zip entry {shown} is {info.file_size} bytes; at most {limits.max_file_bytes} are allowed"
            )
        _check_ratio(shown, info.file_size, info.compress_size, limits)
    return _Entry(info=info, name=name, is_dir=is_dir, executable=bool(mode & 0o111))


def _check_ratio(shown: str, size: int, compressed: int, limits: ZipLimits) -> None:
    if size > RATIO_MIN_BYTES and size > limits.max_ratio * max(compressed, 1):
        raise ZipRejected(
            f"zip entry {shown} compresses {size // max(compressed, 1)}:1; "
            f"more than {limits.max_ratio:g}:1 looks like a zip bomb"
        )


def _collision_key(name: str) -> str:
    """Names that would land on the same file on a case-insensitive or normalising filesystem collide."""
    return unicodedata.normalize("NFC", posixpath.normpath(name)).casefold()


class ByteBudget:
    """Bytes actually written, against the limits: the headers' sizes are only claims.

    (zipfile itself stops an entry at its declared size and then fails the CRC check; this count does not
    rely on that.)
    """

    def __init__(self, limits: ZipLimits) -> None:
        self.limits = limits
        self.total = 0

    def charge(self, shown: str, entry_bytes: int, compressed: int, n: int) -> None:
        self.total += n
        if entry_bytes > self.limits.max_file_bytes:
            raise ZipRejected(f"zip entry {shown} expands beyond {self.limits.max_file_bytes} bytes")
        if self.total > self.limits.max_total_bytes:
            raise ZipRejected(
                f"zip expands to more than {self.limits.max_total_bytes} bytes (limit reached at entry {shown})"
            )
        _check_ratio(shown, entry_bytes, compressed, self.limits)


def copy_bounded(src: IO[bytes], dst: IO[bytes], shown: str, compressed: int, budget: ByteBudget) -> int:
    """Copy one entry, charging every chunk to ``budget`` before it is written."""
    written = 0
    while True:
        chunk = src.read(CHUNK)
        if not chunk:
            return written
        written += len(chunk)
        budget.charge(shown, written, compressed, len(chunk))
        dst.write(chunk)


def _write_all(archive: zipfile.ZipFile, entries: list[_Entry], root: Path, limits: ZipLimits) -> list[str]:
    budget = ByteBudget(limits)
    written: list[str] = []
    for entry in entries:
        if entry.is_dir:
            _makedirs(root, entry.name)
            continue
        parent = posixpath.dirname(entry.name)
        if parent:
            _makedirs(root, parent)
        _write_file(archive, entry, root, budget)
        written.append(entry.name)
    return written


def _makedirs(root: Path, rel: str) -> None:
    path = root
    for part in rel.split("/"):
        path = path / part
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o755)
        # mkdir's mode is masked by the umask; the tree's modes should not depend on the server's umask.
        if path.is_symlink() or not path.is_dir():
            raise ZipRejected(f"zip entry {rel!r} clashes with a file of the same name")
        path.chmod(0o755)


def _write_file(archive: zipfile.ZipFile, entry: _Entry, root: Path, budget: ByteBudget) -> None:
    shown = repr(entry.info.orig_filename)
    mode = 0o755 if entry.executable else 0o644
    target = root / entry.name
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target, flags, 0o600)
    except FileExistsError:
        raise ZipRejected(f"zip entry {shown} duplicates another entry") from None
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise ZipRejected(f"zip entry {shown} has a name that is too long") from None
        raise
    with os.fdopen(fd, "wb") as dst:
        try:
            with archive.open(entry.info) as src:
                copy_bounded(src, dst, shown, entry.info.compress_size, budget)
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise ZipRejected(f"zip entry {shown} is corrupt: {exc}") from None
        except NotImplementedError as exc:
            raise ZipRejected(f"zip entry {shown} uses an unsupported compression: {exc}") from None
    os.chmod(target, mode)


def read_source_files(
    code_dir: str | os.PathLike[str],
    max_files: int = 500,
    max_bytes: int = 4 * MIB,
) -> list[dict[str, Any]]:
    """The files under ``code_dir`` as ``[{name, content, binary}]``, sorted by name.

    Text (valid UTF-8 without NUL bytes) is returned as is; anything else base64-encoded with
    ``binary: True``. Symlinks and special files are skipped. More than ``max_files`` files or
    ``max_bytes`` bytes in total raise ``ValidationError`` rather than returning a silently cut listing.
    """
    root = Path(code_dir)
    sizes: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        rel_dir = Path(dirpath).relative_to(root)
        for filename in filenames:
            path = Path(dirpath) / filename
            st = path.lstat()
            if not stat.S_ISREG(st.st_mode):
                continue
            sizes[(rel_dir / filename).as_posix()] = st.st_size
            if len(sizes) > max_files:
                raise ValidationError(
                    f"the source has more than {max_files} files; download the zip instead", field="source"
                )
    too_large = ValidationError(
        f"the source is larger than {max_bytes} bytes; download the zip instead", field="source"
    )
    if sum(sizes.values()) > max_bytes:
        raise too_large
    result: list[dict[str, Any]] = []
    total = 0
    for name in sorted(sizes):
        data = (root / name).read_bytes()
        total += len(data)
        if total > max_bytes:  # a file grew after it was listed
            raise too_large
        result.append(_file_record(name, data))
    return result


def _file_record(name: str, data: bytes) -> dict[str, Any]:
    if b"\x00" not in data:
        try:
            return {"name": name, "content": data.decode("utf-8"), "binary": False}
        except UnicodeDecodeError:
            pass
    return {"name": name, "content": base64.b64encode(data).decode("ascii"), "binary": True}
