"""What a caller is told when a function's process fails: one line, its reason said once, no paths."""

from __future__ import annotations

from sless_api.backends.standalone.failures import NO_REASON, caller_reason, check_failure, start_failure

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


def test_a_failed_load_check_says_which_failure_it_was() -> None:
    """The runtime's reason first; else whether the check never started, hit a limit, ran out of time or
    exited, each in one line without the process's stderr (which names paths)."""
    assert check_failure(TRACEBACK, 1, False, 30) == "ModuleNotFoundError: No module named 'nope'"
    never = check_failure("cannot start the runner: pasta did not configure /run/x", None, False, 30)
    assert "could not start it" in never and "/run" not in never
    memory = "Traceback...\n  File \"/srv/x.py\"\n[sless] killed: the function exceeded its memory limit of 128 MB"
    assert check_failure(memory, -9, False, 30) == "killed: the function exceeded its memory limit of 128 MB"
    slow = "[sless] runner killed after 31.0s: it did not stop at its 30s timeout (+1s margin)"
    assert check_failure(slow, -9, True, 30) == "loading it took longer than its timeout of 30s"
    crashed = check_failure("Segmentation fault at /home/x/data\n", -11, False, 30)
    assert crashed == "it exited with code -11 during start-up; its log has the details"
