"""`sless ls` prints one line per function, whatever its message holds, with its scale; `sless get` says the scale
in words; `sless source --out` stays in its folder; a bad sless.json is named before anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from sless_api.cli.client import CliError, table
from sless_api.cli.commands import ls_row
from sless_api.cli.folders import read_manifest
from sless_api.cli.verbs import function_details, scale_short, scale_text, write_source


def test_a_multi_line_build_log_stays_on_one_row() -> None:
    row = ls_row({"name": "broken", "runtime": "python3.11", "phase": "Failed",
                  "message": "build failed:\nTraceback (most recent call last):\n  File \"x\"\r\nSyntaxError: bad\t!"})
    assert not any(c in cell for cell in row for c in "\n\r\t")
    assert row[:3] == ("broken", "python3.11", "Failed") and row[-1].startswith("build failed: Traceback")


def test_long_messages_are_cut_visibly() -> None:
    row = ls_row({"name": "f", "runtime": "go1.23", "phase": "Ready", "message": "x" * 200})
    assert row[-1].endswith("x…") and len(row[-1]) == 60
    assert ls_row({"name": "f", "runtime": "go1.23", "phase": "Pending", "message": None}) == \
        ("f", "go1.23", "Pending", "fixed", "-")


def test_tables_have_a_header_and_columns_as_wide_as_their_cells() -> None:
    url = "http://127.0.0.1:8090/fn/t-tenant/a-function-with-a-rather-long-name/and/a/longer/path"
    text = table(("NAME", "URL"), [("a", url), ("bbbbbbbbbbbbbbbb", "-")])
    assert text.splitlines() == ["NAME              URL", f"a                 {url}", "bbbbbbbbbbbbbbbb  -"]
    assert table(("NAME", "URL"), []) == "", "an empty listing prints nothing, not even its header"


SCALE = {"min": 1, "max": 4, "target": 5, "idle_sec": 60}


def test_ls_shows_the_scale_bounds_or_fixed() -> None:
    row = ls_row({"name": "f", "runtime": "go1.23", "phase": "Ready", "message": "ok", "scale": SCALE})
    assert row == ("f", "go1.23", "Ready", "scale:1-4", "ok")
    assert (scale_short(None), scale_short(SCALE)) == ("fixed", "scale:1-4")


def test_get_says_the_scale_in_words() -> None:
    assert scale_text(None) == "fixed replicas (no scale)"
    assert scale_text(SCALE) == ("1..4 replicas, target 5 calls in flight per replica, back to 1 after 60s "
                                 "without calls")
    fn = {"name": "f", "runtime": "python3.11", "entrypoint": "handler.handle", "phase": "Ready", "memory_mb": 128,
          "timeout_sec": 30, "max_concurrency": 0, "scale": SCALE, "sandbox": "", "code_hash": None,
          "message": "line one\nline two"}
    lines = function_details(fn).splitlines()
    assert "scale:           " + scale_text(SCALE) in lines
    assert "message:         line one line two" in lines


def test_sless_json_carries_scale_and_bad_ones_are_named(tmp_path: Path) -> None:
    (tmp_path / "sless.json").write_text('{"runtime": "python3.11", "scale": {"min": 0, "max": 3}}')
    assert read_manifest(tmp_path)["scale"] == {"min": 0, "max": 3}
    for text, says in (('{"scale": 3}', '"scale" must be an object'), ("[1]", "must hold a JSON object"),
                       ("{nope", "is not JSON")):
        (tmp_path / "sless.json").write_text(text)
        with pytest.raises(CliError, match=says):
            read_manifest(tmp_path)


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
