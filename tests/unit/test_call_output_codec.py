"""X-Sless-Output: what a runtime reports of a call's lines is checked as hostile input before it is kept."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from sless_api.domain import calloutput
from sless_api.gateway.headers import caller_head, to_caller
from sless_api.rest.resources.functions import fuller


def header(value: Any) -> bytes:
    return base64.b64encode(json.dumps(value).encode())


def line(text: str, stream: str = "stdout", ts: Any = 1_765_000_000.5) -> dict[str, Any]:
    return {"stream": stream, "text": text, "ts": ts}


def test_encoded_lines_decode_to_what_the_api_shows() -> None:
    value = calloutput.encode([("stdout", "a ☃", 1_765_000_000.1234), ("stderr", "", 1_765_000_000.2)])
    assert calloutput.decode(value) == {"lines": [line("a ☃", ts=1_765_000_000.123),
                                                  line("", "stderr", 1_765_000_000.2)], "truncated": False}
    assert calloutput.decode(value.decode()) == calloutput.decode(value)  # str or bytes


def test_encoding_caps_like_a_runtime_does() -> None:
    """Once a line does not fit in 16 KiB of text, it and every later line are left out."""
    value = calloutput.encode([("stdout", "x" * 10_000, 1.0), ("stdout", "y" * 10_000, 2.0), ("stdout", "z", 3.0)])
    assert calloutput.decode(value) == {"lines": [line("x" * 10_000, ts=1.0)], "truncated": True}
    many = calloutput.encode(("stdout", "", float(n)) for n in range(calloutput.MAX_LINES + 10))
    decoded = calloutput.decode(many)
    assert decoded is not None and len(decoded["lines"]) == calloutput.MAX_LINES and decoded["truncated"]


@pytest.mark.parametrize("value", [
    b"not base64!",
    base64.b64encode(b"\xff\xfe"),  # not UTF-8
    base64.b64encode(b"{not json"),
    header([line("a")]),  # not an object
    header({"lines": "a"}),
    header({"lines": [line("a")], "truncated": "no"}),
    header({"lines": [line("a", stream="stdin")]}),
    header({"lines": [line("a", ts="1")]}),
    header({"lines": [line("a", ts=True)]}),
    header({"lines": [line("a", ts=-1)]}),
    header({"lines": [line("a", ts=1e12)]}),
    header({"lines": [{"stream": "stdout", "text": 5, "ts": 1}]}),
    header({"lines": ["a"]}),
    header({"lines": [line("x" * (calloutput.MAX_TEXT_BYTES + 1))]}),  # over the cap: a runtime cuts before it
    b"A" * (calloutput.MAX_HEADER_BYTES + 4),
    header({"lines": [], "truncated": False}),  # nothing: nothing to keep
], ids=lambda v: str(v[:30]))
def test_what_breaks_the_contract_is_dropped_whole(value: bytes) -> None:
    assert calloutput.decode(value) is None


def test_nan_and_infinite_times_are_refused() -> None:
    for ts in ("NaN", "Infinity"):
        raw = base64.b64encode(f'{{"lines": [{{"stream": "stdout", "text": "a", "ts": {ts}}}]}}'.encode())
        assert calloutput.decode(raw) is None


def test_text_a_database_cannot_hold_is_made_safe() -> None:
    """NUL (PostgreSQL text) is removed, a lone surrogate (JSON allows it, UTF-8 does not) replaced."""
    raw = base64.b64encode(b'{"lines": [{"stream": "stdout", "text": "a\\u0000b \\ud800", "ts": 1}]}')
    decoded = calloutput.decode(raw)
    assert decoded is not None and decoded["lines"][0]["text"] == "ab ?"
    calloutput.stored(decoded).encode("utf-8")


def test_more_lines_than_a_runtime_sends_keep_the_first_ones() -> None:
    decoded = calloutput.decode(header({"lines": [line(str(n)) for n in range(calloutput.MAX_LINES + 5)]}))
    assert decoded is not None and decoded["truncated"]
    assert [x["text"] for x in decoded["lines"]] == [str(n) for n in range(calloutput.MAX_LINES)]


def test_truncated_with_no_line_is_kept_as_a_marker() -> None:
    assert calloutput.decode(header({"lines": [], "truncated": True})) == {"lines": [], "truncated": True}


def test_stored_round_trips() -> None:
    out = {"lines": [line("a\tb\n")], "truncated": False}
    assert calloutput.loaded(calloutput.stored(out)) == out
    assert calloutput.loaded(None) is None and calloutput.loaded("") is None


def test_the_caller_never_sees_the_runtimes_report() -> None:
    raw = [(b"Content-Type", b"text/plain"), (b"X-Sless-Output", header({"lines": [line("secret")]})),
           (b"x-sless-handler-ms", b"1.0")]
    out, _ = caller_head(raw)
    assert out == [(b"content-type", b"text/plain")]
    assert to_caller([(k.decode(), v.decode()) for k, v in raw]) == [("Content-Type", "text/plain")]


def test_the_api_shows_the_fuller_of_kept_and_live_lines() -> None:
    kept = {"lines": [line("a")], "truncated": False}
    live = {"lines": [line("a"), line("streamed after the head")], "truncated": False}
    assert fuller(kept, live) is live  # the process still has every line, a stream's later ones too
    assert fuller(kept, {"lines": [], "truncated": False}) is kept  # the pod is gone, or sless up restarted
    assert fuller(kept, None) is kept
    assert fuller(None, live) is live
    assert fuller(None, None) == {"lines": [], "truncated": False}
