"""Reading the runtimes' per-call output: the line format, the standalone store, the pod-log reader."""

from __future__ import annotations

import pytest

from sless_api.backends.kube.podlogs import collect
from sless_api.backends.standalone.host.calllogs import CallLogStore, LineRouter
from sless_core.calllines import parse_line


@pytest.mark.parametrize(("line", "parsed"), [
    ("@sless:abc-1 hello", ("abc-1", "hello")),
    ("@sless:abc-1 @sless:victim forged", ("abc-1", "@sless:victim forged")),
    ("@sless:abc-1 ", ("abc-1", "")),
    ("@sless:- @sless:victim forged", (None, "@sless:- @sless:victim forged")),
    ("@sless:victim", (None, "@sless:victim")),  # no space: not a tag
    ("@sless:bad!id text", (None, "@sless:bad!id text")),
    ("@sless:-lead text", (None, "@sless:-lead text")),
    ("plain output", (None, "plain output")),
    (" @sless:abc text", (None, " @sless:abc text")),
])
def test_parse_line(line: str, parsed: tuple[str | None, str]) -> None:
    assert parse_line(line) == parsed


def test_store_caps_a_call_and_says_truncated() -> None:
    store = CallLogStore(max_call_bytes=10, max_calls=10, max_total_bytes=100)
    store.add("ns.fn", "c1", "stdout", "12345", 1.0)
    store.add("ns.fn", "c1", "stderr", "678901", 2.0)  # would pass 10 bytes
    store.add("ns.fn", "c1", "stdout", "x", 3.0)  # after truncation nothing more is kept
    assert store.get("ns.fn", "c1") == {"lines": [{"stream": "stdout", "text": "12345", "ts": 1.0}],
                                        "truncated": True}
    assert store.get("ns.other", "c1") is None and store.get("ns.fn", "c2") is None


def test_store_forgets_the_oldest_calls_first() -> None:
    store = CallLogStore(max_call_bytes=10, max_calls=3, max_total_bytes=20)
    for n in range(4):
        store.add("k", f"c{n}", "stdout", "abc", float(n))
    assert len(store) == 3 and store.get("k", "c0") is None and store.get("k", "c3") is not None
    store.add("k", "c4", "stdout", "0123456789", 5.0)
    store.add("k", "c5", "stdout", "0123456789", 6.0)  # 26 bytes > 20: the older ones go
    assert store.total_bytes <= 20 and store.get("k", "c5") is not None and store.get("k", "c2") is None


def test_store_refuses_limits_that_cannot_hold_a_call() -> None:
    with pytest.raises(ValueError):
        CallLogStore(max_call_bytes=100, max_total_bytes=10)


def test_router_joins_lines_split_between_reads_and_files_only_tagged_ones() -> None:
    store = CallLogStore()
    router = LineRouter(store, "ns.fn", "stdout")
    router.feed(b"untagged\n@sless:c1 hel", 1.0)
    router.feed(b"lo\n@sless:- @sless:c1 fake\n@sless:c2 \xff\xfe bytes\r\n@sless:c1 last", 2.0)
    router.finish(3.0)
    assert [line["text"] for line in (store.get("ns.fn", "c1") or {})["lines"]] == ["hello", "last"]
    assert [line["text"] for line in (store.get("ns.fn", "c2") or {})["lines"]] == ["\ufffd\ufffd bytes"]


def test_pod_log_lines_of_one_call_with_their_timestamps() -> None:
    log = ("2026-12-01T05:00:00.250000000Z @sless:c1 first\n"
           "2026-12-01T05:00:01Z @sless:c2 other call\n"
           "2026-12-01T05:00:02.5Z sless-runtime: listening\n"
           "2026-12-01T05:00:03.000000001Z @sless:c1 @sless:c2 forged\n"
           "not-a-time @sless:c1 odd\n")
    found = {"lines": [], "truncated": False, "_size": 0}
    collect(log, "c1", found)
    assert [(line["text"], line["stream"]) for line in found["lines"]] == [
        ("first", "log"), ("@sless:c2 forged", "log")]
    assert found["lines"][0]["ts"] == 1796101200.25
    assert found["truncated"] is False
