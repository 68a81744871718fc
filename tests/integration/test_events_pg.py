"""The PostgreSQL idempotency store of the event dispatcher, against a real server.

Every rule of the SQLite store holds (claims, states, attempts kept across a restart), plus what
several replicas sharing one table need: concurrent claimers of one message id, each on its own
connection, and exactly one of them wins, for a new message and for a failed one being retried.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg2
import pytest

from sless_api.services.events.dedup import Claim, State
from sless_api.services.events.pgdedup import PostgresDedupStore, stored_key
from tests.support.services import fresh_pg_database, sql

pytestmark = pytest.mark.pg

Q = "sless-0123456789abcdef.orders"


@pytest.fixture
def db_url(pg_url: str) -> str:
    return fresh_pg_database(pg_url)


@pytest.fixture
def stores(db_url: str) -> Iterator[Callable[..., PostgresDedupStore]]:
    made: list[PostgresDedupStore] = []

    def make(**kwargs: int) -> PostgresDedupStore:
        store = PostgresDedupStore(db_url, **kwargs)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def lease() -> float:
    return time.time() + 60


def test_the_migration_creates_the_table_once(stores: Callable[..., PostgresDedupStore], db_url: str) -> None:
    a, b = stores(), stores()
    a.claim_sync(Q, "mid:1", "host-a:1:1", lease())
    b.claim_sync(Q, "mid:2", "host-b:1:1", lease())
    versions = [row[0] for row in sql(db_url, "SELECT version FROM schema_migrations ORDER BY version")]
    assert "0002_event_dedup" in versions and versions.count("0002_event_dedup") == 1
    assert sql(db_url, "SELECT count(*) FROM event_deliveries") == [(2,)]


def test_claim_states_follow_the_dedup_rules(stores: Callable[..., PostgresDedupStore]) -> None:
    store = stores()
    first = store.claim_sync(Q, "mid:a", "host-a:1:1", lease())
    assert (first.granted, first.state, first.attempts) == (True, None, 0)

    # someone else's live claim: not granted, and who holds it is reported
    other = store.claim_sync(Q, "mid:a", "host-b:1:1", lease())
    assert (other.granted, other.state, other.owner) == (False, State.RUNNING, "host-a:1:1")

    # failed after 2 attempts: the next claim continues from there, with the last reason
    store.record_sync(Q, "mid:a", State.FAILED, 2, "HTTP 502: function unreachable")
    again = store.claim_sync(Q, "mid:a", "host-b:1:1", lease())
    assert (again.granted, again.state, again.attempts, again.reason) == (
        True, State.FAILED, 2, "HTTP 502: function unreachable")
    assert store.get(Q, "mid:a") == ("running", 2, "HTTP 502: function unreachable")

    for state in (State.DONE, State.DEAD, State.DLQ):
        store.record_sync(Q, "mid:a", state, 3, f"{state}: why")
        seen = store.claim_sync(Q, "mid:a", "host-c:1:1", lease())
        assert (seen.granted, seen.state, seen.attempts, seen.reason) == (False, state, 3, f"{state}: why")

    # the same message id on another queue is another message
    assert store.claim_sync(Q + "2", "mid:a", "host-c:1:1", lease()).granted


def test_a_claim_retried_after_a_lost_answer_gets_its_own_claim_back(
        stores: Callable[..., PostgresDedupStore]) -> None:
    store = stores()
    until = lease()
    assert store.claim_sync(Q, "mid:r", "host-a:1:1", until).granted
    # the same claim again (what a retry after a commit whose answer was lost sends): still ours
    assert store.claim_sync(Q, "mid:r", "host-a:1:1", until).granted
    # a later claim of the same owner is not that claim: the earlier call's outcome is unknown
    later = store.claim_sync(Q, "mid:r", "host-a:1:1", until + 1)
    assert (later.granted, later.state, later.lease_until) == (False, State.RUNNING, until)


def test_long_and_nul_keys_are_stored_hashed(stores: Callable[..., PostgresDedupStore], db_url: str) -> None:
    store = stores()
    ce_key = "ce:/a/source\x00event-1"
    long_key = "mid:" + "x" * 1000
    for key in (ce_key, long_key):
        assert store.claim_sync(Q, key, "host-a:1:1", lease()).granted
        assert not store.claim_sync(Q, key, "host-b:1:1", lease()).granted
    assert not store.claim_sync(Q, "ce:/a/source\x00event-2", "host-a:1:1", lease()).state  # another event
    keys = {str(row[0]) for row in sql(db_url, "SELECT message_key FROM event_deliveries")}
    assert keys == {stored_key(ce_key), stored_key(long_key), stored_key("ce:/a/source\x00event-2")}
    assert all(k.startswith("h:") and len(k) == 66 for k in keys)
    store.record_sync(Q, ce_key, State.DEAD, 1, "reason with \x00 inside")
    assert store.get(Q, ce_key) == ("dead", 1, "reason with \\0 inside")


def test_the_retention_window_forgets_old_records_only(stores: Callable[..., PostgresDedupStore],
                                                       db_url: str) -> None:
    store = stores(purge_batch=7)
    for i in range(20):
        store.record_sync(Q, f"mid:old-{i}", State.DONE, 1)
    store.record_sync(Q, "mid:fresh", State.DONE, 1)
    # twenty records last changed two days ago (the database's clock), one just now
    sql(db_url, "UPDATE event_deliveries SET updated_at = now() - interval '2 days' "
                "WHERE message_key LIKE 'mid:old-%%'")
    window = 86400.0
    assert store.purge_sync(time.time() - window) == 20  # in batches of 7: 7 + 7 + 6
    assert store.purge_sync(time.time() - window) == 0
    assert store.get(Q, "mid:fresh") == ("done", 1, "")
    # a message id older than the window is new again: it may run
    claim = store.claim_sync(Q, "mid:old-3", "host-a:1:1", lease())
    assert (claim.granted, claim.state) == (True, None)
    # a record within the window survives a purge at its edge
    sql(db_url, "UPDATE event_deliveries SET updated_at = now() - interval '23 hours' WHERE message_key = 'mid:fresh'")
    assert store.purge_sync(time.time() - window) == 0


def _race(store_count: int, claim: Callable[[PostgresDedupStore, str], Claim],
          stores: Callable[..., PostgresDedupStore]) -> list[Claim]:
    """Claim at the same moment from STORE_COUNT stores (own pools: like replicas); their answers."""
    racers = [stores(pool_size=1) for _ in range(store_count)]
    for s in racers:  # connect (and migrate) before the race, so the race is only the claim
        s.get(Q, "warm-up")
    barrier = threading.Barrier(store_count)
    results: list[Claim] = []
    lock = threading.Lock()

    def run(index: int) -> None:
        barrier.wait(timeout=30)
        got = claim(racers[index], f"host-{index}:1:1")
        with lock:
            results.append(got)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(store_count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == store_count
    return results


def test_concurrent_claimers_of_one_new_message_one_wins(stores: Callable[..., PostgresDedupStore]) -> None:
    for round_ in range(10):
        key = f"mid:new-{round_}-{uuid.uuid4().hex[:6]}"
        results = _race(6, lambda s, owner, k=key: s.claim_sync(Q, k, owner, lease()), stores)  # type: ignore[misc]
        winners = [r for r in results if r.granted]
        assert len(winners) == 1, results
        assert all(r.state == State.RUNNING and r.owner == winners[0].owner for r in results if not r.granted)


def test_concurrent_claimers_of_one_failed_message_one_wins(stores: Callable[..., PostgresDedupStore]) -> None:
    setup = stores()
    for round_ in range(10):
        key = f"mid:failed-{round_}"
        setup.record_sync(Q, key, State.FAILED, 2, "HTTP 500: boom")
        results = _race(6, lambda s, owner, k=key: s.claim_sync(Q, k, owner, lease()), stores)  # type: ignore[misc]
        winners = [r for r in results if r.granted]
        assert len(winners) == 1, results
        assert (winners[0].state, winners[0].attempts) == (State.FAILED, 2)
        assert all(r.state == State.RUNNING for r in results if not r.granted)


def test_a_stopped_database_fails_the_call_and_a_restarted_one_serves_again() -> None:
    """The pool drops dead connections: after a restart the store works again without a new object."""
    from tests.support.services import postgres_server

    with postgres_server() as server:
        store = PostgresDedupStore(server.url)
        try:
            assert store.claim_sync(Q, "mid:before", "host-a:1:1", lease()).granted
            server.stop("fast")
            started = time.monotonic()
            with pytest.raises(psycopg2.OperationalError):
                store.record_sync(Q, "mid:before", State.DONE, 1)
            print(f"a stopped database failed a write after {time.monotonic() - started:.1f}s of retries")
            server.restart()
            store.record_sync(Q, "mid:before", State.DONE, 1)
            assert store.get(Q, "mid:before") == ("done", 1, "")
        finally:
            store.close()
