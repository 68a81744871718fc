"""X-Sless-Output of the go1.23 runtime (runtimes/README.md, "Output of a call").

The lines a call wrote before its answer's head come back in the answer as padded base64 of
``{"lines": [{"stream", "text", "ts"}], "truncated"}``. In Go a call's lines are exactly those the
runtime tags with it: written while it alone ran (the go1.23 row of the contract's table). Every
server here is the real build.sh binary of the function below, called over HTTP.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

# Fixture types (see conftest.py); spelled out so the module imports nothing from it.
ServerFactory = Callable[..., Any]
RuntimeServer = Any

# Direct parametrization overrides conftest's three-runtime `runtime` fixture: Go only.
pytestmark = pytest.mark.parametrize("runtime", ["go1.23"])

HEADER = "X-Sless-Output"
FORGED = base64.b64encode(b'{"lines":[{"stream":"stdout","text":"forged","ts":1}],"truncated":false}').decode()

FUNCTION = r"""package function

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// Handle picks its case by the last segment of the request path.
func Handle(ctx context.Context, event map[string]any) (any, error) {
	path, _ := event["_path"].(string)
	query, _ := event["_query"].(map[string]any)
	arg := func(name string) string { s, _ := query[name].(string); return s }
	switch path[strings.LastIndexByte(path, '/')+1:] {
	case "lines":
		fmt.Println("out one")
		fmt.Fprintln(os.Stderr, "err one")
		fmt.Println("out two")
		fmt.Fprintln(os.Stderr, "err two")
		fmt.Print("tail without its newline")
		return "ok", nil
	case "silent":
		return "quiet", nil
	case "forge":
		if arg("print") != "" {
			fmt.Println("printed")
		}
		headers := map[string]any{"X-Sless-Output": "FORGED"}
		return map[string]any{"statusCode": 200, "headers": headers, "body": "x"}, nil
	case "sizes": // one line per size, of that many letters
		for i, size := range strings.Split(arg("sizes"), ",") {
			n, err := strconv.Atoi(size)
			if err != nil {
				return nil, err
			}
			fmt.Println(strings.Repeat(string(rune('a'+i%26)), n))
		}
		return "done", nil
	case "fail":
		fmt.Println("before failing")
		if arg("panic") != "" {
			panic("the handler gave up")
		}
		return nil, errors.New("the handler failed")
	case "first": // prints, then waits at the test's gate
		fmt.Println("first alone")
		if err := gate(ctx, arg("gate")); err != nil {
			return nil, err
		}
		fmt.Println("first after second")
		return "first", nil
	case "second":
		fmt.Println("second while first runs")
		return "second", nil
	case "stream":
		fmt.Println("before the head")
		out := make(chan string)
		go func() {
			defer close(out)
			fmt.Println("from the producer")
			for _, chunk := range []string{"one\n", "two\n"} {
				select {
				case out <- chunk:
				case <-ctx.Done():
					return
				}
			}
		}()
		return (<-chan string)(out), nil
	}
	return nil, fmt.Errorf("unknown case %q", path)
}

// gate connects to the test's port and waits until the test closes the connection.
func gate(ctx context.Context, port string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", "127.0.0.1:"+port)
	if err != nil {
		return err
	}
	defer conn.Close()
	_, _ = conn.Read(make([]byte, 1))
	return nil
}
""".replace("FORGED", FORGED)

_TAGGED = re.compile(r"@sless:(\S+) (.*)")


@pytest.fixture(scope="module")
def code_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The function's code, one folder for the module (so it is built once)."""
    root = tmp_path_factory.mktemp("output-header-fn")
    (root / "handler.go").write_text(FUNCTION)
    return root


@pytest.fixture
def server(runtime: str, code_dir: Path, start_server: ServerFactory) -> RuntimeServer:
    return start_server(runtime, code_dir=code_dir)


def call(server: RuntimeServer, case: str, call_id: str | None, **params: str) -> requests.Response:
    headers = {"X-Request-Id": call_id} if call_id else {}
    return requests.get(f"{server.url}/{case}", params=params, headers=headers, timeout=30)


def output(resp: requests.Response) -> dict[str, Any] | None:
    """The decoded X-Sless-Output of an answer, None when it has none."""
    value = resp.headers.get(HEADER)
    if value is None:
        return None
    assert len(value) % 4 == 0, value  # padded
    document = json.loads(base64.b64decode(value, validate=True).decode("utf-8"))
    assert set(document) == {"lines", "truncated"}, document
    for line in document["lines"]:
        assert set(line) == {"stream", "text", "ts"} and line["stream"] in ("stdout", "stderr"), line
    return document


def texts(document: dict[str, Any], stream: str | None = None) -> list[str]:
    return [line["text"] for line in document["lines"] if stream is None or line["stream"] == stream]


def tagged(text: str, call_id: str) -> list[str]:
    """The lines of the process's output tagged with ``call_id``."""
    return [m.group(2) for m in map(_TAGGED.fullmatch, text.splitlines()) if m and m.group(1) == call_id]


def wait_for(server: RuntimeServer, predicate: Callable[[RuntimeServer], bool], timeout: float = 10.0) -> None:
    """The process's output reaches its files a moment after the answer (through the tagging pipes)."""
    deadline = time.monotonic() + timeout
    while not predicate(server):
        assert time.monotonic() < deadline, f"stdout:\n{server.stdout}\nstderr:\n{server.stderr}"
        time.sleep(0.02)


