"""One-shot runs of a function (FunctionJob, cron) in the standalone backend.

The runtime's own runner enforces SLESS_TIMEOUT_SEC (exit 124); this module is
the backstop for a runner that cannot stop itself (a Node handler stuck in a
synchronous loop, a Go handler ignoring its context): after the timeout plus a
margin the whole process group is killed. Whatever the outcome, anything the
function left running in its process group dies with the run, so a finished
job never leaves processes (or pipes held open) behind.

Output is captured through bounded buffers, so a function that prints
gigabytes cannot exhaust the platform's memory; the result message follows
the FunctionJob contract: the JSON result (from the runner's SLESS_RESULT_FILE
pipe, never mixed with what the handler prints) on success, stderr (the
traceback) on failure, cut to ~2000 characters.

With a sandbox the runner runs jailed like the function's server (sandbox.py),
with RLIMIT_CPU as well; a run ended by a limit says so in its message.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from sless_api.backends.standalone.builder import BuildArtifact
from sless_api.backends.standalone.host.fdwait import readable_within
from sless_api.backends.standalone.host.network import NetworkUnavailable
from sless_api.backends.standalone.host.process import kill_group, set_parent_death_signal
from sless_api.backends.standalone.host.sandbox import JailSpec, Prepared, Sandbox

#: Length limit of RunResult.output (the FunctionJob's message).
MAX_OUTPUT_CHARS = 2000
#: Seconds the runner gets beyond the function's timeout before it is killed.
KILL_MARGIN_SEC = 5.0
#: Exit status of a runtime runner whose handler hit SLESS_TIMEOUT_SEC.
EXIT_TIMEOUT = 124
#: Bytes kept from each end of a stream (enough for MAX_OUTPUT_CHARS of any UTF-8).
_KEEP_BYTES = 64 * 1024
#: Seconds to wait for the output pipes to close once the process group is dead.
_DRAIN_SEC = 5.0
TRUNCATION_MARK = "[... truncated ...]"


@dataclass(frozen=True)
class RunResult:
    """Outcome of one run; ``output`` is the job's message (result JSON or error text)."""

    ok: bool
    output: str
    exit_code: int | None  # negative: killed by that signal; None: could not start
    duration_s: float
    timed_out: bool = False
    #: what the run printed, as the call logs keep a call's lines: (stream, line), stdout's first, then stderr's
    printed: tuple[tuple[str, str], ...] = ()


class _Capture(threading.Thread):
    """Reads a pipe to EOF keeping its first and last _KEEP_BYTES bytes."""

    def __init__(self, stream: IO[bytes]) -> None:
        super().__init__(daemon=True)
        self._fd = stream.fileno()
        self._stream = stream
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def run(self) -> None:
        try:
            while chunk := os.read(self._fd, 65536):
                self.total += len(chunk)
                if len(self.head) < _KEEP_BYTES:
                    self.head += chunk[: _KEEP_BYTES - len(self.head)]
                self.tail += chunk
                if len(self.tail) > 2 * _KEEP_BYTES:
                    del self.tail[: len(self.tail) - _KEEP_BYTES]
        except OSError:
            pass
        finally:
            self._stream.close()

    def first_text(self) -> tuple[str, bool]:
        """The start of the stream as text, and whether more followed."""
        return self.head.decode("utf-8", errors="replace"), self.total > len(self.head)

    def last_text(self) -> tuple[str, bool]:
        """The end of the stream as text, and whether something came before it."""
        return self.tail.decode("utf-8", errors="replace"), self.total > len(self.tail)


def keep_start(text: str, cut_before: bool = False, limit: int = MAX_OUTPUT_CHARS) -> str:
    """``text`` cut to ``limit`` chars keeping its start (a JSON result reads from the front)."""
    if len(text) <= limit and not cut_before:
        return text
    return text[: limit - len(TRUNCATION_MARK) - 1] + "\n" + TRUNCATION_MARK


