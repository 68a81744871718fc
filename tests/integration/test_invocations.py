"""The invocation log against real databases: SQLite files and a real PostgreSQL server,
including a frozen (SIGSTOP) and a crashed (pg_ctl stop -m immediate) PostgreSQL."""

from __future__ import annotations

import base64
import dataclasses
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from sless_api.domain import calloutput
from sless_api.stores.invocations import (
    Invocation,
    InvocationLog,
    PostgresSink,
    SqliteSink,
    load_migrations,
    log_from_url,
    migrate_postgres,
    migrate_sqlite,
    sink_from_url,
    sqlite_path,
)
from tests.support.poll import until
from tests.support.services import PostgresServer, free_port, fresh_pg_database, postgres_server

REPO = Path(__file__).resolve().parents[2]


def inv(i: int, ns: str = "ns", fn: str = "fn", *, error: str | None = None) -> Invocation:
    return Invocation(ns, fn, "POST", f"/p/{i}", 200 + i % 3, 1.25 + i, i, 2 * i, "http", error, 1_700_000_000.5 + i)


def pg_count(url: str, where: str = "TRUE") -> int:
    conn = psycopg2.connect(url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM invocations WHERE {where}")
            row = cur.fetchone()
            assert row is not None
            return int(row[0])
    finally:
        conn.close()


@pytest.fixture
def inv_log(db_url: str) -> Iterator[InvocationLog]:
    log = log_from_url(db_url, flush_interval=0.05)
    yield log
    log.close(10)


def count(log: InvocationLog) -> int:
    sink = log.sink
    assert isinstance(sink, SqliteSink | PostgresSink)
    return sink.count()


def test_write_list_and_page(inv_log: InvocationLog) -> None:
    for i in range(25):
        inv_log.record(inv(i, fn="a" if i % 2 else "b"))
    inv_log.record(inv(99, ns="other", fn="a"))
    odd = "tab\there\nnewline\\backslash \"quote\" 'single' ünïcödé \x00nul"
    inv_log.record(inv(100, fn="a", error=odd))
    assert inv_log.flush(30)

    page, cursor = inv_log.list("ns", "a", limit=4)
    assert [r.path for r in page] == ["/p/100", "/p/23", "/p/21", "/p/19"]
    first = page[0]
    assert first.error == odd.replace("\x00", "")  # NUL cannot be stored; the rest round-trips
    assert (first.namespace, first.function, first.method, first.trigger) == ("ns", "a", "POST", "http")
    assert (first.status, first.request_bytes, first.response_bytes) == (201, 100, 200)
    assert first.duration_ms == pytest.approx(101.25)
    assert first.started_at == pytest.approx(1_700_000_100.5, abs=1e-5)
    assert page[1].error is None
    assert all(isinstance(r.id, int) for r in page)
    assert cursor == page[-1].id

    seen = [r.path for r in page]
    while cursor is not None:
        page, cursor = inv_log.list("ns", "a", limit=4, before_id=cursor)
        assert 0 < len(page) <= 4
        seen += [r.path for r in page]
    assert seen == ["/p/100"] + [f"/p/{i}" for i in range(23, 0, -2)]

    everything, cursor = inv_log.list("ns", None, limit=1000)
    assert len(everything) == 26 and cursor is None
    ids = [r.id or 0 for r in everything]
    assert ids == sorted(ids, reverse=True)
    assert inv_log.list("ns", "missing") == ([], None)
    assert [r.path for r in inv_log.list("other", "a")[0]] == ["/p/99"]
    # A function created again under the same name sees only records from its own creation on.
    recent, _ = inv_log.list("ns", "a", limit=100, since=1_700_000_020.5)
    assert [r.path for r in recent] == ["/p/100", "/p/23", "/p/21"]


@pytest.mark.parametrize("max_queue", [10_000, 20_000])
def test_burst_of_20000_all_accounted_for(db_url: str, max_queue: int) -> None:
    """With the default queue (10,000) part of a burst may be dropped, and is counted;
    with room for the whole burst every record lands."""
    log = log_from_url(db_url, max_queue=max_queue)
    try:
        start = time.monotonic()
        for i in range(20_000):
            log.record(inv(i))
        record_seconds = time.monotonic() - start
        assert log.flush(180), log.stats()
        stats = log.stats()
        assert stats["recorded"] == 20_000
        assert stats["written"] + stats["dropped"] == 20_000, stats
        assert stats["queued"] == 0 and stats["failed_batches"] == 0, stats
        assert stats["written"] >= min(max_queue, 20_000), stats
        assert count(log) == stats["written"]
        print(f"burst: 20000 record() calls in {record_seconds:.3f}s; {stats}")
    finally:
        log.close(10)


def test_odd_values_do_not_fail_a_batch(inv_log: InvocationLog) -> None:
    """One record with out-of-range numbers or NUL bytes must not take its batch down."""
    odd = Invocation(
        "ns", "odd\x00fn", "X" * 100, "/" * 5000, 10**30, float("nan"), -5, 10**40, "t" * 100, "e" * 10_000, -1.0
    )
    inv_log.record(inv(1, fn="oddfn"))
    inv_log.record(odd)
    inv_log.record(inv(2, fn="oddfn"))
    assert inv_log.flush(30)
    assert inv_log.stats()["written"] == 3, (inv_log.stats(), inv_log.last_error)
    page, _ = inv_log.list("ns", "oddfn", limit=10)
    assert len(page) == 3
    stored = page[1]
    assert stored.status == 2**31 - 1 and stored.duration_ms == 0.0
    assert stored.request_bytes == 0 and stored.response_bytes == 2**63 - 1
    assert len(stored.path) == 2048 and len(stored.method) == 16 and len(stored.trigger) == 32
    assert stored.error is not None and len(stored.error) == 2000


def test_cold_and_phases_round_trip_and_stay_null_when_unknown(inv_log: InvocationLog) -> None:
    known = inv(1, fn="phased")
    known.cold, known.queue_ms, known.start_ms, known.handler_ms = True, 0.25, 812.5, 40.125
    warm = inv(2, fn="phased")
    warm.cold, warm.queue_ms, warm.start_ms, warm.handler_ms = False, 0.5, 0.0, None
    odd = inv(3, fn="phased")
    odd.queue_ms, odd.start_ms, odd.handler_ms = float("nan"), -3.0, 1e30  # out of range: stored as 0
    inv_log.record(known)
    inv_log.record(warm)
    inv_log.record(odd)
    inv_log.record(inv(4, fn="phased"))  # an old-style record: nothing known
    assert inv_log.flush(30), inv_log.last_error
    page, _ = inv_log.list("ns", "phased", limit=10)
    by_path = {r.path: r for r in page}
    first, second, third, plain = by_path["/p/1"], by_path["/p/2"], by_path["/p/3"], by_path["/p/4"]
    assert (first.cold, first.queue_ms, first.start_ms, first.handler_ms) == (True, 0.25, 812.5, 40.125)
    assert (second.cold, second.start_ms, second.handler_ms) == (False, 0.0, None)
    assert (third.queue_ms, third.start_ms, third.handler_ms) == (0.0, 0.0, 0.0)
    assert (plain.cold, plain.queue_ms, plain.start_ms, plain.handler_ms) == (None, None, None, None)
    api = first.to_dict()
    assert api["cold"] is True and api["phases_ms"] == {"queue": 0.25, "start": 812.5, "handler": 40.125}
    assert "queue_ms" not in api
    assert plain.to_dict()["phases_ms"] == {"queue": None, "start": None, "handler": None}


def test_the_serving_version_round_trips_and_stays_null_when_unknown(inv_log: InvocationLog) -> None:
    split = inv(1, fn="split")
    split.version = 7
    odd = inv(2, fn="split")
    odd.version = 2**40  # out of column range: clamped, never a failed batch
    inv_log.record(split)
    inv_log.record(odd)
    inv_log.record(inv(3, fn="split"))
    assert inv_log.flush(30), inv_log.last_error
    page, _ = inv_log.list("ns", "split", limit=10)
    by_path = {r.path: r for r in page}
    assert [by_path[f"/p/{i}"].version for i in (1, 2, 3)] == [7, 2**31 - 1, None]
    assert by_path["/p/1"].to_dict()["version"] == 7


def test_the_attempt_round_trips_and_stays_null_for_a_call_made_once(inv_log: InvocationLog) -> None:
    second = inv(1, fn="retried")
    second.attempt = 2
    odd = inv(2, fn="retried")
    odd.attempt = -4  # out of column range: clamped, never a failed batch
    inv_log.record(second)
    inv_log.record(odd)
    inv_log.record(inv(3, fn="retried"))
    assert inv_log.flush(30), inv_log.last_error
    page, _ = inv_log.list("ns", "retried", limit=10)
    by_path = {r.path: r for r in page}
    assert [by_path[f"/p/{i}"].attempt for i in (1, 2, 3)] == [2, 0, None]
    assert by_path["/p/1"].to_dict()["attempt"] == 2 and by_path["/p/3"].to_dict()["attempt"] is None


def test_a_calls_output_is_kept_checked_and_read_on_its_own(inv_log: InvocationLog) -> None:
    """The runtime's X-Sless-Output goes in with the record (text COPY and SQLite alike keep tabs, newlines,
    backslashes and non-ASCII), is never part of a listed record, and one that breaks the contract is dropped."""
    texts = ["tab\there", "back\\slash \\N", "ünï ☃ 𝄞", "", "nul\x00gone"]
    printed = inv(1, fn="talker")
    printed.output = calloutput.encode((("stdout", t, 1_700_000_001.25) for t in texts), truncated=True)
    forged = inv(2, fn="talker")
    forged.output = base64.b64encode(b'{"lines": [{"stream": "stdin", "text": "x", "ts": 1}], "truncated": false}')
    not_base64 = inv(3, fn="talker")
    not_base64.output = b"%%%"
    for record in (printed, forged, not_base64, inv(4, fn="talker")):
        inv_log.record(record)
    assert inv_log.flush(30), inv_log.last_error
    page, _ = inv_log.list("ns", "talker", limit=10)
    ids = {r.path: r.id for r in page}
    assert all("output" not in r.to_dict() for r in page)
    kept = inv_log.get_output("ns", "talker", ids["/p/1"])
    assert kept == {"lines": [{"stream": "stdout", "text": t.replace("\x00", ""), "ts": 1_700_000_001.25}
                              for t in texts], "truncated": True}
    assert [inv_log.get_output("ns", "talker", ids[f"/p/{i}"]) for i in (2, 3, 4)] == [None, None, None]
    assert inv_log.get_output("ns", "other", ids["/p/1"]) is None  # only under its own function
    assert inv_log.get_output("tenant-b", "talker", ids["/p/1"]) is None


def test_a_record_offered_under_one_key_by_several_processes_is_stored_once(db_url: str) -> None:
    """A Kubernetes run is seen by every API replica: each offers its record under the Job's uid, at the same
    moment, and exactly one stores it (claim and record in one transaction), with its output."""
    logs = [log_from_url(db_url) for _ in range(4)]  # as four API processes sharing the store
    try:
        run = inv(1, fn="cron-fn")
        run.trigger, run.request_id = "cron", "nightly-cron-1"
        run.output = calloutput.encode([("log", "fired", 1_700_000_001.5)])
        start = threading.Barrier(len(logs))
        results: list[bool] = []

        def offer(log: InvocationLog) -> None:
            start.wait()
            results.append(log.record_once("uid-1", dataclasses.replace(run)))

        threads = [threading.Thread(target=offer, args=(log,)) for log in logs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(results) == [False, False, False, True]
        assert logs[0].record_once("uid-1", dataclasses.replace(run)) is False  # later, e.g. after a relist
        assert logs[1].record_once("uid-2", dataclasses.replace(run, request_id="nightly-cron-2")) is True
        page, _ = logs[2].list("ns", "cron-fn", limit=10)
        assert sorted(r.request_id or "" for r in page) == ["nightly-cron-1", "nightly-cron-2"]
        assert {r.trigger for r in page} == {"cron"}
        first = next(r for r in page if r.request_id == "nightly-cron-1")
        assert first.id is not None
        assert logs[3].get_output("ns", "cron-fn", first.id) == {
            "lines": [{"stream": "log", "text": "fired", "ts": 1_700_000_001.5}], "truncated": False}
    finally:
        for log in logs:
            log.close(10)


def test_get_finds_a_record_only_under_its_own_function(inv_log: InvocationLog) -> None:
    inv_log.record(inv(1, fn="mine"))
    inv_log.record(inv(2, ns="tenant-b", fn="mine"))
    assert inv_log.flush(30)
    ident = inv_log.list("ns", "mine")[0][0].id
    assert ident is not None
    found = inv_log.get("ns", "mine", ident)
    assert found is not None and found.path == "/p/1"
    assert inv_log.get("ns", "other", ident) is None
    assert inv_log.get("tenant-b", "mine", ident) is None
    assert inv_log.get("ns", "mine", ident + 1000) is None
    again = inv(3, fn="mine")
    again.request_id = "req-1"
    elsewhere = inv(4, ns="tenant-b", fn="mine")
    elsewhere.request_id = "req-1"
    inv_log.record(again)
    inv_log.record(elsewhere)
    assert inv_log.flush(30)
    by_request = inv_log.find_request("ns", "mine", "req-1")
    assert by_request is not None and by_request.path == "/p/3"
    assert inv_log.find_request("ns", "other", "req-1") is None
    assert inv_log.find_request("ns", "mine", "req-2") is None


def test_a_database_from_before_the_phases_is_upgraded_in_place(tmp_path: Path) -> None:
    """Records written before migration 0005 keep their values and read back with nulls."""
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db, isolation_level=None)
    older = tmp_path / "older-migrations"
    older.mkdir()
    for migration in sorted((REPO / "api/src/sless_api/migrations").glob("000[1234]_*.sql")):
        (older / migration.name).write_text(migration.read_text())
    migrate_sqlite(conn, older)
    conn.execute("INSERT INTO invocations (namespace, function, method, path, status, duration_ms, request_bytes, "
                 "response_bytes, trigger, error, started_at, request_id) "
                 "VALUES ('ns', 'fn', 'GET', '/', 200, 1.5, 0, 0, 'http', NULL, 1700000000.0, 'old-1')")
    conn.close()
    sink = SqliteSink(db)
    try:
        (old,) = sink.list("ns", "fn", 10, None)
        assert old.request_id == "old-1" and old.cold is None and old.handler_ms is None
    finally:
        sink.close()


def test_migrations_are_idempotent_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    versions = [m.version for m in load_migrations("sqlite")]
    assert versions and versions[0].startswith("0001_")
    conn = sqlite3.connect(db, isolation_level=None)
    assert migrate_sqlite(conn) == versions
    assert migrate_sqlite(conn) == []
    rows = conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
    assert [r[0] for r in rows] == versions
    conn.close()
    SqliteSink(db).close()  # opening a sink on a migrated file applies nothing again


@pytest.mark.pg
def test_migrations_are_idempotent_pg(pg_url: str) -> None:
    url = fresh_pg_database(pg_url)
    versions = [m.version for m in load_migrations("postgresql")]
    conn = psycopg2.connect(url)
    try:
        assert migrate_postgres(conn) == versions
        assert migrate_postgres(conn) == []
        with conn, conn.cursor() as cur:
            cur.execute("SELECT version FROM schema_migrations ORDER BY version")
            assert [r[0] for r in cur.fetchall()] == versions
    finally:
        conn.close()


_MIGRATOR = textwrap.dedent(
    """
    import os, sqlite3, sys, time
    import psycopg2
    from sless_api.stores.invocations import migrate_postgres, migrate_sqlite
    url, go, ready = sys.argv[1], sys.argv[2], sys.argv[3]
    open(ready, "w").close()  # imported: only the line is left to wait for
    while not os.path.exists(go):
        time.sleep(0.005)
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None, timeout=60)
        print(migrate_sqlite(conn))
    else:
        print(migrate_postgres(psycopg2.connect(url)))
    """
)


def test_concurrent_migrations_apply_each_file_once(db_url: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _MIGRATOR, db_url, str(go), str(tmp_path / f"ready-{i}")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for i in range(4)
    ]
    # ready, or one died: then its error shows below
    until("every interpreter started and waiting at the line",
          lambda: all((tmp_path / f"ready-{i}").exists() for i in range(4)) or any(p.poll() is not None for p in procs),
          timeout=60, interval=0.05)
    go.touch()
    outputs = [p.communicate(timeout=120) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    applied = [out.strip() for out, _ in outputs]
    versions = [m.version for m in load_migrations("sqlite" if db_url.startswith("sqlite") else "postgresql")]
    assert sorted(applied).count(str(versions)) == 1, applied  # exactly one process applied them
    assert sorted(applied).count("[]") == 3, applied
    log = log_from_url(db_url)
    log.record(inv(1))
    assert log.flush(30)
    assert log.stats()["written"] == 1
    log.close()


def test_urls_pick_sinks(tmp_path: Path) -> None:
    assert sqlite_path("sqlite:////abs/x.db") == Path("/abs/x.db")
    assert sqlite_path("sqlite:///rel/x.db") == Path("rel/x.db")
    with pytest.raises(ValueError):
        sqlite_path("sqlite:///:memory:")
    with pytest.raises(ValueError):
        sink_from_url("mysql://x/y")
    sink = sink_from_url(f"sqlite:///{tmp_path}/a.db")
    assert isinstance(sink, SqliteSink)
    sink.close()
    # No connection is made at construction: the API starts while its database is down.
    pg = sink_from_url(f"postgresql://nobody@127.0.0.1:{free_port()}/none")
    assert isinstance(pg, PostgresSink)
    pg.close()


@pytest.mark.pg
def test_unreachable_postgres_drops_and_counts() -> None:
    log = log_from_url(f"postgresql://postgres@127.0.0.1:{free_port()}/sless", flush_interval=0.05, retry_delay=0.01)
    start = time.monotonic()
    for i in range(1000):
        log.record(inv(i))
    assert time.monotonic() - start < 1.0
    assert log.flush(60)
    stats = log.stats()
    assert stats["written"] == 0
    assert stats["dropped"] == 1000
    assert stats["failed_batches"] >= 2  # 1000 records in batches of at most 500
    assert log.last_error and "OperationalError" in log.last_error
    log.close()


@pytest.fixture
def own_pg() -> Iterator[PostgresServer]:
    """A PostgreSQL of this test alone: it gets frozen or crashed."""
    with postgres_server() as server:
        yield server


@pytest.mark.pg
@pytest.mark.slow
def test_frozen_postgres_never_blocks_record(own_pg: PostgresServer) -> None:
    log = log_from_url(own_pg.url, max_queue=600, batch=100, flush_interval=0.05)
    try:
        for i in range(100):
            log.record(inv(i, fn="before"))
        assert log.flush(30)
        assert log.stats()["written"] == 100

        own_pg.sigstop()  # every server process: open connections hang too
        try:
            for i in range(50):
                log.record(inv(i, fn="frozen"))
            time.sleep(0.5)  # the writer is now inside a COPY that the server never answers (nothing to poll for)
            start = time.monotonic()
            for i in range(50, 1050):
                log.record(inv(i, fn="frozen"))
            elapsed = time.monotonic() - start
            stats = log.stats()
            assert not log.flush(1.0)  # nothing can land while frozen
        finally:
            own_pg.sigcont()
        assert elapsed < 1.0, f"1000 record() calls took {elapsed:.3f}s against a frozen database"
        assert stats["dropped"] >= 1050 - 600 - 100, stats  # queue bound (600) + one batch in flight
        assert log.flush(60), log.stats()  # the backlog drains once the server runs again

        for i in range(200):
            log.record(inv(i, fn="after"))
        assert log.flush(60), log.stats()
        stats = log.stats()
        assert stats["written"] + stats["dropped"] == stats["recorded"] == 1350, stats
        assert pg_count(own_pg.url, "function = 'after'") == 200
        assert pg_count(own_pg.url) == stats["written"]
        print(f"frozen: 1000 record() calls in {elapsed * 1000:.1f} ms; {stats}")
    finally:
        log.close(10)


@pytest.mark.pg
@pytest.mark.slow
def test_writer_reconnects_after_postgres_crash(own_pg: PostgresServer) -> None:
    log = log_from_url(own_pg.url, flush_interval=0.05, retry_delay=0.05)
    try:
        for i in range(100):
            log.record(inv(i, fn="before"))
        assert log.flush(30)
        assert log.list("ns", "before", limit=1)[0][0].path == "/p/99"  # the reader connects too

        own_pg.crash()  # pg_ctl stop -m immediate
        for i in range(50):
            log.record(inv(i, fn="down"))
        assert log.flush(60)
        down = log.stats()
        assert down["written"] == 100 and down["dropped"] == 50 and down["failed_batches"] >= 1, down

        own_pg.restart()
        for i in range(100):
            log.record(inv(i, fn="after"))
        assert log.flush(60), log.stats()
        stats = log.stats()
        assert stats["written"] == 200 and stats["dropped"] == 50, stats
        assert pg_count(own_pg.url, "function = 'after'") == 100
        # The reader's connection died with the server; list() reconnects by itself.
        page, _ = log.list("ns", "after", limit=5)
        assert [r.path for r in page] == [f"/p/{i}" for i in range(99, 94, -1)]
    finally:
        log.close(10)
