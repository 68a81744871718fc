"""The access log's direct JSON line is the line the logging chain writes for the same request, field for field and
in the same order; any set-up other than ``configure_logging``'s JSON one takes the logging chain."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sless_api.gateway.accesslog import access, flush_access_lines, log_access
from sless_api.logsetup import LogSettings, configure_logging, current_request_id, json_stream_handler


@pytest.fixture
def stderr_log() -> Iterator[io.StringIO]:
    """Where the configured handler writes (pytest swaps sys.stderr between a fixture and its test)."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    yield io.StringIO()
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    access.filters.clear()


def configure(out: io.StringIO, **settings: str) -> None:
    configure_logging(LogSettings(**settings))
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(out)


PATH = "/fn/sless-0123456789abcdef/hello/ünï"
# A decoded path may hold anything a client percent-escaped: quotes, backslashes, line breaks, control characters.
HOSTILE_PATH = '/fn/sless-0123456789abcdef/hello/a"b\\c\nd\re\x00f\x1fg\u2028h"}'


def logged_line(out: io.StringIO, client: str | None = "10.0.0.7", path: str = PATH) -> dict[str, Any]:
    token = current_request_id.set("0123456789abcdef0123456789abcdef")
    try:
        log_access("POST", path, 201, 42, time.monotonic(), client, "0123456789abcdef0123456789abcdef")
    finally:
        current_request_id.reset(token)
    lines = out.getvalue().split("\n")[:-1]  # not splitlines: U+2028 in a path is no line break of the log
    out.seek(0)
    out.truncate()
    assert len(lines) == 1
    parsed: dict[str, Any] = json.loads(lines[0])
    return parsed


class Veto(logging.Filter):
    """Lets every record through; its presence alone must send lines through the logging chain."""

    def filter(self, record: logging.LogRecord) -> bool:
        return True


@pytest.mark.parametrize(("client", "path"), [("10.0.0.7", PATH), (None, PATH), ("10.0.0.7", HOSTILE_PATH)])
def test_the_direct_line_is_the_logging_chains_line(stderr_log: io.StringIO, client: str | None, path: str) -> None:
    configure(stderr_log, format="json")
    assert json_stream_handler(access) is not None
    direct = logged_line(stderr_log, client, path)
    access.addFilter(Veto())
    assert json_stream_handler(access) is None
    chained = logged_line(stderr_log, client, path)
    assert list(direct) == list(chained)  # the same fields in the same order
    assert isinstance(direct["duration_ms"], float) and isinstance(direct["ts"], str)
    for line in (direct, chained):
        line.pop("ts"), line.pop("duration_ms")
    assert direct == chained
    assert direct["msg"] == f"POST {path} 201" and direct["path"] == path and ("client" in direct) == bool(client)


def test_the_timestamp_has_the_formatters_shape(stderr_log: io.StringIO) -> None:
    configure(stderr_log, format="json")
    ts = logged_line(stderr_log)["ts"]
    assert len(ts) == len("2026-12-01T16:20:03.123Z") and ts.endswith("Z") and ts[19] == "."


def test_text_format_and_extra_handlers_take_the_logging_chain(stderr_log: io.StringIO) -> None:
    configure(stderr_log, format="text")
    assert json_stream_handler(access) is None
    configure(stderr_log, format="json")
    extra = logging.StreamHandler(io.StringIO())
    logging.getLogger().addHandler(extra)
    assert json_stream_handler(access) is None
    logging.getLogger().removeHandler(extra)
    assert json_stream_handler(access) is not None
    configure(stderr_log, format="json", level="WARNING")
    assert json_stream_handler(access) is None


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_lines_of_one_loop_turn_leave_together_at_its_end(stderr_log: io.StringIO) -> None:
    counting = CountingStream()
    configure(counting, format="json")

    async def main() -> tuple[str, str]:
        for status in (200, 201, 202):
            log_access("GET", "/fn/sless-0123456789abcdef/hello", status, 2, time.monotonic(), None, "r" * 32)
        during = counting.getvalue()
        await asyncio.sleep(0)  # the turn ends
        return during, counting.getvalue()

    during, after = asyncio.run(main())
    assert during == "" and counting.writes == 1
    assert [json.loads(line)["status"] for line in after.splitlines()] == [200, 201, 202]


def test_a_forked_worker_writes_its_own_pid(stderr_log: io.StringIO) -> None:
    """gunicorn forks its workers after the app's modules were imported: the pid the line carries is the worker's."""
    configure(stderr_log, format="json")
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the child: one line to the pipe, then out without running the parent's cleanup
        try:
            configure(io.StringIO(), format="json")
            out = io.StringIO()
            logging.getLogger().handlers[0].setStream(out)  # type: ignore[attr-defined]
            log_access("GET", "/fn/sless-0123456789abcdef/hello", 200, 2, time.monotonic(), None, "r" * 32)
            flush_access_lines()
            os.write(write_end, out.getvalue().encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        line = json.loads(pipe.read())
    os.waitpid(child, 0)
    assert line["pid"] == child != os.getpid()
