"""The event store's write batcher: writes asked for in one turn of the loop are one transaction, in order, each
caller gets its own result, and a failed transaction fails every write in it (none is silently dropped)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sless_api.services.events.batching import ClaimWrite, RecordWrite, Write, WriteBatcher
from sless_api.services.events.dedup import SqliteDedupStore, State


def test_writes_of_one_turn_are_one_batch_in_order() -> None:
    seen: list[list[Write]] = []

    async def execute(writes: Sequence[Write]) -> list[Any]:
        seen.append(list(writes))
        return [w.key for w in writes]

    async def main() -> list[Any]:
        batcher = WriteBatcher(execute)
        writes = [ClaimWrite("q", f"k{i}", "me", 1.0) if i % 2 else RecordWrite("q", f"k{i}", "done", 1, "")
                  for i in range(10)]
        results = await asyncio.gather(*(batcher.submit(w) for w in writes))
        later = await batcher.submit(RecordWrite("q", "late", "done", 1, ""))
        return [*results, later, batcher.batches]

    *results, late, batches = asyncio.run(main())
    assert results == [f"k{i}" for i in range(10)] and late == "late"
    assert batches == 2 and [len(b) for b in seen] == [10, 1]
    assert [w.key for w in seen[0]] == [f"k{i}" for i in range(10)]


def test_a_batch_is_capped() -> None:
    async def execute(writes: Sequence[Write]) -> list[Any]:
        return [len(writes)] * len(writes)

    async def main() -> list[Any]:
        batcher = WriteBatcher(execute, max_batch=4)
        return await asyncio.gather(*(batcher.submit(RecordWrite("q", str(i), "done", 1, "")) for i in range(10)))

    assert asyncio.run(main()) == [4] * 8 + [2] * 2


def test_a_failed_transaction_fails_every_write_in_it() -> None:
    async def execute(writes: Sequence[Write]) -> list[Any]:
        raise OSError("disk full")

    async def main() -> list[Any]:
        batcher = WriteBatcher(execute)
        return await asyncio.gather(*(batcher.submit(RecordWrite("q", str(i), "done", 1, "")) for i in range(3)),
                                    return_exceptions=True)

    outcomes = asyncio.run(main())
    assert len(outcomes) == 3 and all(isinstance(o, OSError) for o in outcomes)


def test_the_sqlite_store_claims_a_window_in_one_transaction(tmp_path: Path) -> None:
    """Eight messages' claims and records in one turn: two transactions, and the rules of one claim each hold
    (a second claim of a running message is refused, a done one is answered as done)."""
    store = SqliteDedupStore(tmp_path / "dedup.db")

    async def main() -> tuple[list[Any], list[Any], int]:
        first = await asyncio.gather(*(store.claim("q", f"m{i}", "me", 9e9) for i in range(8)))
        await asyncio.gather(*(store.record("q", f"m{i}", State.DONE, 1) for i in range(4)))
        again = await asyncio.gather(*(store.claim("q", f"m{i}", "other", 9e9) for i in range(8)))
        return first, again, store.batcher.batches

    try:
        first, again, batches = asyncio.run(main())
    finally:
        store.close()
    assert all(c.granted and c.state is None for c in first)
    assert [c.state for c in again] == [State.DONE] * 4 + [State.RUNNING] * 4
    assert not any(c.granted for c in again) and {c.owner for c in again[4:]} == {"me"}
    assert batches == 3


def test_a_failed_message_is_claimed_again_with_its_attempts(tmp_path: Path) -> None:
    store = SqliteDedupStore(tmp_path / "dedup.db")

    async def main() -> Any:
        await store.record("q", "m", State.FAILED, 2, "HTTP 500")
        return await store.claim("q", "m", "me", 9e9)

    try:
        claim = asyncio.run(main())
    finally:
        store.close()
    assert (claim.granted, claim.state, claim.attempts, claim.reason) == (True, State.FAILED, 2, "HTTP 500")


def test_records_wait_for_company_and_a_claim_takes_them_along() -> None:
    """Records coming within the linger share a transaction; a claim goes out in the next turn and takes the
    records waiting with it (timers run in the order they are due, so this does not depend on the machine)."""
    seen: list[list[str]] = []

    async def execute(writes: Sequence[Write]) -> list[Any]:
        seen.append([w.key for w in writes])
        return [None] * len(writes)

    async def later(batcher: WriteBatcher, delay: float, write: Write) -> Any:
        await asyncio.sleep(delay)
        return await batcher.submit(write)

    async def main(linger: float) -> None:
        batcher = WriteBatcher(execute, linger_sec=linger)
        await asyncio.gather(batcher.submit(RecordWrite("q", "r1", "done", 1, "")),
                             later(batcher, 0.01, RecordWrite("q", "r2", "done", 1, "")))
        await asyncio.gather(batcher.submit(RecordWrite("q", "r3", "done", 1, "")),
                             later(batcher, 0.01, ClaimWrite("q", "c1", "me", 1.0)))

    asyncio.run(main(0.2))
    assert seen == [["r1", "r2"], ["r3", "c1"]]
    seen.clear()
    asyncio.run(main(0.0))
    assert seen == [["r1"], ["r2"], ["r3"], ["c1"]]


def test_one_batch_at_a_time_and_what_comes_meanwhile_is_the_next() -> None:
    """A group commit: while a transaction runs, the writes asked for gather into the next one."""
    seen: list[list[str]] = []

    async def main() -> None:
        release = asyncio.Event()

        async def execute(writes: Sequence[Write]) -> list[Any]:
            seen.append([w.key for w in writes])
            if len(seen) == 1:
                await release.wait()
            return [None] * len(writes)

        batcher = WriteBatcher(execute, linger_sec=0.0)
        first = asyncio.ensure_future(batcher.submit(ClaimWrite("q", "a", "me", 1.0)))
        for _ in range(20):  # a few turns of the loop: the submit, the flush, the batch's task
            await asyncio.sleep(0)
        assert seen == [["a"]]
        rest = [asyncio.ensure_future(batcher.submit(ClaimWrite("q", k, "me", 1.0))) for k in "bcd"]
        for _ in range(20):
            await asyncio.sleep(0)
        assert seen == [["a"]]  # not started while the first runs
        release.set()
        await asyncio.gather(first, *rest)

    asyncio.run(main())
    assert seen == [["a"], ["b", "c", "d"]]


def test_a_store_from_before_first_seen_gains_the_column(tmp_path: Path) -> None:
    """A state database written before ``first_seen`` existed: opened, the column is added; its old rows read
    None, new ones the time of their first claim."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE event_deliveries (queue TEXT NOT NULL, message_key TEXT NOT NULL, state TEXT NOT "
                   "NULL, attempts INTEGER NOT NULL, owner TEXT NOT NULL, lease_until REAL NOT NULL, reason TEXT NOT "
                   "NULL DEFAULT '', updated_at REAL NOT NULL, PRIMARY KEY (queue, message_key))")
        db.execute("INSERT INTO event_deliveries VALUES ('q', 'old', 'failed', 1, '', 0, 'HTTP 500', 1.0)")
    store = SqliteDedupStore(path)

    async def main() -> tuple[Any, Any]:
        return await store.claim("q", "old", "me", 9e9), await store.claim("q", "new", "me", 9e9)

    try:
        before = time.time()
        old, new = asyncio.run(main())
    finally:
        store.close()
    assert (old.granted, old.attempts, old.first_seen) == (True, 1, None)
    assert new.granted and new.first_seen is not None and new.first_seen >= before
