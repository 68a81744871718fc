"""``X-Sless-Output`` (runtimes/README.md, "Output of a call"), checked against the Python and Node runtimes.

An answer carries the lines its call wrote before the answer's head went out, as padded base64 of
``{"lines": [{"stream", "text", "ts"}], "truncated"}``: both streams in the order written, a last line
without its newline, at most 16384 bytes of text (the first line that does not fit and every later one
left out), none at all for a call that wrote nothing, never the handler's own header of that name, the
lines of the failing handler with its error, only a stream's lines before its head, and only the call's
own lines while calls overlap. The lines are still written, tagged, to stdout and stderr.

The handlers are written here (``HANDLERS``), not in tests/runtimes/functions: these cases need output the
shared test functions do not write. Go's cases are in their own file.
"""

from __future__ import annotations

import base64
import binascii
import http.client
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.services import free_port
from tests.support.spares import Procs, wait_byte

RuntimeServer = Any
ServerFactory = Callable[..., Any]

RUNTIMES_DIR = Path(__file__).resolve().parents[2] / "runtimes"
#: The largest text (UTF-8 bytes) X-Sless-Output holds.
MAX_TEXT_BYTES = 16384
#: The most lines it holds (the contract's cap, as sless_api.domain.calloutput.MAX_LINES).
MAX_LINES = 1024
#: Text that needs UTF-8 and JSON escaping both.
UTF8_TEXT = 'héllo wörld ☃ 😀 ünïcödé, quote " backslash \\ tab \t end'

PYTHON_HANDLER = f"""\
import asyncio
import sys
import threading

UTF8 = {json.dumps(UTF8_TEXT, ensure_ascii=False)}
_arrivals = {{}}
_arrivals_lock = threading.Lock()


def arrival(name):
    with _arrivals_lock:
        return _arrivals.setdefault(name, threading.Event())


def handle(event):
    path, query = event["_path"], event["_query"]
    if path == "/silent":
        return {{"ok": True}}
    if path == "/streams":
        print("out one")
        print("err one", file=sys.stderr)
        sys.stdout.write("out two\\n")
        sys.stderr.write("err two\\n")
        return "done"
    if path == "/utf8":
        print(UTF8)
        return "done"
    if path == "/partial":
        print("whole")
        print("no newline", end="")
        return "done"
    if path == "/big":
        for text in ("a" * 10000, "é" * 3000, "b" * 384, "c", "d"):
            print(text)
        return "done"
    if path == "/many":
        sys.stdout.write("\\n" * 5000)
        return "done"
    if path == "/forged":
        if query.get("print"):
            print("real line")
        return {{"statusCode": 200, "headers": {{"X-Sless-Output": "forged", "x-sless-output": "forged too"}},
                "body": "ok"}}
    if path == "/fail":
        print("about to fail")
        raise RuntimeError("boom")
    if path == "/stream":
        print("before the stream")

        def chunks():
            print("in the stream, before its head")
            yield "first"
            print("after the head")
            yield "second"

        return chunks()
    if path == "/pair":
        name, other = query["name"], query["other"]
        print(f"{{name}} first")
        arrival(name).set()
        met = arrival(other).wait(10)
        print(f"{{name}} second", file=sys.stderr)
        return {{"met": met}}
    if path == "/hang":
        print("waiting")
        threading.Event().wait(5)
        return "late"
    return {{"statusCode": 404}}


async def handle_async(event):
    print("before an await")
    await asyncio.sleep(0)
    print("after an await", file=sys.stderr)

    async def in_a_task():
        print("in a task")

    await asyncio.create_task(in_a_task())
    if event["_path"] == "/fail":
        raise RuntimeError("boom")
    if event["_path"] == "/stream":

        async def chunks():
            print("in the stream, before its head")
            yield "first"
            print("after the head")
            yield "second"

        return chunks()
    return "done"
"""

