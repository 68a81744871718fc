"""sless Python runtime, one-shot mode (jobs and cron): call the handler once and exit.

Reads the event from SLESS_EVENT (JSON object, default {}), writes the result as
one JSON line to SLESS_RESULT_FILE (stdout when unset) and exits 0. Exit codes: 1 handler failed (or cannot be
loaded, or its result is not JSON), 2 bad SLESS_EVENT or configuration, 3 the code could not be fetched
(``sless_fetch``),
124 timed out after SLESS_TIMEOUT_SEC (like coreutils `timeout`).
The handler runs in a daemon thread so that a timeout can end the process even
though Python cannot interrupt the handler itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import sys
import threading
import time
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import sless_runtime as rt  # noqa: E402
import sless_stream  # noqa: E402

# The user's modules must not be shadowed by this directory (e.g. their own "runner.py").
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124


def _exit(code: int) -> None:
    """Flush and leave at once, without waiting for threads the handler may have left running."""
    with contextlib.suppress(Exception):  # a broken user log handler must not change the exit code
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def read_event(raw: str | None) -> dict[str, Any]:
    """The event from SLESS_EVENT; raises ValueError with the reason."""
    if raw is None or not raw.strip():
        return {}
    try:
        event = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"SLESS_EVENT is not valid JSON: {exc}") from None
    if not isinstance(event, dict):
        raise ValueError(f"SLESS_EVENT must be a JSON object, not {type(event).__name__}")
    return event


def add_cron_tick(event: dict[str, Any], job_name: str | None) -> dict[str, Any]:
    """A cron firing on Kubernetes: the tick it was scheduled for, as ``scheduled_at`` (what `sless up` sends).

    A CronJob names each Job ``<cronjob>-<minutes since the epoch of its tick>``; the pod reads that name
    into SLESS_CRON_JOB (downward API), as its event cannot hold a per-run value.
    """
    minutes = (job_name or "").rpartition("-")[2]
    if event.get("type") == "cron" and "scheduled_at" not in event and minutes.isascii() and minutes.isdigit():
        event["scheduled_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(minutes) * 60))
    return event


def call(handler: rt.Handler, event: dict[str, Any]) -> Any:
    """Call the handler; an async handler (or returned awaitable) runs on a fresh event loop."""
    result = handler(event)
    if inspect.isawaitable(result):

        async def wait() -> Any:
            return await result

        result = asyncio.run(wait())
    return sless_stream.collect_streams(result)  # a stream is read to its end within the time limit


def write_result(path: str, data: bytes) -> None:
    """Write DATA to PATH; ``/dev/fd/N`` is the inherited descriptor N itself (a pipe the platform passed,
    which a sandboxed user could not reopen by path)."""
    inherited = path.removeprefix("/dev/fd/")
    if inherited != path and inherited.isdigit():
        view = memoryview(data)
        while view:
            view = view[os.write(int(inherited), view):]
        return
    with open(path, "wb") as out:
        out.write(data)


def main() -> None:
    """Run the handler once; see the module docstring for the exit codes."""
    rt.fetch_code()  # on Kubernetes the code is fetched first (exit 3 when it cannot be)
    try:
        config = rt.Config.from_env()
        event = add_cron_tick(read_event(os.environ.get("SLESS_EVENT")), os.environ.get("SLESS_CRON_JOB"))
    except ValueError as exc:
        rt.log(str(exc))
        _exit(EXIT_USAGE)
        return
    try:
        handler = rt.load_handler(config)
    except rt.LoadError as exc:
        rt.log_load_failure(config, exc)
        _exit(EXIT_FAILED)
        return
    if os.environ.get("SLESS_CHECK_ONLY"):  # the build's check: the entrypoint loads; the handler is not called
        _exit(0)

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = call(handler, event)
        except BaseException as exc:  # SystemExit included: report it as a failure
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="sless-handler", daemon=True)
    thread.start()
    thread.join(config.timeout_sec)
    if thread.is_alive():
        rt.log(rt.timeout_message(config.timeout_sec))
        _exit(EXIT_TIMEOUT)
    if "error" in outcome:
        rt.log_exception("handler failed", outcome["error"])
        _exit(EXIT_FAILED)
    try:
        data = rt.to_json(outcome.get("result"))
    except rt.InvalidResponse as exc:
        rt.log(str(exc))
        _exit(EXIT_FAILED)
        return
    sys.stdout.flush()
    result_file = os.environ.get("SLESS_RESULT_FILE")
    if result_file:  # the platform's own channel: what the handler printed stays out of the result
        try:
            write_result(result_file, data + b"\n")
        except OSError as exc:
            rt.log(f"cannot write the result to SLESS_RESULT_FILE: {exc}")
            _exit(EXIT_FAILED)
    else:
        sys.stdout.buffer.write(data + b"\n")
    _exit(0)


if __name__ == "__main__":
    main()
