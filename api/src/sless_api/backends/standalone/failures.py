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