NODE_HANDLER = f"""\
'use strict';
const UTF8 = {json.dumps(UTF8_TEXT, ensure_ascii=False)};
const arrivals = new Map();

function arrival(name) {{
  let entry = arrivals.get(name);
  if (!entry) {{
    let resolve;
    const promise = new Promise((r) => {{ resolve = r; }});
    entry = {{ promise, resolve }};
    arrivals.set(name, entry);
  }}
  return entry;
}}

const tick = () => new Promise((resolve) => setImmediate(resolve));

exports.handle = (event) => {{
  const query = event._query;
  switch (event._path) {{
    case '/silent':
      return {{ ok: true }};
    case '/streams':
      console.log('out one');
      console.error('err one');
      process.stdout.write('out two\\n');
      process.stderr.write('err two\\n');
      return 'done';
    case '/utf8':
      console.log(UTF8);
      return 'done';
    case '/partial':
      console.log('whole');
      process.stdout.write('no newline');
      return 'done';
    case '/big':
      for (const text of ['a'.repeat(10000), 'é'.repeat(3000), 'b'.repeat(384), 'c', 'd']) console.log(text);
      return 'done';
    case '/many':
      process.stdout.write('\\n'.repeat(5000));
      return 'done';
    case '/forged':
      if (query.print) console.log('real line');
      return {{ statusCode: 200, headers: {{ 'X-Sless-Output': 'forged' }}, body: 'ok' }};
    case '/fail':
      console.log('about to fail');
      throw new Error('boom');
    case '/stream':
      console.log('before the stream');
      return (async function* chunks() {{
        console.log('in the stream, before its head');
        yield 'first';
        console.log('after the head');
        yield 'second';
      }})();
    case '/pair':
      return (async () => {{
        console.log(`${{query.name}} first`);
        arrival(query.name).resolve();
        const late = new Promise((resolve) => setTimeout(() => resolve(false), 10000).unref());
        const met = await Promise.race([arrival(query.other).promise.then(() => true), late]);
        console.error(`${{query.name}} second`);
        return {{ met }};
      }})();
    case '/async':
      return (async () => {{
        console.log('before an await');
        await new Promise((resolve) => setTimeout(resolve, 1));
        process.stderr.write('after an await\\n');
        await tick();
        console.log('in a continuation');
        return 'done';
      }})();
    case '/fail-async':
      return (async () => {{
        console.log('about to fail');
        await tick();
        throw new Error('boom');
      }})();
    case '/hang':
      console.log('waiting');
      return new Promise(() => {{}});
    default:
      return {{ statusCode: 404 }};
  }}
}};
"""

HANDLERS = {"python3.11": ("handler.py", PYTHON_HANDLER), "nodejs20": ("handler.js", NODE_HANDLER)}

@pytest.fixture(params=["python3.11", "nodejs20"])
def runtime(request: pytest.FixtureRequest) -> str:
    """The runtimes this file checks (go1.23's cases are elsewhere)."""
    name: str = request.param
    if name == "nodejs20" and shutil.which("node") is None:
        pytest.skip("node is not installed")
    return name


@pytest.fixture
def code(runtime: str, tmp_path: Path) -> Path:
    """The folder with this file's handler for ``runtime``."""
    folder = tmp_path / "code"
    folder.mkdir()
    name, text = HANDLERS[runtime]
    (folder / name).write_text(text, encoding="utf-8")
    return folder


@pytest.fixture
def server(runtime: str, code: Path, start_server: ServerFactory) -> RuntimeServer:
    return start_server(runtime, code)