def keep_end(text: str, cut_before: bool = False, limit: int = MAX_OUTPUT_CHARS) -> str:
    """``text`` cut to ``limit`` chars keeping its end (a traceback's last lines say what failed)."""
    if len(text) <= limit and not cut_before:
        return text
    return TRUNCATION_MARK + "\n" + text[-(limit - len(TRUNCATION_MARK) - 1) :]


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait up to ``timeout`` for the process to exit WITHOUT reaping it.

    While it is an unreaped zombie its pid cannot be reused, so killing its
    process group afterwards cannot hit an unrelated process.
    """
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux >= 5.3: reap, then kill the group (tiny race)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        return readable_within(pidfd, timeout)
    finally:
        os.close(pidfd)


def _die_with_platform() -> None:
    """preexec hook: SIGKILL the runner when the platform dies (a job never outlives it)."""
    set_parent_death_signal(signal.SIGKILL)


#: How often a run is started when its network set-up fails on the way (a pipe to the sandbox broken, or bwrap or
#: pasta too slow, under load): the supervisor's server processes are started again when theirs breaks.
NETWORK_ATTEMPTS = 3


def run_once(
    artifact: BuildArtifact,
    event: dict[str, Any],
    timeout_sec: float,
    *,
    env: Mapping[str, str] | None = None,
    sandbox: Sandbox | None = None,
    jail: JailSpec | None = None,
) -> RunResult:
    """Run the function once with ``event``; synchronous (call it from a worker thread).

    ``env``: the function's own variables (the contract's SLESS_* always win).
    ``sandbox`` and ``jail``: where it runs (see sandbox.py); without them a plain child process.
    A network set-up that failed before the function started (broken on the way, or bwrap or pasta too slow on
    a loaded host) is tried again with a fresh sandbox: nothing of the function ran yet.
    """
    for attempt in range(1, NETWORK_ATTEMPTS + 1):
        result = _run_once(artifact, event, timeout_sec, env, sandbox, jail, retry=attempt < NETWORK_ATTEMPTS)
        if result is not None:
            return result
    raise AssertionError("unreachable: the last attempt returns its result")


def _run_once(artifact: BuildArtifact, event: dict[str, Any], timeout_sec: float, env: Mapping[str, str] | None,
              sandbox: Sandbox | None, jail: JailSpec | None, retry: bool) -> RunResult | None:
    """One attempt of ``run_once``; None when its network set-up broke and RETRY allows another."""
    argv, base_env = artifact.runner_command()
    full_env = {**base_env, **(env or {})}
    full_env.update(base_env)
    full_env["SLESS_EVENT"] = json.dumps(event)
    full_env["SLESS_TIMEOUT_SEC"] = f"{timeout_sec:g}"
    started = time.monotonic()
    prepared: Prepared | None = None
    # The result comes back on a pipe of its own: what the handler prints on stdout is its log, not its result.
    result_read, result_write = os.pipe()
    full_env["SLESS_RESULT_FILE"] = f"/dev/fd/{result_write}"
    try:
        if sandbox is not None and jail is not None:
            prepared = sandbox.prepare(argv, artifact.code_dir, jail, f"run-{jail.tenant}")
            full_env.update(prepared.env)
        proc = subprocess.Popen(
            prepared.argv if prepared is not None else argv,
            cwd=artifact.code_dir,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=(result_write, *(prepared.pass_fds if prepared is not None else ())),
            preexec_fn=prepared.preexec if prepared is not None else _die_with_platform,  # noqa: PLW1509 - prctl, cgroup join, rlimits
        )
    except OSError as exc:  # e.g. E2BIG: the event does not fit into the environment
        os.close(result_read)
        if prepared is not None:
            prepared.cleanup()
        return RunResult(False, keep_end(f"cannot start the runner: {exc}"), None, 0.0)
    finally:
        os.close(result_write)  # the child holds its own copy: EOF comes when the run ends
        if prepared is not None:
            prepared.release_fds()
    assert proc.stdout is not None and proc.stderr is not None
    if prepared is not None:
        try:
            prepared.attach()  # its own network, then the runner starts
        except NetworkUnavailable as exc:
            prepared.kill(proc.pid)
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
            os.close(result_read)
            prepared.cleanup()
            if retry:  # nothing of the function ran: a host slow or short of something now may not be next time
                return None
            return RunResult(False, keep_end(f"cannot start the runner: {exc}"), None, 0.0)
    out, err = _Capture(proc.stdout), _Capture(proc.stderr)
    result = _Capture(os.fdopen(result_read, "rb"))
    for capture in (out, err, result):
        capture.start()
    exited = _wait_exit(proc, timeout_sec + KILL_MARGIN_SEC)
    if prepared is not None and not exited:
        prepared.kill(proc.pid)  # the sandbox's PID 1 first, so nothing is orphaned
        _wait_exit(proc, 1.0)
    kill_group(proc.pid)  # the stuck runner, or whatever it left behind
    exit_code = proc.wait()
    limit_note = None
    if prepared is not None:
        limit_note = prepared.exit_note(exit_code)
        prepared.cleanup()  # the sandbox's cgroup: anything left in it dies
    duration = time.monotonic() - started
    for capture in (out, err, result):
        capture.join(_DRAIN_SEC)
    printed = (*printed_lines("stdout", *out.first_text()), *printed_lines("stderr", *err.last_text(), tail=True))

    if exited and exit_code == 0:
        text, more = result.first_text()
        return RunResult(True, keep_start(text.rstrip("\n"), more), 0, duration, printed=printed)
    text, earlier = err.last_text()
    text = text.rstrip("\n")
    if not exited:
        note = (
            f"[sless] runner killed after {duration:.1f}s: it did not stop at its "
            f"{timeout_sec:g}s timeout (+{KILL_MARGIN_SEC:g}s margin)"
        )
        text = f"{text}\n{note}" if text else note
    elif not text:
        text = f"[sless] runner exited with code {exit_code} and no error output"
    if limit_note:
        text = f"{text}\n[sless] {limit_note}"
    timed_out = not exited or exit_code == EXIT_TIMEOUT
    return RunResult(False, keep_end(text, earlier), exit_code, duration, timed_out, printed)


def printed_lines(stream: str, text: str, cut: bool, tail: bool = False) -> list[tuple[str, str]]:
    """A stream's kept text as (stream, line) pairs; where the capture kept only its start (or, with TAIL, its
    end), a line says so in its place."""
    lines = [(stream, line) for line in text.splitlines()]
    if cut:
        mark = (stream, f"[sless] {'earlier' if tail else 'later'} output of this run was not kept")
        lines = [mark, *lines] if tail else [*lines, mark]
    return lines
