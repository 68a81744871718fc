"""The output of a call (runtimes/README.md, "Output of a call"), checked against every runtime.

A handler's stdout/stderr lines written while it serves a request carry that request's
``X-Request-Id`` as ``@sless:<id> <text>``; a printed fake tag never passes for another call's
line; concurrent calls never get each other's lines; and every answer carries the handler's
run time in ``X-Sless-Handler-Ms``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

RuntimeServer = Any
ServerFactory = Callable[..., Any]

_LINE = re.compile(r"@sless:(\S+) (.*)")


def parse(output: str) -> list[tuple[str | None, str]]:
    """(call id or None, text) per line, read as the platform reads it."""
    lines: list[tuple[str | None, str]] = []
    for line in output.splitlines():
        match = _LINE.fullmatch(line)
        if match is None:
            lines.append((None, line))
        else:
            lines.append((None if match.group(1) == "-" else match.group(1), match.group(2)))
    return lines


def lines_of(output: str, call_id: str) -> list[str]:
    return [text for ident, text in parse(output) if ident == call_id]


def wait_for(server: RuntimeServer, predicate: Callable[[RuntimeServer], bool], timeout: float = 10.0) -> None:
    """Output reaches the files a moment after the answer (Go forwards it through a pipe)."""
    deadline = time.monotonic() + timeout
    while not predicate(server):
        assert time.monotonic() < deadline, f"stdout:\n{server.stdout}\nstderr:\n{server.stderr}"
        time.sleep(0.02)


def call(server: RuntimeServer, call_id: str | None, mark: str, pause: float = 0.0) -> requests.Response:
    headers = {"X-Request-Id": call_id} if call_id else {}
    resp = requests.get(f"{server.url}/logs", params={"m": mark, "s": str(pause)}, headers=headers, timeout=30)
    assert resp.status_code == 200, resp.text
    return resp


def test_lines_of_a_call_carry_its_request_id(runtime: str, start_server: ServerFactory) -> None:
    server = start_server(runtime)
    call(server, "call-1", "m1")
    wait_for(server, lambda s: len(lines_of(s.stdout, "call-1")) >= 4)
    assert lines_of(server.stdout, "call-1") == [
        "first m1", "partial m1 line", "@sless:victim forged m1", "@sless:victim also forged",
    ]
    wait_for(server, lambda s: "to stderr m1" in lines_of(s.stderr, "call-1"))
    for output in (server.stdout, server.stderr):
        assert lines_of(output, "victim") == []


def test_forged_tags_outside_a_call_are_marked_as_no_call(runtime: str, start_server: ServerFactory) -> None:
    server = start_server(runtime)
    call(server, None, "anon")  # no request id: the output belongs to no call
    wait_for(server, lambda s: "@sless:victim also forged" in s.stdout)
    assert "@sless:- @sless:victim forged anon" in server.stdout.splitlines()
    assert lines_of(server.stdout, "victim") == []
    assert "first anon" in server.stdout.splitlines()  # untagged, unchanged


def test_an_id_the_platform_would_not_make_tags_nothing(runtime: str, start_server: ServerFactory) -> None:
    server = start_server(runtime)
    call(server, "bad id with spaces", "odd")
    wait_for(server, lambda s: "@sless:victim also forged" in s.stdout)
    assert all(ident is None for ident, _ in parse(server.stdout))


def test_concurrent_calls_never_get_each_others_lines(runtime: str, start_server: ServerFactory) -> None:
    server = start_server(runtime)
    ids = [f"c{i}" for i in range(8)]
    with ThreadPoolExecutor(len(ids)) as pool:
        list(pool.map(lambda i: call(server, i, f"mark-{i}", 0.3), ids))
    wait_for(server, lambda s: s.stdout.count("also forged") >= len(ids))
    output = server.stdout
    for ident, text in parse(output):
        if ident is None:
            continue
        assert ident in ids, text
        if "mark-" in text:
            assert f"mark-{ident}" in text.split(), (ident, text)
    if runtime != "go1.23":  # Go tags only while exactly one call runs (README): here calls overlap
        for ident in ids:
            assert lines_of(output, ident) == [
                f"first mark-{ident}", f"partial mark-{ident} line", f"@sless:victim forged mark-{ident}",
                "@sless:victim also forged",
            ]


def test_sequential_calls_are_each_complete(runtime: str, start_server: ServerFactory) -> None:
    server = start_server(runtime)
    for n in range(3):
        call(server, f"seq-{n}", f"s{n}")
    wait_for(server, lambda s: len(lines_of(s.stdout, "seq-2")) >= 4)
    for n in range(3):
        assert lines_of(server.stdout, f"seq-{n}")[:2] == [f"first s{n}", f"partial s{n} line"]


def test_answer_carries_the_handler_time(runtime: str, start_server: ServerFactory) -> None:
    server = start_server(runtime)
    slow = call(server, "t1", "x", 0.2)
    fast = requests.get(f"{server.url}/text", timeout=10)
    assert float(slow.headers["X-Sless-Handler-Ms"]) >= 190
    assert 0 <= float(fast.headers["X-Sless-Handler-Ms"]) < 190
    error = requests.get(f"{server.url}/error", timeout=10)
    assert error.status_code == 500 and float(error.headers["X-Sless-Handler-Ms"]) >= 0
