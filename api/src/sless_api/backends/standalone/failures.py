"""What a caller may be told when a function's process fails: one line, never its stderr.

The supervisor's errors carry the process's stderr tail (a traceback with file paths, whatever the
function printed): right for the function's log and the operator of the platform, wrong for an HTTP
answer or a status message. The runtimes end a load failure with one path-free line,
``sless-runtime: the function failed to load: <Error>: <message>``; that line is what callers see.
"""

from __future__ import annotations

RUNTIME_PREFIX = "sless-runtime: "
#: How the runtimes' one-line load failure begins (after RUNTIME_PREFIX).
LOAD_FAILURE = "the function failed to load: "
NO_REASON = "it exited during start-up; its log has the details"
#: How the platform's own notes on a run begin (runner.py): path-free by construction.
PLATFORM_NOTE = "[sless] "


def caller_reason(stderr_tail: str) -> str:
    """The runtime's own last one-line reason found in STDERR_TAIL, or a pointer to the log."""
    for line in reversed(stderr_tail.splitlines()):
        text = line.strip()
        if text.startswith(RUNTIME_PREFIX) and "failed to load" in text:
            return text[len(RUNTIME_PREFIX):][:500]
    return NO_REASON


def start_failure(stderr_tail: str) -> str:
    """Why a process did not start, said once: ``does not load: <Error>: <message>`` for a load failure
    (not "failed to start: the function failed to load: ..."), else ``failed to start: <reason>``."""
    reason = caller_reason(stderr_tail)
    if reason.startswith(LOAD_FAILURE):
        return f"does not load: {reason.removeprefix(LOAD_FAILURE)}"
    return f"failed to start: {reason}"


def check_failure(output: str, exit_code: int | None, timed_out: bool, timeout_sec: float) -> str:
    """Why the load check of a new version failed, in one path-free line.

    The runtime's own reason when it gave one; else what the platform saw: the check never started (a fault
    of the host, not of the code: deploying again may pass), a limit that ended it, its timeout, or its exit
    code. "its log has the details" alone told neither the tenant nor the operator which of these it was.
    """
    reason = caller_reason(output)
    if reason != NO_REASON:
        return reason.removeprefix(LOAD_FAILURE)
    if exit_code is None:
        return "the platform could not start it (its log says why); deploying again may pass"
    notes = [line[len(PLATFORM_NOTE):].strip() for line in output.splitlines() if line.startswith(PLATFORM_NOTE)]
    limits = [note for note in notes if note.startswith("killed: ")]
    if limits:
        return limits[-1]
    if timed_out:
        return f"loading it took longer than its timeout of {timeout_sec:g}s"
    return f"it exited with code {exit_code} during start-up; its log has the details"
