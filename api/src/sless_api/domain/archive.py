"""Zip archives whose bytes depend on their content only.

``ZipFile.writestr(name, ...)`` stamps the current time into each entry and ``ZipFile.write`` the file's
mtime, so the same code zipped twice gets two SHA-256s: the platform then rebuilds code that did not
change, and tests that compare hashes fail across a two-second boundary. Every entry here carries one
fixed timestamp and a mode taken from the content's executable bit only.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable

FIXED_DATE_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip entry can hold


def zip_bytes(entries: Iterable[tuple[str, bytes | str, bool]], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    """A zip of ``(name, content, executable)`` entries, in the order given, with fixed metadata."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
        for name, content, executable in entries:
            info = zipfile.ZipInfo(name, date_time=FIXED_DATE_TIME)
            info.compress_type = compression
            info.external_attr = (0o100755 if executable else 0o100644) << 16
            zf.writestr(info, content)
    return buf.getvalue()
