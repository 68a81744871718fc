"""Several dispatcher replicas on one queue, sharing the PostgreSQL idempotency store (real broker, real server).

What ``sless-events`` with ``replicas > 1`` does: every replica consumes every trigger's queue, so the
broker hands copies of one message id to different replicas; the shared store must run the function
once. Replicas are told apart by their owner names (another host each), so a claim of one is never
taken for a dead process of the other: only its lease ends it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import pika
import pytest

from sless_api.services.events import CallResult, Dispatcher, EventsConfig, EventTarget
from sless_api.services.events.pgdedup import PostgresDedupStore
from tests.support.poll import until
from tests.support.rabbitmq import RabbitBroker, drain, publish, queue_counts
from tests.support.services import fresh_pg_database

pytestmark = [pytest.mark.pg, pytest.mark.rabbitmq]

POLL = 0.05  # s between looks: the replicas settle a message in milliseconds


class Replicas:
    """N dispatchers on one event loop thread, each with its own store (own connections) on one database."""

    def __init__(self, broker_url: str, db_url: str, count: int, delay: float = 0.3) -> None:
        ns = "sless-" + uuid.uuid4().hex[:16]
        self.target = EventTarget(ns, "trig", "fn", "orders", timeout_sec=5.0)
        self.config = EventsConfig(url=broker_url, prefetch=2, max_retries=1, retry_backoff_sec=0.05,
                                   retry_backoff_max_sec=0.1, reconnect_max_sec=1.0, resync_sec=5.0, drain_sec=5.0)
        self.delay = delay
        self.calls: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.stores = [PostgresDedupStore(db_url, pool_size=2) for _ in range(count)]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.dispatchers: list[Dispatcher] = [self.run(self._make(i)) for i in range(count)]

    async def _make(self, index: int) -> Dispatcher:
        d = Dispatcher(self.config, self._targets, self._invoke, self.stores[index], owner=f"replica-{index}:1:1")
        d.start()
        return d

    def run(self, coro: Any, timeout: float = 60) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    async def _targets(self) -> list[EventTarget]:
        return [self.target]

    async def _invoke(self, target: EventTarget, body: bytes, attempt: int) -> CallResult:
        event = json.loads(body)
        with self.lock:
            self.calls[event["id"]] += 1
        await asyncio.sleep(self.delay)
        return CallResult(200)

    def stat(self, name: str) -> int:
        return sum(d.stats[name] for d in self.dispatchers)

    def close(self) -> None:
        try:
            for d in self.dispatchers:
                self.run(d.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            for s in self.stores:
                s.close()


@pytest.fixture
def db_url(pg_url: str) -> str:
    return fresh_pg_database(pg_url)


@pytest.fixture
def replicas(rabbitmq_url: str, db_url: str) -> Iterator[Replicas]:
    r = Replicas(rabbitmq_url, db_url, 2)
    yield r
    r.close()


def test_copies_of_one_message_on_two_replicas_run_once(replicas: Replicas, rabbitmq_broker: RabbitBroker) -> None:
    r = replicas
    q = r.target.broker_queue
    until("two consumers", lambda: queue_counts(rabbitmq_broker, q)[1] == 2, 60, POLL)
    pairs = 8
    # each id twice in a row: the broker deals them round robin, one copy to each replica
    publish(rabbitmq_broker, q, [{"n": i // 2} for i in range(2 * pairs)],
            lambda i: pika.BasicProperties(message_id=f"pair-{i // 2}", content_type="application/json",
                                           delivery_mode=2))
    until("every delivery settled", lambda: r.stat("done") + r.stat("duplicate") == 2 * pairs, 60, POLL)
    assert r.calls == Counter({f"pair-{i}": 1 for i in range(pairs)})
    assert r.stat("done") == pairs and r.stat("duplicate") == pairs
    assert all(d.stats["delivered"] > 0 for d in r.dispatchers), "one replica got every message"
    until("queue empty", lambda: queue_counts(rabbitmq_broker, q)[0] == 0, 60, POLL)
    assert r.stores[0].get(q, "mid:pair-0") == ("done", 1, "")


def test_a_claim_of_a_replica_that_vanished_ends_with_its_lease(replicas: Replicas,
                                                                rabbitmq_broker: RabbitBroker) -> None:
    r = replicas
    q = r.target.broker_queue
    # what a replica killed mid-call on another node leaves: a running claim, its lease 3 s from now
    lease_until = time.time() + 3
    assert r.stores[0].claim_sync(q, "mid:orphan", "node-gone:1:1", lease_until).granted
    until("two consumers", lambda: queue_counts(rabbitmq_broker, q)[1] == 2, 60, POLL)
    publish(rabbitmq_broker, q, [{"n": 1}],
            lambda i: pika.BasicProperties(message_id="orphan", content_type="application/json", delivery_mode=2))
    [(props, _)] = drain(rabbitmq_broker, r.target.dlq, 1, timeout=30)
    assert time.time() >= lease_until, "dead-lettered before the lease ended"
    assert props.headers["x-sless-kind"] == "interrupted" and "node-gone:1:1" in props.headers["x-sless-reason"]
    assert r.calls == Counter()  # the function is not run a second time
    assert r.stores[1].get(q, "mid:orphan")[0] == "dead"  # type: ignore[index]
