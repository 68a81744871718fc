"""`sless ls` prints one line per function, whatever its message holds; `sless source --out` stays in its folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from sless_api.cli.client import CliError
from sless_api.cli.commands import ls_row
from sless_api.cli.verbs import write_source


def test_a_multi_line_build_log_stays_on_one_row() -> None:
    row = ls_row({"name": "broken", "runtime": "python3.11", "phase": "Failed",
                  "message": "build failed:\nTraceback (most recent call last):\n  File \"x\"\r\nSyntaxError: bad\t!"})
    assert "\n" not in row and "\r" not in row and "\t" not in row
    assert row.startswith("broken") and "Failed" in row and "build failed: Traceback" in row


def test_long_messages_are_cut_visibly() -> None:
    row = ls_row({"name": "f", "runtime": "go1.23", "phase": "Ready", "message": "x" * 200})
    assert row.endswith("x…") and len(row.split()[-1]) == 60
    assert ls_row({"name": "f", "runtime": "go1.23", "phase": "Pending", "message": None}).split() == \
        ["f", "go1.23", "Pending"]


def test_source_written_from_the_api_never_leaves_its_folder(tmp_path: Path) -> None:
    """A hostile or broken server could name a file `../x` or `/etc/x`: nothing is written then, not even the
    files before it."""
    for bad in ("../escape.txt", "/abs.txt", "a/../../up.txt", ""):
        files = [{"name": "fine.txt", "content": "ok", "binary": False},
                 {"name": bad, "content": "x", "binary": False}]
        with pytest.raises(CliError, match="refusing to write"):
            write_source(tmp_path / "out", files)
        assert not (tmp_path / "out").exists() and not (tmp_path / "escape.txt").exists()
    write_source(tmp_path / "out", [{"name": "sub/bin.dat", "content": "AAE=", "binary": True}])
    assert (tmp_path / "out" / "sub" / "bin.dat").read_bytes() == b"\x00\x01"
