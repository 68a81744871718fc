"""`sless ls` prints one line per function, whatever the function's message holds."""

from __future__ import annotations

from sless_api.cli import ls_row


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
