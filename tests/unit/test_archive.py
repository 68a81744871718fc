"""Zips made by the platform's tools depend on their content only: same files, same bytes, same code hash."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path

from sless_api.cli.folders import zip_folder
from sless_api.domain.archive import FIXED_DATE_TIME, zip_bytes

ENTRIES = [("handler.py", "def handle(e):\n    return 1\n", False), ("run.sh", b"#!/bin/sh\n", True)]


def test_the_same_entries_give_the_same_bytes_on_any_day() -> None:
    # A digest fixed in the test: a timestamp of "now" in any entry would change it.
    digest = hashlib.sha256(zip_bytes(ENTRIES)).hexdigest()
    assert digest == "124ae7dae5e7aa0f7954a289dcb962daf174c1b2557ff2c0e719feccf134788f"


def test_entries_keep_names_content_and_the_executable_bit() -> None:
    with zipfile.ZipFile(io.BytesIO(zip_bytes(ENTRIES))) as zf:
        infos = zf.infolist()
        assert [i.filename for i in infos] == ["handler.py", "run.sh"]
        assert all(i.date_time == FIXED_DATE_TIME for i in infos)
        assert [(i.external_attr >> 16) & 0o777 for i in infos] == [0o644, 0o755]
        assert zf.read("run.sh") == b"#!/bin/sh\n"


def test_deploying_an_unchanged_folder_uploads_the_same_zip(tmp_path: Path) -> None:
    (tmp_path / "handler.py").write_text("def handle(e):\n    return 1\n")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "util.py").write_text("X = 1\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "junk.pyc").write_bytes(b"\0")
    first = zip_folder(tmp_path)
    for path in (tmp_path / "handler.py", tmp_path / "lib" / "util.py"):
        os.utime(path, (2_000_000_000, 2_000_000_000))  # touched, not changed
    assert zip_folder(tmp_path) == first
    with zipfile.ZipFile(io.BytesIO(first)) as zf:
        assert zf.namelist() == ["handler.py", "lib/util.py"]
