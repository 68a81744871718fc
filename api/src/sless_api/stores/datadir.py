"""The standalone data dir: private to the platform's user (0700), its secret and databases 0600.

The data dir holds the JWT secret (whoever reads it can mint any tenant's token, admins included), the
state and invocation databases (every function's env vars, every call's record), uploaded code and
function logs. It is created 0700 and its sensitive files 0600 whatever the umask; a data dir that
already exists with looser modes (made by an older version, or by hand) is tightened at start, with
one warning line per change, rather than refused: refusing would only make the operator run the same
``chmod``. What cannot be fixed is refused with a message saying why: a data dir that is not a
directory, or that belongs to another user (whose files we must neither trust nor take over).

Not a global umask: build caches and function code must stay readable to the per-tenant users of the
function sandbox, and the builder sets their modes itself.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
#: Top-level folders: code, dependency caches, function logs, code archives, upload spool.
PRIVATE_DIRS = ("functions", "cache", "logs", "objects", "tmp")
#: The JWT secret and the SQLite databases (with their WAL, shared-memory and journal files).
PRIVATE_FILES = ("jwt-secret", "secrets.key")
SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")
DATABASES = ("state.db", "invocations.db", "secrets.db")


class DataDirError(Exception):
    """The data dir cannot be made private; the message says why and what to do."""


def secure_data_dir(data_dir: Path, databases: Iterable[Path] = ()) -> list[str]:
    """Create or tighten ``data_dir``; returns what was tightened (also logged as warnings).

    ``databases`` are SQLite files to create empty with 0600 before SQLite opens them: SQLite gives its
    WAL and shared-memory files the database file's mode, so a 0600 database keeps them 0600 too.
    """
    changed: list[str] = []
    _ensure_dir(data_dir, changed, parents=True)
    if data_dir.stat().st_uid != os.geteuid():
        raise DataDirError(f"data dir {data_dir} belongs to uid {data_dir.stat().st_uid}, not to this user "
                           f"({os.geteuid()}): use a data dir of your own (--data-dir or SLESS_DATA_DIR)")
    for name in PRIVATE_DIRS:
        _ensure_dir(data_dir / name, changed, parents=False)
    for name in PRIVATE_FILES:
        _tighten_file(data_dir / name, changed)
    for db in [*(data_dir / name for name in DATABASES), *databases]:
        for suffix in SQLITE_SUFFIXES:
            _tighten_file(db.with_name(db.name + suffix), changed)
    for db in databases:
        create_private_file(db)
    for line in changed:
        log.warning("data dir: %s", line)
    return changed


def create_private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 unless it exists (an empty file is a valid SQLite database)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    except FileExistsError:
        return
    os.close(fd)


def _ensure_dir(path: Path, changed: list[str], parents: bool) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        if parents:
            path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=DIR_MODE)
        os.chmod(path, DIR_MODE)  # mkdir's mode is masked by the umask; this one is not
        return
    if stat.S_ISLNK(st.st_mode):
        log.info("data dir: %s is a symbolic link; its target's mode is left as it is", path)
        return
    if not stat.S_ISDIR(st.st_mode):
        raise DataDirError(f"{path} exists and is not a directory: move it away or choose another --data-dir")
    _tighten(path, st, DIR_MODE, changed)


def _tighten_file(path: Path, changed: list[str]) -> None:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode):
        _tighten(path, st, FILE_MODE, changed)
    else:
        raise DataDirError(f"{path} is not a regular file (a link or a device?): remove it and start again")


def _tighten(path: Path, st: os.stat_result, mode: int, changed: list[str]) -> None:
    current = stat.S_IMODE(st.st_mode)
    if current & 0o077:
        if st.st_uid != os.geteuid():
            raise DataDirError(f"{path} has mode {current:o} and belongs to uid {st.st_uid}: "
                               f"make it {mode:o} and yours, or choose another --data-dir")
        os.chmod(path, mode)
        changed.append(f"{path}: mode {current:o} -> {mode:o}")
