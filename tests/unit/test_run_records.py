"""A Kubernetes run's record, from the operator's ``status.runRecord`` to the invocation log.

The shape (``sless_core.runrecord``) is checked as untrusted input; the API takes the function, trigger and path
from the object that holds it; the pod log's lines are bounded as a call's output; and ``RunRecorder`` stores a
run once however often it is shown, and tries again when the store fails (a real fault: its table missing, then
back).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sless_api.backends.kube import runrecords
from sless_api.backends.kube.routes import TRIGGERS
from sless_api.backends.kube.runrecords import JOBS, RunRecorder, invocation, owned_record
from sless_api.domain import calloutput
from sless_api.stores.invocations import InvocationLog, log_from_url
from sless_core import runrecord
from sless_core.runrecord import RunRecord
from sless_operator.capture import log_lines
from tests.support.poll import until

RECORD = RunRecord(uid="uid-1", job="once-run-1", function="hello", trigger="job", path="/jobs/once",
                   start_time="2026-01-02T03:04:05Z", completion_time="2026-01-02T03:04:07Z", succeeded=True,
                   version=3, lines=(("log", "said hi", 1767323046.25),))  # fmt: skip


def status(**changes: Any) -> dict[str, Any]:
    return {runrecord.STATUS_FIELD: {**RECORD.to_status(), **changes}}


def job_object(name: str = "once", function: str = "hello", **changes: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "t-ns", "name": name}, "spec": {"function": function},
            "status": status(**changes)}  # fmt: skip


def test_a_record_round_trips_through_the_status() -> None:
    assert runrecord.parse(status()) == RECORD
    assert RECORD.started_at == 1767323045.0
    assert RECORD.duration_ms == 2000.0


@pytest.mark.parametrize("changes", [
    {"uid": ""}, {"uid": 7}, {"function": ""}, {"trigger": "http"}, {"succeeded": "yes"}, {"succeeded": None},
    {"truncated": 1}, {"version": True}, {"version": -1}, {"version": "3"}, {"completionTime": "yesterday"},
    {"completionTime": "2026-01-02T03:04:07"}, {"error": None}, {"lines": "said hi"},
    {"lines": [{"stream": "stdin", "text": "x", "ts": 1.0}]}, {"lines": [{"stream": "log", "text": 5, "ts": 1.0}]},
    {"lines": [{"stream": "log", "text": "x", "ts": True}]}, {"lines": [{"stream": "log", "text": "x", "ts": 1e12}]},
    {"lines": [{"stream": "log", "text": "x", "ts": 1.0}] * (runrecord.MAX_LINES + 1)}, {"lines": ["x"]},
])  # fmt: skip
def test_a_malformed_record_is_refused_whole(changes: dict[str, Any]) -> None:
    assert runrecord.parse(status(**changes)) is None


@pytest.mark.parametrize("value", [None, "x", [], {runrecord.STATUS_FIELD: "x"}, {runrecord.STATUS_FIELD: []}])
def test_a_status_without_a_record_has_none(value: object) -> None:
    assert runrecord.parse(value) is None


def test_output_beyond_the_bound_is_cut_and_marked() -> None:
    line = {"stream": "log", "text": "x" * 1000, "ts": 1.0}
    parsed = runrecord.parse(status(lines=[line] * 20))
    assert parsed is not None and parsed.truncated
    assert len(parsed.lines) == runrecord.MAX_TEXT_BYTES // 1000


def test_the_function_trigger_and_path_are_those_of_the_object_that_holds_the_record() -> None:
    found = owned_record(JOBS, job_object(path="/somewhere/else"))
    assert found == ("t-ns", RECORD)
    assert owned_record(JOBS, job_object(function="other")) is None  # names a function the job does not run
    assert owned_record(JOBS, job_object(trigger="cron")) is None
    cron = {"metadata": {"namespace": "t-ns", "name": "nightly"}, "spec": {"type": "cron", "function": "hello"},
            "status": status(trigger="cron", path="/jobs/x")}  # fmt: skip
    assert owned_record(TRIGGERS, cron) == ("t-ns", replace(RECORD, trigger="cron", path="/triggers/nightly"))
    http = {**cron, "spec": {"type": "http", "function": "hello"}}
    assert owned_record(TRIGGERS, http) is None
    assert owned_record(JOBS, {"metadata": {"name": "x"}, "spec": {}, "status": status()}) is None
    assert owned_record(JOBS, {"metadata": "x", "spec": {}, "status": status()}) is None


def test_a_run_becomes_an_invocation_record_with_its_output() -> None:
    record = invocation("t-ns", RECORD)
    assert (record.namespace, record.function, record.method, record.path, record.trigger) == (
        "t-ns", "hello", "RUN", "/jobs/once", "job")
    assert (record.status, record.error, record.request_id, record.version) == (200, None, "once-run-1", 3)
    assert (record.started_at, record.duration_ms) == (1767323045.0, 2000.0)
    assert record.output is not None
    assert calloutput.decode(record.output) == {"lines": [{"stream": "log", "text": "said hi", "ts": 1767323046.25}],
                                                "truncated": False}
    failed = invocation("t-ns", replace(RECORD, succeeded=False, error="boom", lines=()))
    assert (failed.status, failed.error, failed.output) == (500, "boom", None)


def test_a_pod_log_becomes_lines_with_their_times() -> None:
    text = ("2026-01-02T03:04:05.250000000Z first\n"
            "2026-01-02T03:04:05.5Z @sless:- code archive code/x.tar.gz (sha256 0f) unpacked into /app in 3 ms\n"
            "2026-01-02T03:04:06Z second line\n"
            "no stamp here\n")  # fmt: skip
    lines, truncated = log_lines(text, default_ts=9.0)
    assert lines == (("log", "first", 1767323045.25), ("log", "second line", 1767323046.0),
                     ("log", "no stamp here", 9.0))
    assert not truncated
    cut, truncated = log_lines(text + "2026-01-02T03:04:07Z part", default_ts=9.0, cut=True)
    assert cut == lines and truncated  # a read stopped at its limit: its last, partial line is left out
    many, truncated = log_lines("".join(f"2026-01-02T03:04:05Z {'y' * 99}\n" for _ in range(200)), 0.0)
    assert truncated and len(many) == runrecord.MAX_TEXT_BYTES // 99


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[str, InvocationLog]]:
    url = f"sqlite:///{tmp_path}/invocations.db"
    log = log_from_url(url)
    yield url, log
    log.close(10)


def records(log: InvocationLog) -> list[str]:
    page, _ = log.list("t-ns", "hello", limit=100)
    return sorted(r.request_id or "" for r in page)


def test_the_recorder_stores_a_run_once_however_often_and_by_however_many_it_is_seen(
    store: tuple[str, InvocationLog],
) -> None:
    url, log = store
    other_log = log_from_url(url)  # a second API process on the same store
    recorders = [RunRecorder(log), RunRecorder(other_log)]
    for recorder in recorders:
        recorder.start()
    try:
        for recorder in recorders:
            recorder.replace(JOBS, [job_object()])
            recorder.apply(JOBS, "MODIFIED", job_object())
            recorder.apply(JOBS, "DELETED", job_object(uid="uid-deleted", job="gone-run-1"))
            recorder.apply(JOBS, "ADDED", job_object(name="other", function="else"))  # names another function
        recorders[1].apply(JOBS, "MODIFIED", job_object(name="twice", uid="uid-2", job="twice-run-1"))
        until("both runs recorded", lambda: records(log) == ["once-run-1", "twice-run-1"], timeout=10)
    finally:
        for recorder in recorders:
            recorder.stop()
        other_log.close(10)
    assert records(log) == ["once-run-1", "twice-run-1"]


def test_a_run_the_store_refused_is_stored_once_the_store_is_back(store: tuple[str, InvocationLog],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    url, log = store
    monkeypatch.setattr(runrecords, "RETRY_DELAYS_SEC", (0.2,))
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:  # a real fault: the claims' table is missing until the store is repaired
        db.execute("ALTER TABLE run_records RENAME TO run_records_away")
    recorder = RunRecorder(log)
    recorder.start()
    try:
        recorder.apply(JOBS, "ADDED", job_object())
        until("the first store failed", lambda: "uid-1" in recorder._pending and recorder._pending["uid-1"][2] >= 1,
              timeout=10)
        assert records(log) == []
        with sqlite3.connect(path) as db:
            db.execute("ALTER TABLE run_records_away RENAME TO run_records")
        until("stored after the repair", lambda: records(log) == ["once-run-1"], timeout=10)
    finally:
        recorder.stop()
