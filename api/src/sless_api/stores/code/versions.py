"""The versions of a function's code in the store: how they are named, found, read back and pruned.

Both backends keep each upload as ``functions/<ns>/<fn>/<stamp>.zip`` and its build context as
``contexts/<ns>/<fn>/<stamp>.tar.gz``. The stamp sorts by upload time and ends with the code hash, so a
listing finds the newest archive of given code, and keeping the newest few is a slice of it.

Blocking I/O throughout: async callers go through ``asyncio.to_thread``.
"""

from __future__ import annotations

import time
from pathlib import Path

from sless_api.domain.zipsafe import ZipLimits, extract_zip
from sless_api.stores.code.base import CodeStore
from sless_api.stores.code.keys import function_prefixes


def stamp(code_hash: str, now: float | None = None) -> str:
    """``20261130T031500123456Z-<hash[:12]>``: sorts by time (to the microsecond), names the code."""
    now = time.time() if now is None else now
    micros = int((now % 1) * 1_000_000)
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{micros:06d}Z-{code_hash[:12]}"


def newest_archive(store: CodeStore, namespace: str, name: str, code_hash: str) -> str | None:
    """The key of the newest stored zip of CODE_HASH, or None when none is left."""
    zips = store.list(function_prefixes(namespace, name)[0])
    matching = [key for key in zips if key.endswith(f"-{code_hash[:12]}.zip")]
    return matching[-1] if matching else None


def unpack_archive(store: CodeStore, key: str, work: Path, limits: ZipLimits) -> Path:
    """The archive under KEY unpacked into WORK/code (WORK is the caller's); returns that folder.

    The source view reads this, never the folder a function runs in: files a function writes at run
    time are not its source.
    """
    archive = work / "code.zip"
    store.get_to_file(key, archive)
    code_dir = work / "code"
    extract_zip(archive, code_dir, limits)
    return code_dir


def prune(store: CodeStore, namespace: str, name: str, keep: int) -> int:
    """Delete archives and build contexts beyond the newest KEEP; returns how many objects went."""
    deleted = 0
    for prefix in function_prefixes(namespace, name):
        for key in store.list(prefix)[:-keep]:
            deleted += store.delete_prefix(key)
    return deleted
