"""What a caller is told when a function's process fails: one line, its reason said once, no paths."""

from __future__ import annotations

from sless_api.backends.standalone.failures import NO_REASON, caller_reason, start_failure

TRACEBACK = """\
sless-runtime: cannot load handler handler.handle:
Traceback (most recent call last):
  File "./handler.py", line 1, in <module>
ModuleNotFoundError: No module named 'nope'
sless-runtime: the function failed to load: ModuleNotFoundError: No module named 'nope'
"""


def test_a_load_failure_is_said_once() -> None:
    assert start_failure(TRACEBACK) == "does not load: ModuleNotFoundError: No module named 'nope'"
    assert start_failure(TRACEBACK).count("load") == 1


def test_the_runtimes_last_line_is_the_reason_and_nothing_of_the_traceback() -> None:
    reason = caller_reason(TRACEBACK)
    assert reason == "the function failed to load: ModuleNotFoundError: No module named 'nope'"
    assert "File" not in reason and "Traceback" not in reason


def test_a_process_that_dies_without_the_runtimes_line_points_to_its_log() -> None:
    assert caller_reason("Segmentation fault\n/home/x/data/functions/f: core dumped\n") == NO_REASON
    assert start_failure("killed\n") == f"failed to start: {NO_REASON}"
