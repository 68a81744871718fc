"""The event dispatcher against a real RabbitMQ broker and the real SQLite idempotency store.

The dispatcher's contract with a backend is two callables; here ``invoke`` is an in-process
function under the test's control (a function that fails N times, is slow, answers 4xx...), so the
broker-side behaviour (acks, retries, dead-lettering, reconnects, redeliveries) is what is tested.
The whole path through `sless up` and real runtimes is in tests/e2e/test_events.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from sless_api.services.events import CallResult, Dispatcher, EventsConfig, EventTarget, SqliteDedupStore
from sless_api.services.events.dedup import process_owner
from tests.support.poll import holds, until
from tests.support.rabbitmq import RabbitBroker, drain, publish, queue_counts

pytestmark = pytest.mark.rabbitmq

POLL = 0.05  # s between looks: a dispatcher acts in milliseconds, and some tests act on a stream mid-way

Handler = Callable[[dict[str, Any]], CallResult]


def ok(_event: dict[str, Any]) -> CallResult:
    return CallResult(200)


class Harness:
    """A dispatcher on its own event loop thread, with a trigger list and a function the test controls."""

    def __init__(self, url: str, db: Path, handler: Handler = ok, target: EventTarget | None = None,
                 **config: Any) -> None:
        self.ns = target.namespace if target else "sless-" + uuid.uuid4().hex[:16]
        self.target = target or EventTarget(self.ns, "trig", "fn", "jobs", timeout_sec=5.0)
        self.db_path = db
        self.targets: list[EventTarget] = [self.target]
        self.handler = handler
        self.calls: list[dict[str, Any]] = []
        self.attempts: list[int] = []  # the attempt number each call was made as
        self.active = 0
        self.max_active = 0
        self.delay = 0.0
        self.lock = threading.Lock()
        settings = {"prefetch": 4, "max_retries": 2, "retry_backoff_sec": 0.05, "retry_backoff_max_sec": 0.2,
                    "reconnect_max_sec": 1.0, "resync_sec": 5.0, "drain_sec": 5.0, **config}
        self.config = EventsConfig(url=url, **settings)
        self.store = SqliteDedupStore(db)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.dispatcher: Dispatcher = self.run(self._make())
        self.run(self._start())

    async def _make(self) -> Dispatcher:
        return Dispatcher(self.config, self._targets, self._invoke, self.store, max_body_bytes=64 * 1024)

    async def _start(self) -> None:
        self.dispatcher.start()

    def run(self, coro: Any, timeout: float = 60) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    async def _targets(self) -> list[EventTarget]:
        return list(self.targets)

    async def _invoke(self, target: EventTarget, body: bytes, attempt: int) -> CallResult:
        event = json.loads(body)
        with self.lock:
            self.calls.append(event)
            self.attempts.append(attempt)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            return self.handler(event)
        finally:
            with self.lock:
                self.active -= 1

    def set_targets(self, targets: list[EventTarget]) -> None:
        self.targets = targets
        self.loop.call_soon_threadsafe(self.dispatcher.refresh)

    def wait_consuming(self, broker: RabbitBroker, queue: str | None = None, consumers: int = 1,
                       timeout: float = 30) -> None:
        name = queue or self.target.broker_queue
        until(f"{name} with {consumers} consumer(s)", lambda: queue_counts(broker, name)[1] == consumers,
              timeout, 0.1)

    def ids(self) -> list[str]:
        with self.lock:
            return [c["id"] for c in self.calls]

    def close(self) -> None:
        if not self.thread.is_alive():
            return
        try:
            self.run(self.dispatcher.close(), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.store.close()


@pytest.fixture
def harness_factory(rabbitmq_url: str, tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(handler: Handler = ok, target: EventTarget | None = None, **config: Any) -> Harness:
        h = Harness(rabbitmq_url, tmp_path / f"state-{len(made)}.db", handler, target, **config)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


# ------------------------------------------------------------------------------------------ delivery


def test_delivery_acks_every_message_once(harness_factory: Callable[..., Harness],
                                          rabbitmq_broker: RabbitBroker) -> None:
    h = harness_factory()
    h.wait_consuming(rabbitmq_broker)
    publish(rabbitmq_broker, h.target.broker_queue, [{"n": i} for i in range(30)])
    until("30 calls", lambda: len(h.calls) >= 30, 30, POLL)
    holds("each of the 30 messages called once, no more", lambda: sorted(h.ids()) == sorted(f"m{i}" for i in range(30)),
          for_sec=0.5, why="a second call of a message (one acked late, or redelivered) would come from the broker "
          "within milliseconds of the others; 0.5 s is many times that")
    first = next(c for c in h.calls if c["id"] == "m7")
    assert first["data"] == {"n": 7} and first["specversion"] == "1.0"
    assert first["_trigger"] == "trig" and first["_queue"] == f"{h.ns}.jobs"
    assert first["_amqp"]["redelivered"] is False
    h.close()  # anything left unacked would go back to the queue now
    assert queue_counts(rabbitmq_broker, h.target.broker_queue) == (0, 0)
    assert queue_counts(rabbitmq_broker, h.target.dlq)[0] == 0


def test_prefetch_one_keeps_queue_order_through_retries(harness_factory: Callable[..., Harness],
                                                        rabbitmq_broker: RabbitBroker) -> None:
    failures = {"m5": 2, "m12": 1}

    def flaky(event: dict[str, Any]) -> CallResult:
        left = failures.get(event["id"], 0)
        if left:
            failures[event["id"]] = left - 1
            return CallResult(503, "not yet")
        return CallResult(200)

    h = harness_factory(flaky, prefetch=1)
    h.delay = 0.01
    h.wait_consuming(rabbitmq_broker)
    publish(rabbitmq_broker, h.target.broker_queue, [{"n": i} for i in range(25)])
    until("25 messages and 3 retries", lambda: len(h.calls) >= 28, 30, POLL)
    ids = h.ids()
    expected = [f"m{i}" for i in range(25)]
    assert [i for n, i in enumerate(ids) if i not in ids[:n]] == expected  # first calls in queue order
    assert ids.count("m5") == 3 and ids.count("m12") == 2
    assert ids[5:8] == ["m5"] * 3  # retried in place: the next message waited
    assert h.max_active == 1


def test_a_function_limit_bounds_the_messages_taken_at_once(harness_factory: Callable[..., Harness],
                                                              rabbitmq_broker: RabbitBroker) -> None:
    """Prefetch 4, but the function runs at most 2 calls at once: the trigger takes 2 messages at a time (more
    would only wait in the dispatcher's hands), and all are handled."""
    ns = "sless-" + uuid.uuid4().hex[:16]
    h = harness_factory(target=EventTarget(ns, "trig", "fn", "jobs", timeout_sec=5.0, concurrency=2), prefetch=4)
    h.delay = 0.2
    h.wait_consuming(rabbitmq_broker)
    publish(rabbitmq_broker, h.target.broker_queue, [{"n": i} for i in range(8)])
    until("8 calls", lambda: len(h.calls) >= 8, 30, POLL)
    assert h.max_active == 2
    assert EventTarget(ns, "t", "f", "q", 5.0).prefetch(8) == 8  # no limit: the platform's setting
    assert EventTarget(ns, "t", "f", "q", 5.0, concurrency=100).prefetch(8) == 8


# ------------------------------------------------------------------------------- failures and the DLQ


def test_retries_then_dead_letter_with_reason(harness_factory: Callable[..., Harness],
                                              rabbitmq_broker: RabbitBroker) -> None:
    h = harness_factory(lambda e: CallResult(500, "boom: database down"), max_retries=2)
    h.wait_consuming(rabbitmq_broker)
    publish(rabbitmq_broker, h.target.broker_queue, [{"n": 1}],
            lambda i: pika.BasicProperties(message_id="doomed", content_type="application/json", delivery_mode=2,
                                           headers={"tenant-tag": "keep-me"}, correlation_id="corr-1"))
    [(props, body)] = drain(rabbitmq_broker, h.target.dlq, 1)
    assert h.ids() == ["doomed"] * 3  # the first call and max_retries=2 retries
    assert h.attempts == [1, 2, 3]
    assert json.loads(body) == {"n": 1}
    assert props.message_id == "doomed" and props.correlation_id == "corr-1" and props.delivery_mode == 2
    headers = props.headers
    assert headers["tenant-tag"] == "keep-me"
    assert headers["x-sless-kind"] == "failed"
    assert headers["x-sless-attempts"] == 3
    assert headers["x-sless-status"] == 500
    assert "boom: database down" in headers["x-sless-reason"]
    assert headers["x-sless-trigger"] == f"{h.ns}/trig" and headers["x-sless-function"] == "fn"
    assert h.store.get(h.target.broker_queue, "mid:doomed")[0] == "dead"
    until("an empty queue", lambda: queue_counts(rabbitmq_broker, h.target.broker_queue)[0] == 0, 30, POLL)


def test_timeouts_and_429_are_retried_other_4xx_dead_lettered_at_once(
        harness_factory: Callable[..., Harness], rabbitmq_broker: RabbitBroker) -> None:
    answers = {"slow": [504, 200], "busy": [429, 429, 200], "bad": [422], "gone": [404]}

    def scripted(event: dict[str, Any]) -> CallResult:
        status = answers[event["id"]].pop(0)
        return CallResult(status, None if status < 500 else "function did not answer within 5s")

    h = harness_factory(scripted, max_retries=3)
    h.wait_consuming(rabbitmq_broker)
    publish(rabbitmq_broker, h.target.broker_queue, [{}] * 4,
            lambda i: pika.BasicProperties(message_id=list(answers)[i], content_type="application/json"))
    dead = drain(rabbitmq_broker, h.target.dlq, 2)
    kinds = {p.message_id: (p.headers["x-sless-kind"], p.headers["x-sless-attempts"]) for p, _ in dead}
    assert kinds == {"bad": ("rejected", 1), "gone": ("rejected", 1)}
    until("all calls", lambda: len(h.calls) == 2 + 3 + 1 + 1, 30, POLL)
    assert h.ids().count("slow") == 2 and h.ids().count("busy") == 3


def test_platform_errors_are_retried_even_when_4xx(harness_factory: Callable[..., Harness],
                                                   rabbitmq_broker: RabbitBroker) -> None:
    answers = [CallResult(404, "function 'fn' is not deployed", platform_error=True), CallResult(200)]
    h = harness_factory(lambda e: answers.pop(0))
    h.wait_consuming(rabbitmq_broker)
    publish(rabbitmq_broker, h.target.broker_queue, [{}])
    until("a retry", lambda: len(h.calls) == 2, 30, POLL)
    holds("nothing dead-lettered after the retry succeeded",
          lambda: queue_counts(rabbitmq_broker, h.target.dlq)[0] == 0, for_sec=0.3,
          why="a message is dead-lettered right after the call that gives up on it answers, a publish "
          "of milliseconds; the retry answered already, and 0.3 s is ample for a wrong dead letter to show")


def test_poison_messages_go_straight_to_the_dlq(harness_factory: Callable[..., Harness],
                                                rabbitmq_broker: RabbitBroker) -> None:
    h = harness_factory()
    h.wait_consuming(rabbitmq_broker)
    poison: list[tuple[bytes, pika.BasicProperties]] = [
        (b"{not json", pika.BasicProperties(message_id="p1", content_type="application/json")),
        (b"\xff\xfe", pika.BasicProperties(message_id="p2")),
        (json.dumps({"specversion": "1.0", "source": "/x", "type": "t"}).encode(),
         pika.BasicProperties(message_id="p3", content_type="application/cloudevents+json")),
        (b"{}", pika.BasicProperties(message_id="p4", headers={"ce-specversion": "1.0", "ce-id": "1"})),
        (b"x" * (70 * 1024), pika.BasicProperties(message_id="p5", content_type="text/plain")),
        (b"{}", pika.BasicProperties(message_id="p6", content_encoding="gzip")),
    ]
    publish(rabbitmq_broker, h.target.broker_queue, [b for b, _ in poison], lambda i: poison[i][1])
    publish(rabbitmq_broker, h.target.broker_queue, [{"fine": True}],
            lambda i: pika.BasicProperties(message_id="good", content_type="application/json"))
    dead = drain(rabbitmq_broker, h.target.dlq, len(poison))
    reasons = {p.message_id: p.headers["x-sless-reason"] for p, _ in dead}
    assert all(p.headers["x-sless-kind"] == "malformed" and p.headers["x-sless-attempts"] == 0 for p, _ in dead)
    assert "not JSON" in reasons["p1"] and "not JSON" in reasons["p2"]
    assert "without id" in reasons["p3"] and "source" in reasons["p4"] and "type" in reasons["p4"]
    assert "at most" in reasons["p5"] and "gzip" in reasons["p6"]
    assert next(b for p, b in dead if p.message_id == "p2") == b"\xff\xfe"  # the body is kept as it was
    until("the good message", lambda: h.ids() == ["good"], 30, POLL)


# ---------------------------------------------------------------------------------- CloudEvents


def test_cloudevents_structured_and_binary_modes(harness_factory: Callable[..., Harness],
                                                 rabbitmq_broker: RabbitBroker) -> None:
    h = harness_factory()
    h.wait_consuming(rabbitmq_broker)
    structured = {"specversion": "1.0", "id": "ev-1", "source": "/orders", "type": "com.example.order.created",
                  "subject": "order/42", "time": "2026-01-02T03:04:05Z", "datacontenttype": "application/json",
                  "tenantid": "acme", "data": {"order": 42}}
    messages: list[tuple[bytes, pika.BasicProperties]] = [
        (json.dumps(structured).encode(),
         pika.BasicProperties(content_type="application/cloudevents+json; charset=utf-8")),
        (json.dumps({"order": 43}).encode(),
         pika.BasicProperties(content_type="application/json", headers={
             "ce-specversion": "1.0", "ce-id": "ev-2", "ce-source": "/orders", "ce-type": "com.example.order.paid",
             "ce-subject": "order/43", "ce-traceparent": "00-abc-def-01", "x-other": "kept"})),
        (b"hello", pika.BasicProperties(content_type="text/plain", headers={
            "cloudEvents:specversion": "1.0", "cloudEvents:id": "ev-3", "cloudEvents:source": "/greeter",
            "cloudEvents:type": "com.example.greeting"})),
        (json.dumps([1, 2]).encode(), pika.BasicProperties(message_id="plain-1", type="com.example.list",
                                                           timestamp=1767225600)),
    ]
    publish(rabbitmq_broker, h.target.broker_queue, [b for b, _ in messages], lambda i: messages[i][1])
    until("four events", lambda: len(h.calls) == 4, 30, POLL)
    by_id = {c["id"]: c for c in h.calls}
    s = by_id["ev-1"]
    assert {k: s[k] for k in structured} == structured
    b = by_id["ev-2"]
    assert (b["specversion"], b["source"], b["type"], b["subject"]) == ("1.0", "/orders", "com.example.order.paid",
                                                                       "order/43")
    assert b["traceparent"] == "00-abc-def-01" and b["data"] == {"order": 43}
    assert b["datacontenttype"] == "application/json"
    assert b["_amqp"]["headers"] == {"x-other": "kept"}
    t = by_id["ev-3"]
    assert t["data"] == "hello" and t["datacontenttype"] == "text/plain" and t["source"] == "/greeter"
    p = by_id["plain-1"]
    assert p["data"] == [1, 2] and p["type"] == "com.example.list" and p["time"] == "2026-01-01T00:00:00Z"
    assert p["source"] == f"/sless/queues/{h.ns}.jobs"


# ------------------------------------------------------------------------------- idempotency


def test_a_message_id_runs_once_within_the_window(harness_factory: Callable[..., Harness],
                                                  rabbitmq_broker: RabbitBroker) -> None:
    h = harness_factory()
    h.wait_consuming(rabbitmq_broker)
    same = lambda i: pika.BasicProperties(message_id="dup-1", content_type="application/json")  # noqa: E731
    publish(rabbitmq_broker, h.target.broker_queue, [{"n": 1}], same)
    until("the first call", lambda: len(h.calls) == 1, 30, POLL)
    publish(rabbitmq_broker, h.target.broker_queue, [{"n": 1}, {"n": 1}], same)  # a publisher retrying
    until("two duplicates skipped", lambda: h.dispatcher.stats["duplicate"] == 2, 30, POLL)
    assert h.ids() == ["dup-1"]
    until("all acked", lambda: queue_counts(rabbitmq_broker, h.target.broker_queue)[0] == 0, 30, POLL)


def test_a_call_interrupted_by_a_dead_dispatcher_is_not_repeated(harness_factory: Callable[..., Harness],
                                                                 rabbitmq_broker: RabbitBroker) -> None:
    h = harness_factory()
    # What a SIGKILLed dispatcher leaves behind (its real counterpart is in tests/e2e/test_events.py):
    # a claim by a process of this host that no longer exists.
    host = process_owner().split(":")[0]
    h.run(h.store.claim(h.target.broker_queue, "mid:half-done", f"{host}:999999999:1", time.time() + 600))
    h.wait_consuming(rabbitmq_broker)
    publish(rabbitmq_broker, h.target.broker_queue, [{"n": 1}],
            lambda i: pika.BasicProperties(message_id="half-done", content_type="application/json"))
    [(props, _)] = drain(rabbitmq_broker, h.target.dlq, 1)
    assert props.headers["x-sless-kind"] == "interrupted"
    assert "outcome is unknown" in props.headers["x-sless-reason"]
    assert h.calls == []


def test_failed_attempts_survive_a_dispatcher_restart(harness_factory: Callable[..., Harness],
                                                      rabbitmq_broker: RabbitBroker) -> None:
    """Retries continue where they stopped: a restart does not grant a fresh set of attempts."""
    first = harness_factory(lambda e: CallResult(500, "down"), max_retries=3, retry_backoff_sec=30.0,
                            retry_backoff_max_sec=30.0)
    first.wait_consuming(rabbitmq_broker)
    publish(rabbitmq_broker, first.target.broker_queue, [{}],
            lambda i: pika.BasicProperties(message_id="stubborn", content_type="application/json"))
    until("the first attempt", lambda: len(first.calls) == 1, 30, POLL)
    first.close()  # during the 30 s backoff: the message goes back to the queue
    restarted_at = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    assert queue_counts(rabbitmq_broker, first.target.broker_queue)[0] == 1
    second = Harness(rabbitmq_broker.url, first.db_path, lambda e: CallResult(500, "still down"),
                     target=first.target, max_retries=3)
    try:
        [(props, _)] = drain(rabbitmq_broker, first.target.dlq, 1)
        assert props.headers["x-sless-attempts"] == 4
        assert len(second.calls) == 3
        # first seen by the dispatcher before the restart, as its store kept it
        assert props.headers["x-sless-first-seen"] < restarted_at < props.headers["x-sless-failed-at"]
        assert (first.attempts, second.attempts) == ([1], [2, 3, 4])  # counted on across the restart
    finally:
        second.close()


# --------------------------------------------------------------------------- trigger life cycle


def test_disable_keeps_messages_queued_and_enable_resumes(harness_factory: Callable[..., Harness],
                                                          rabbitmq_broker: RabbitBroker) -> None:
    h = harness_factory()
    q = h.target.broker_queue
    h.wait_consuming(rabbitmq_broker)
    h.set_targets([])  # disabled (or deleted): the consumer is cancelled
    h.wait_consuming(rabbitmq_broker, consumers=0)
    publish(rabbitmq_broker, q, [{"n": i} for i in range(5)])
    holds("a disabled trigger's messages stay queued, uncalled",
          lambda: h.calls == [] and queue_counts(rabbitmq_broker, q) == (5, 0), for_sec=1.0,
          why="the consumer is cancelled; one left over would be handed the 5 messages by the broker within "
          "milliseconds of the publish; 1 s is far more")
    h.set_targets([h.target])
    until("the queued messages", lambda: len(h.calls) == 5, 30, POLL)
    h.wait_consuming(rabbitmq_broker)


def test_a_changed_function_restarts_the_consumer(harness_factory: Callable[..., Harness],
                                                  rabbitmq_broker: RabbitBroker) -> None:
    h = harness_factory()
    h.wait_consuming(rabbitmq_broker)
    moved = replace(h.target, queue="other")
    h.set_targets([moved])
    h.wait_consuming(rabbitmq_broker, moved.broker_queue)
    h.wait_consuming(rabbitmq_broker, h.target.broker_queue, consumers=0)
    publish(rabbitmq_broker, moved.broker_queue, [{"n": 1}])
    until("a message from the new queue", lambda: len(h.calls) == 1, 30, POLL)


def test_a_deleted_queue_is_declared_again(harness_factory: Callable[..., Harness],
                                           rabbitmq_broker: RabbitBroker) -> None:
    h = harness_factory()
    h.wait_consuming(rabbitmq_broker)
    conn = rabbitmq_broker.connection()
    conn.channel().queue_delete(h.target.broker_queue)
    conn.close()
    h.wait_consuming(rabbitmq_broker, timeout=30)  # the broker cancelled the consumer; it came back
    publish(rabbitmq_broker, h.target.broker_queue, [{"n": 1}])
    until("delivery after the queue came back", lambda: len(h.calls) == 1, 30, POLL)


def test_an_existing_queue_with_other_arguments_is_used_as_is(harness_factory: Callable[..., Harness],
                                                              rabbitmq_broker: RabbitBroker) -> None:
    ns = "sless-" + uuid.uuid4().hex[:16]
    conn = rabbitmq_broker.connection()
    conn.channel().queue_declare(f"{ns}.jobs", durable=True, arguments={"x-max-length": 1000})
    conn.close()
    h = harness_factory(target=EventTarget(ns, "trig", "fn", "jobs", timeout_sec=5.0))
    h.wait_consuming(rabbitmq_broker)
    publish(rabbitmq_broker, h.target.broker_queue, [{"n": 1}])
    until("delivery from the pre-existing queue", lambda: len(h.calls) == 1, 30, POLL)


# ------------------------------------------------------------------------------ broker restart


@pytest.mark.slow
def test_broker_restart_reconnects_and_loses_nothing(harness_factory: Callable[..., Harness],
                                                     rabbitmq_broker: RabbitBroker) -> None:
    h = harness_factory(prefetch=4)
    h.delay = 0.05
    q = h.target.broker_queue
    h.wait_consuming(rabbitmq_broker)
    publish(rabbitmq_broker, q, [{"n": i} for i in range(100)])
    until("the stream to start", lambda: len(h.calls) >= 10, 30, POLL)
    try:
        rabbitmq_broker.stop()
        time.sleep(1.0)  # the scenario: the broker stays away a while, the dispatcher must notice and reconnect
    finally:
        rabbitmq_broker.start()
    h.wait_consuming(rabbitmq_broker, timeout=60)
    publish(rabbitmq_broker, q, [{"n": i} for i in range(100, 120)],
            lambda i: pika.BasicProperties(message_id=f"m{100 + i}", content_type="application/json",
                                           delivery_mode=2))
    until("every message", lambda: set(h.ids()) >= {f"m{i}" for i in range(120)}, 60, POLL)
    holds("no message ran twice", lambda: len(ids := h.ids()) == len(set(ids)), for_sec=0.5,
          why="a message redelivered after the reconnect runs as the consumer gets it, within the prefetch of 4 "
          "calls of 0.05 s each (0.2 s); 0.5 s is more than that")
    assert h.dispatcher.stats["connections"] >= 2