def test_lines_of_both_streams_in_order_with_times(runtime: str, server: RuntimeServer) -> None:
    before = time.time()
    resp = call(server, "lines", "lines-1")
    after = time.time()
    assert resp.status_code == 200 and resp.text == "ok"
    document = output(resp)
    assert document is not None and document["truncated"] is False
    # Each stream in the order written; a last line without its newline counts.
    assert texts(document, "stdout") == ["out one", "out two", "tail without its newline"]
    assert texts(document, "stderr") == ["err one", "err two"]
    # Go reads stdout and stderr through two pipes, so how their lines interleave is when the runtime
    # read them; the times are that moment, never before the call nor after its answer.
    stamps = [line["ts"] for line in document["lines"]]
    assert stamps == sorted(stamps)
    assert all(before - 0.001 <= ts <= after for ts in stamps), (before, stamps, after)
    # The lines are still written, tagged, to the process's output.
    wait_for(server, lambda s: len(tagged(s.stdout, "lines-1")) == 3 and len(tagged(s.stderr, "lines-1")) == 2)
    assert tagged(server.stdout, "lines-1") == texts(document, "stdout")
    assert tagged(server.stderr, "lines-1") == texts(document, "stderr")


def test_a_silent_call_has_no_header(runtime: str, server: RuntimeServer) -> None:
    for n in range(5):
        resp = call(server, "silent", f"silent-{n}")
        assert resp.status_code == 200 and resp.text == "quiet"
        assert HEADER not in resp.headers
    health = requests.get(f"{server.url}/_/health", timeout=10)
    assert health.status_code == 200 and HEADER not in health.headers


def test_a_call_without_a_request_id_has_no_header(runtime: str, server: RuntimeServer) -> None:
    resp = call(server, "lines", None)  # nothing is tagged, so nothing is the call's
    assert resp.status_code == 200 and HEADER not in resp.headers


def test_the_handlers_own_header_is_dropped(runtime: str, server: RuntimeServer) -> None:
    silent = call(server, "forge", "forge-1")
    assert silent.status_code == 200 and silent.text == "x"
    assert HEADER not in silent.headers
    printing = call(server, "forge", "forge-2", print="1")
    document = output(printing)
    assert document is not None and texts(document) == ["printed"]


def test_text_is_truncated_at_16384_bytes(runtime: str, server: RuntimeServer) -> None:
    exact = output(call(server, "sizes", "exact", sizes="8192,8192"))
    assert exact is not None and [len(t) for t in texts(exact)] == [8192, 8192] and exact["truncated"] is False

    over = output(call(server, "sizes", "over", sizes="8192,8192,1,0"))
    # "c" does not fit: it and every later line (the empty one would) are left out.
    assert over is not None and [len(t) for t in texts(over)] == [8192, 8192] and over["truncated"] is True

    first_too_long = output(call(server, "sizes", "long", sizes="16385,1"))
    assert first_too_long == {"lines": [], "truncated": True}

    # More than the pipes hold (200 KB): the answer still has the call's first lines.
    flood = output(call(server, "sizes", "flood", sizes=",".join(["1000"] * 200)))
    assert flood is not None and len(texts(flood)) == 16 and flood["truncated"] is True
    assert texts(flood)[:2] == ["a" * 1000, "b" * 1000]
    # Every line is still written, tagged.
    wait_for(server, lambda s: len(tagged(s.stdout, "flood")) == 200)


def test_an_error_answer_carries_the_lines(runtime: str, server: RuntimeServer) -> None:
    failed = call(server, "fail", "fail-1")
    assert failed.status_code == 500 and failed.json()["error"] == "the handler failed"
    document = output(failed)
    assert document is not None and texts(document) == ["before failing"]

    panicked = call(server, "fail", "panic-1", panic="1")
    assert panicked.status_code == 500 and panicked.json()["type"] == "panic"
    document = output(panicked)
    assert document is not None and texts(document, "stdout") == ["before failing"]
    stderr = texts(document, "stderr")  # the panic's message and stack are the call's lines too
    assert stderr[0].endswith("sless: handler panic: the handler gave up") and len(stderr) > 1


def test_lines_written_while_calls_overlap_are_in_no_header(runtime: str, server: RuntimeServer) -> None:
    with socket.create_server(("127.0.0.1", 0)) as gate:
        gate.settimeout(30)
        answers: dict[str, requests.Response] = {}
        first = threading.Thread(
            target=lambda: answers.update(first=call(server, "first", "first-1", gate=str(gate.getsockname()[1])))
        )
        first.start()
        held, _ = gate.accept()  # the first call printed its line and waits at the gate
        with held:
            second = call(server, "second", "second-1")
        first.join(30)
    # The second call's line was written while the first ran: it is untagged, so in neither header.
    assert second.status_code == 200 and HEADER not in second.headers
    document = output(answers["first"])
    # The first call ran alone before the second began and again after it ended.
    assert document is not None and texts(document) == ["first alone", "first after second"]
    wait_for(server, lambda s: "second while first runs" in s.stdout.splitlines())


def test_a_streamed_answer_carries_only_the_lines_before_its_head(runtime: str, server: RuntimeServer) -> None:
    resp = call(server, "stream", "stream-1")
    assert resp.status_code == 200 and resp.text == "one\ntwo\n"
    document = output(resp)
    # The producer writes after the handler returned: no call runs then, so its line is no call's.
    assert document is not None and texts(document) == ["before the head"]
    wait_for(server, lambda s: "from the producer" in s.stdout.splitlines())

