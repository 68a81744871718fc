"""The async-call store on real SQLite and PostgreSQL: one claim per call across owners, fenced settles,
orphans queued again, paging and purging."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import pytest

from sless_api.services.asynccalls.model import AsyncCall, CallState, new_call_id
from sless_api.services.asynccalls.store import CallStore, store_from_url

NOW = 1_800_000_000.0  # fixed times: the store compares what it is given, never the clock


def call(n: int, namespace: str = "sless-00000000000000aa", function: str = "fn") -> AsyncCall:
    return AsyncCall(id=new_call_id(), namespace=namespace, function=function, method="POST", path=f"/{n}",
                     headers=[("X-N", str(n))], body=bytes([n]) * 3, request_id=f"rid-{n}", created_at=NOW + n,
                     next_attempt_at=NOW + n)


@pytest.fixture
def stores(db_url: str) -> Iterator[tuple[CallStore, CallStore]]:
    """Two stores on one database, as two API processes have."""
    first, second = store_from_url(db_url), store_from_url(db_url)
    yield first, second
    first.close()
    second.close()


def test_a_call_round_trips_and_only_its_namespace_sees_it(stores: tuple[CallStore, CallStore]) -> None:
    store, _ = stores
    made = call(1)
    store.add(made)
    found = store.get(made.namespace, made.id)
    assert found is not None and (found.body, found.headers, found.request_id) == (b"\x01" * 3, [("X-N", "1")], "rid-1")
    assert found.state == CallState.QUEUED
    assert store.get("sless-00000000000000bb", made.id) is None


def test_each_due_call_is_claimed_once_across_owners(stores: tuple[CallStore, CallStore]) -> None:
    first, second = stores
    made = [call(n) for n in range(20)]
    for item in made:
        first.add(item)

    def drain(store: CallStore, owner: str) -> list[str]:
        got = []
        while (claimed := store.claim(owner, NOW + 100, NOW + 1000)) is not None:
            got.append(claimed.id)
        return got

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a, b = pool.map(drain, (first, second), ("owner-a", "owner-b"))
    assert sorted(a + b) == sorted(c.id for c in made) and not set(a) & set(b)


def test_calls_not_yet_due_wait_and_expired_leases_are_taken_over(stores: tuple[CallStore, CallStore]) -> None:
    store, _ = stores
    later = call(50)
    store.add(later)
    assert store.claim("a", NOW, NOW + 10) is None  # due at NOW + 50
    taken = store.claim("a", NOW + 60, NOW + 70)
    assert taken is not None and (taken.attempts, taken.lease_owner) == (1, "a")
    assert store.claim("b", NOW + 65, NOW + 80) is None  # a's lease holds
    again = store.claim("b", NOW + 71, NOW + 90)
    assert again is not None and (again.id, again.attempts, again.lease_owner) == (later.id, 2, "b")
    # the first owner's late outcome is refused: b decides now
    taken.state, taken.finished_at = CallState.SUCCEEDED, NOW + 72
    assert not store.settle(taken, "a")
    again.state, again.finished_at, again.result_status, again.result_body = CallState.SUCCEEDED, NOW + 73, 200, b"ok"
    assert store.settle(again, "b")
    done = store.get(later.namespace, later.id)
    assert done is not None and (done.state, done.result_body, done.lease_owner) == (CallState.SUCCEEDED, b"ok", "")


def test_orphans_of_a_gone_runner_are_queued_again(stores: tuple[CallStore, CallStore]) -> None:
    store, _ = stores
    for n in (1, 2):
        store.add(call(n))
    assert store.claim("gone", NOW + 5, NOW + 10_000) is not None
    assert store.claim("alive", NOW + 5, NOW + 10_000) is not None
    assert store.requeue_orphans(lambda owner: owner == "gone") == 1
    assert store.claim("new", NOW + 5, NOW + 10_000) is not None
    assert store.claim("new", NOW + 5, NOW + 10_000) is None  # "alive" still holds the other


def test_listing_pages_newest_first_by_function_and_state_and_purge_forgets_old_ends(
        stores: tuple[CallStore, CallStore]) -> None:
    store, _ = stores
    made = [call(n, function="a" if n % 2 else "b") for n in range(6)]
    for item in made:
        store.add(item)
    page = store.list(made[0].namespace, "a", None, 2, None)
    assert [c.id for c in page] == [made[5].id, made[3].id]
    assert [c.id for c in store.list(made[0].namespace, "a", None, 2, page[-1].id)] == [made[1].id]
    assert store.list(made[0].namespace, None, "dead", 10, None) == []
    claimed = store.claim("o", NOW + 10, NOW + 20)
    assert claimed is not None
    claimed.state, claimed.finished_at = CallState.DEAD, NOW + 11
    assert store.settle(claimed, "o")
    assert [c.id for c in store.list(made[0].namespace, None, "dead", 10, None)] == [claimed.id]
    assert store.purge(NOW + 12) == 1 and store.get(claimed.namespace, claimed.id) is None
    assert len(store.list(made[0].namespace, None, None, 10, None)) == 5


def test_a_store_opens_an_existing_database_again(db_url: str) -> None:
    first = store_from_url(db_url)
    first.add(call(1))
    first.close()
    again = store_from_url(db_url)
    try:
        assert len(again.list("sless-00000000000000aa", None, None, 10, None)) == 1
    finally:
        again.close()


def test_a_callback_is_delivered_by_one_owner_and_a_forgotten_one_is_found(stores: tuple[CallStore, CallStore]
                                                                            ) -> None:
    first, second = stores
    made = call(30)
    made.callback_url, made.callback_state = "https://hooks.example.com/h?t=1", "pending"
    first.add(made)
    claimed = first.claim("owner-a", NOW + 100, NOW + 1000)
    assert claimed is not None and claimed.callback_url == made.callback_url
    claimed.state, claimed.finished_at = CallState.SUCCEEDED, NOW + 101
    assert first.settle(claimed, "owner-a")
    # its runner stopped before delivering: a later scan finds it, but only once it is old enough
    assert [c.id for c in second.stale_callbacks(NOW + 100, 10)] == []
    assert [c.id for c in second.stale_callbacks(NOW + 200, 10)] == [made.id]
    assert second.take_callback(made.id, NOW + 50) and not first.take_callback(made.id, NOW + 50)  # one delivery
    # the delivering process stops mid-way: once the call is old enough, another takes the delivery over
    assert [c.id for c in first.stale_callbacks(NOW + 200, 10)] == [made.id]
    assert first.take_callback(made.id, NOW + 200) and not second.take_callback(made.id, NOW + 50)
    second.set_callback_state(made.id, "delivered: HTTP 204")
    assert second.stale_callbacks(NOW + 200, 10) == []
    found = first.get(made.namespace, made.id)
    assert found is not None and found.callback_state == "delivered: HTTP 204"
    plain = call(31)
    first.add(plain)
    got = first.get(plain.namespace, plain.id)
    assert got is not None and (got.callback_url, got.callback_state) == (None, None)


def test_a_cut_call_is_given_back_due_now_by_its_owner_only(stores: tuple[CallStore, CallStore]) -> None:
    store, other = stores
    made = call(3)
    store.add(made)
    taken = store.claim("a", NOW + 5, NOW + 10_000)
    assert taken is not None and taken.attempts == 1
    assert not other.release(made.id, "b", NOW + 6)  # not b's to give back
    assert other.claim("b", NOW + 6, NOW + 10_000) is None  # a's lease holds
    assert store.release(made.id, "a", NOW + 6)
    assert not store.release(made.id, "a", NOW + 6)  # once
    again = other.claim("b", NOW + 6, NOW + 10_000)  # at once, long before a's lease would have ended
    assert again is not None and (again.id, again.attempts, again.lease_owner) == (made.id, 1, "b")