def output_of(resp: requests.Response) -> dict[str, Any] | None:
    """The answer's X-Sless-Output decoded (None: no header), checked to be what the contract says."""
    value = resp.headers.get("X-Sless-Output")
    if value is None:
        return None
    assert len(value) % 4 == 0, value  # padded
    try:
        document: dict[str, Any] = json.loads(base64.b64decode(value, validate=True).decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise AssertionError(f"X-Sless-Output is not base64 of UTF-8 JSON: {value!r}") from exc
    assert set(document) == {"lines", "truncated"} and isinstance(document["truncated"], bool), document
    for line in document["lines"]:
        assert set(line) == {"stream", "text", "ts"} and line["stream"] in ("stdout", "stderr"), line
        assert isinstance(line["text"], str) and isinstance(line["ts"], (int, float)), line
    return document


def lines_in(resp: requests.Response) -> list[tuple[str, str]]:
    """(stream, text) of each line in the answer's X-Sless-Output (which must be there)."""
    document = output_of(resp)
    assert document is not None, f"no X-Sless-Output: {dict(resp.headers)}"
    return [(line["stream"], line["text"]) for line in document["lines"]]


def get(server: RuntimeServer, path: str, call_id: str = "call-1", **params: str) -> requests.Response:
    return requests.get(f"{server.url}{path}", params=params, headers={"X-Request-Id": call_id}, timeout=30)


def tagged(output: str, call_id: str) -> list[str]:
    """The texts of ``call_id``'s tagged lines in a process's output."""
    prefix = f"@sless:{call_id} "
    return [line[len(prefix):] for line in output.splitlines() if line.startswith(prefix)]


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def test_lines_of_both_streams_in_the_order_written(server: RuntimeServer) -> None:
    before = time.time()
    resp = get(server, "/streams")
    after = time.time()
    assert resp.status_code == 200 and resp.text == "done"
    document = output_of(resp)
    assert document is not None and document["truncated"] is False
    assert [(line["stream"], line["text"]) for line in document["lines"]] == [
        ("stdout", "out one"), ("stderr", "err one"), ("stdout", "out two"), ("stderr", "err two")]
    stamps = [line["ts"] for line in document["lines"]]
    assert stamps == sorted(stamps)
    assert before - 0.002 <= stamps[0] and stamps[-1] <= after + 0.002, (before, stamps, after)
    # still written, tagged, to the process's output
    wait_for(lambda: tagged(server.stdout, "call-1") == ["out one", "out two"], "stdout lines")
    wait_for(lambda: tagged(server.stderr, "call-1") == ["err one", "err two"], "stderr lines")


def test_text_is_utf8_and_json_escaped(server: RuntimeServer) -> None:
    assert lines_in(get(server, "/utf8")) == [("stdout", UTF8_TEXT)]


def test_a_last_line_without_its_newline_counts_once(server: RuntimeServer) -> None:
    assert lines_in(get(server, "/partial", "partial-1")) == [("stdout", "whole"), ("stdout", "no newline")]
    get(server, "/streams", "after-it")  # the next call neither continues that line nor writes it again
    wait_for(lambda: "out one" in tagged(server.stdout, "after-it"), "the next call's lines")
    assert tagged(server.stdout, "partial-1") == ["whole", "no newline"]


def test_text_beyond_16384_bytes_is_left_out_from_the_first_line_that_does_not_fit(server: RuntimeServer) -> None:
    document = output_of(get(server, "/big", "big-1"))
    assert document is not None and document["truncated"] is True
    texts = [line["text"] for line in document["lines"]]
    assert texts == ["a" * 10000, "é" * 3000, "b" * 384]  # 10000 + 6000 + 384 bytes: exactly the cap
    assert sum(len(text.encode()) for text in texts) == MAX_TEXT_BYTES
    # "c" would not fit, and "d" comes after it; both are in the process's output all the same
    wait_for(lambda: tagged(server.stdout, "big-1")[-2:] == ["c", "d"], "every line on stdout")


def test_many_empty_lines_are_capped_too(server: RuntimeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty lines cost no text: their number has a cap of its own (the contract's)."""
    monkeypatch.setattr(http.client, "_MAXLINE", 1 << 20)  # 1024 lines make a header of about 70 KB
    document = output_of(get(server, "/many"))
    assert document is not None and document["truncated"] is True
    assert len(document["lines"]) == MAX_LINES
    assert {(line["stream"], line["text"]) for line in document["lines"]} == {("stdout", "")}


def test_a_call_that_writes_nothing_gets_no_header(server: RuntimeServer) -> None:
    resp = get(server, "/silent")
    assert resp.status_code == 200 and "X-Sless-Output" not in resp.headers
    assert "X-Sless-Handler-Ms" in resp.headers
    health = requests.get(f"{server.url}/_/health", headers={"X-Request-Id": "h"}, timeout=10)
    assert health.status_code == 200 and "X-Sless-Output" not in health.headers


def test_the_handlers_own_header_is_dropped(server: RuntimeServer) -> None:
    silent = get(server, "/forged")
    assert silent.status_code == 200 and silent.text == "ok"
    assert "X-Sless-Output" not in silent.headers
    printed = get(server, "/forged", print="1")
    assert "forged" not in printed.headers["X-Sless-Output"]
    assert lines_in(printed) == [("stdout", "real line")]


@pytest.mark.parametrize("path", ["/fail", "/fail-async"])
def test_the_error_answer_of_a_failing_handler_carries_its_lines(runtime: str, code: Path,
                                                                 start_server: ServerFactory, path: str) -> None:
    if path == "/fail-async" and runtime == "python3.11":
        server = start_server(runtime, code, {"SLESS_ENTRYPOINT": "handler.handle_async"})
        first = ("stdout", "before an await")
        path = "/fail"
    else:
        server = start_server(runtime, code)
        first = ("stdout", "about to fail")
    resp = get(server, path)
    assert resp.status_code == 500 and resp.json()["error"] == "boom"
    lines = lines_in(resp)
    assert lines[0] == first
    assert any(stream == "stderr" and "boom" in text for stream, text in lines), lines  # the logged error


def test_a_stream_carries_only_the_lines_before_its_head(server: RuntimeServer) -> None:
    resp = get(server, "/stream", "stream-1")
    assert resp.status_code == 200 and resp.text == "firstsecond"
    assert lines_in(resp) == [("stdout", "before the stream"), ("stdout", "in the stream, before its head")]
    wait_for(lambda: "after the head" in tagged(server.stdout, "stream-1"), "the line after the head on stdout")


def test_concurrent_calls_get_only_their_own_lines(server: RuntimeServer) -> None:
    """The two calls write while both run (each waits for the other's first line), with the same request id:
    the lines are the call's, not the id's."""

    def pair(name: str, other: str) -> requests.Response:
        return get(server, "/pair", "same-id", name=name, other=other)

    with ThreadPoolExecutor(2) as pool:
        left, right = pool.map(pair, ["left", "right"], ["right", "left"])
    assert left.json() == {"met": True} and right.json() == {"met": True}
    assert lines_in(left) == [("stdout", "left first"), ("stderr", "left second")]
    assert lines_in(right) == [("stdout", "right first"), ("stderr", "right second")]


def test_lines_of_async_continuations_are_the_calls(runtime: str, code: Path, start_server: ServerFactory) -> None:
    if runtime == "python3.11":
        server = start_server(runtime, code, {"SLESS_ENTRYPOINT": "handler.handle_async"})
        expected = [("stdout", "before an await"), ("stderr", "after an await"), ("stdout", "in a task")]
        resp = get(server, "/")
    else:
        server = start_server(runtime, code)
        expected = [("stdout", "before an await"), ("stderr", "after an await"), ("stdout", "in a continuation")]
        resp = get(server, "/async")
    assert resp.status_code == 200 and resp.text == "done"
    assert lines_in(resp) == expected


@pytest.mark.parametrize("runtime", ["python3.11"])  # a Node stream is async already (the test above)
def test_an_async_stream_carries_only_the_lines_before_its_head(runtime: str, code: Path,
                                                                start_server: ServerFactory) -> None:
    server = start_server(runtime, code, {"SLESS_ENTRYPOINT": "handler.handle_async"})
    resp = get(server, "/stream", "stream-2")
    assert resp.status_code == 200 and resp.text == "firstsecond"
    assert [text for _, text in lines_in(resp)] == [
        "before an await", "after an await", "in a task", "in the stream, before its head"]
    wait_for(lambda: "after the head" in tagged(server.stdout, "stream-2"), "the line after the head on stdout")


def test_a_timed_out_call_carries_the_lines_it_wrote(runtime: str, code: Path, start_server: ServerFactory) -> None:
    server = start_server(runtime, code, {"SLESS_TIMEOUT_SEC": "1"})
    resp = get(server, "/hang")
    assert resp.status_code == 504
    lines = lines_in(resp)
    assert lines[0] == ("stdout", "waiting")
    # what the runtime logs about the call while it is the call's (Node's log of the timeout) comes with it
    assert all(stream == "stderr" and "timed out" in text for stream, text in lines[1:]), lines


def test_a_spare_that_became_the_function_sends_the_header(runtime: str, code: Path, tmp_path: Path,
                                                           spawn: Procs) -> None:
    port = free_port()
    read_fd, write_fd = os.pipe()
    command = ([sys.executable, str(RUNTIMES_DIR / runtime / "server.py")] if runtime == "python3.11"
               else ["node", str(RUNTIMES_DIR / runtime / "server.js")])
    env = {"PATH": os.environ["PATH"], "SLESS_HOST": "127.0.0.1", "PORT": str(port), "SLESS_SPARE": "1",
           "SLESS_READY_FD": str(write_fd)}
    with open(tmp_path / "stdout", "wb") as out, open(tmp_path / "stderr", "wb") as err:
        proc = subprocess.Popen(command, env=env, pass_fds=(write_fd,), stdin=subprocess.PIPE, stdout=out,
                                stderr=err)
    os.close(write_fd)
    spawn.append(proc)
    assert wait_byte(read_fd) == b"r"  # a spare, listening
    claim = {"env": {"PATH": os.environ["PATH"], "PORT": str(port), "SLESS_HOST": "127.0.0.1",
                     "SLESS_CODE_DIR": str(code)}, "cwd": str(code)}
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(claim).encode())
    proc.stdin.close()
    assert wait_byte(read_fd) == b"r"  # the function now
    os.close(read_fd)
    resp = requests.get(f"http://127.0.0.1:{port}/streams", headers={"X-Request-Id": "spare-1"}, timeout=30)
    assert resp.status_code == 200
    assert lines_in(resp) == [("stdout", "out one"), ("stderr", "err one"), ("stdout", "out two"),
                              ("stderr", "err two")]
    silent = requests.get(f"http://127.0.0.1:{port}/silent", timeout=30)
    assert "X-Sless-Output" not in silent.headers
