"""The event dispatcher: RabbitMQ queues in, function calls out, nothing lost and nothing run twice.

It needs three things from a backend: ``list_targets()`` (the enabled event triggers whose
function can be called), ``invoke(target, body)`` (one call through the platform's invoke path)
and a :class:`~sless_api.services.events.dedup.DedupStore`. That is all, so `sless up` runs it in-process
and the Kubernetes backend can run the same class as a process of its own.

Per trigger: one channel with ``basic.qos(prefetch)``, a durable queue ``<namespace>.<queue>`` and
its dead-letter queue ``<namespace>.<queue>.dlq``, manual acks. Per message (README.md here):

1. map it to a CloudEvent (:mod:`.message`); a malformed one goes straight to the DLQ;
2. claim its message id in the store (a redelivery of a finished message is acked unseen);
3. call the function; success -> ``done`` -> ack;
4. failure -> ``failed``, wait (exponential backoff, jitter), call again, up to ``max_retries``
   retries, then publish it to the DLQ (publisher confirm) with the reason in ``x-sless-*``
   headers -> ``dead`` -> ack. A 4xx other than 408/429 is dead-lettered without retries.

The message stays unacknowledged until it is settled, so a crash at any step leaves it in the
queue, and the store tells the redelivery where the previous attempt got to. A lost connection
(broker restart) is retried with backoff; calls already in flight finish and record their outcome,
and their redeliveries are settled from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import aio_pika
import aio_pika.abc
import aio_pika.exceptions

from sless_api import metrics
from sless_api.services.events.acks import AMQP_ERRORS, AckBatcher
from sless_api.services.events.config import EventsConfig
from sless_api.services.events.dedup import Claim, DedupStore, State, owner_gone, process_owner
from sless_api.services.events.message import Delivery, Malformed, encode_event, map_delivery, message_key
from sless_api.services.events.model import (
    DEAD_ID_HEADER,
    CallResult,
    EventTarget,
    Invoke,
    ListTargets,
    Report,
    Verdict,
    judge,
)

log = logging.getLogger("sless.events")

#: Seconds a call's claim outlives the function's timeout (proxy margin, scheduling noise).
LEASE_SLACK_SEC = 15.0
#: How often a redelivery waits on another live owner's claim before looking again.
CLAIM_POLL_SEC = 1.0
PURGE_EVERY_SEC = 600.0
REPORT_EVERY_SEC = 2.0
REASON_MAX = 1000


class Final(StrEnum):
    """How a message's handling ended: what to tell the broker about the delivery."""

    DONE = "done"  # ack
    DEAD = "dead"  # in the DLQ: ack
    REQUEUE = "requeue"  # give it back (shutdown, trigger stopped): nack with requeue


def _set_event(event: asyncio.Event, *_: Any) -> None:
    event.set()


def _iso(seconds: float) -> str:
    """An instant as the dead-letter headers give it: UTC, ISO 8601 with a Z."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _jitter(delay: float) -> float:
    return delay * random.uniform(0.8, 1.2)


class _Consumer:
    """One trigger's subscription: its channel, its consumer tag, its messages in hand."""

    def __init__(self, dispatcher: Dispatcher, target: EventTarget) -> None:
        self.dispatcher = dispatcher
        self.target = target
        self.channel: aio_pika.abc.AbstractChannel | None = None
        self.queue: aio_pika.abc.AbstractQueue | None = None
        self.tag: str | None = None
        self.stopping = asyncio.Event()
        self.broken: str | None = None  # why the broker ended this consumer (restart it)
        self.closing = False  # stop() was called: channel events from now on are expected
        self.active = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.stats: Counter[str] = Counter()
        self.reported: Counter[str] = Counter()
        self.queue_note = ""
        self.acks = AckBatcher()  # this consumer's channel's (start() opens the one channel it has)

    async def start(self, connection: aio_pika.abc.AbstractConnection) -> None:
        cfg = self.dispatcher.config
        target = self.target
        channel = await connection.channel(publisher_confirms=False)
        channel, self.queue, note = await _declare(connection, channel, target.broker_queue)
        channel, _, dlq_note = await _declare(connection, channel, target.dlq)
        self.queue_note = "; ".join(n for n in (note, dlq_note) if n)
        await channel.set_qos(prefetch_count=target.prefetch(cfg.prefetch))
        self.channel = channel
        channel.close_callbacks.add(self._on_channel_close)
        underlay = await channel.get_underlay_channel()
        underlay.on_consumer_cancel_callbacks.add(self._on_broker_cancel)
        self.tag = await self.queue.consume(
            self._on_message, no_ack=False,
            consumer_tag=f"sless.{target.namespace}.{target.trigger}.{uuid.uuid4().hex[:8]}",
            # Honoured by brokers that support per-consumer timeouts; others use consumer_timeout.
            arguments={"x-consumer-timeout": cfg.consumer_timeout_ms()})

    def _on_channel_close(self, _sender: Any, exc: BaseException | None) -> None:
        if not self.closing and not self.stopping.is_set():
            self.broken = f"channel closed: {exc}" if exc else "channel closed"
            self.dispatcher.refresh()

    def _on_broker_cancel(self, _frame: Any) -> None:
        if not self.closing and not self.stopping.is_set():
            self.broken = "the broker cancelled the consumer (queue deleted?)"
            self.dispatcher.refresh()

    async def _on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        self.acks.delivered(message)  # first: a batched ack may only cover deliveries known here
        self.active += 1
        self.idle.clear()
        try:
            await self.dispatcher.handle(self, message)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("event handling failed for %s; the message goes back to the queue", self.target.key)
            await asyncio.sleep(1.0)
            await self.settle(message, Final.REQUEUE)
        finally:
            self.active -= 1
            if self.active == 0:
                self.idle.set()

    async def settle(self, message: aio_pika.abc.AbstractIncomingMessage, final: Final) -> None:
        """Ack (with the others finishing now: :mod:`.acks`) or give back at once."""
        if final == Final.REQUEUE:
            self.acks.given_back(message)
            await _give_back(message)
        else:
            await self.acks.ack(message)

    async def stop(self, drain_sec: float) -> None:
        """Stop taking messages now; messages in hand finish (or go back), then the channel closes."""
        channel = self.channel
        if channel is None or channel.is_closed:
            self.stopping.set()
            return
        self.closing = True
        if self.queue is not None and self.tag is not None:
            with contextlib.suppress(*AMQP_ERRORS):
                await self.queue.cancel(self.tag, timeout=10)
        # After the cancel, so a message given back now is not redelivered to this consumer.
        self.stopping.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.idle.wait(), timeout=drain_sec)
        with contextlib.suppress(*AMQP_ERRORS):
            await channel.close()


async def _declare(connection: aio_pika.abc.AbstractConnection, channel: aio_pika.abc.AbstractChannel,
                   name: str) -> tuple[aio_pika.abc.AbstractChannel, aio_pika.abc.AbstractQueue, str]:
    """Declare a durable queue; one that already exists with other settings is used as it is."""
    try:
        return channel, await channel.declare_queue(name, durable=True, timeout=30), ""
    except aio_pika.exceptions.ChannelPreconditionFailed as exc:
        channel = await connection.channel(publisher_confirms=False)  # a 406 closes the channel
        queue = await channel.declare_queue(name, passive=True, timeout=30)
        return channel, queue, f"{name} exists with other settings ({exc}); used as it is"


async def _give_back(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    """Nack with requeue; on a closed channel the broker redelivers and the store settles it then."""
    try:
        await message.nack(requeue=True)
    except (*AMQP_ERRORS, aio_pika.exceptions.MessageProcessError) as exc:
        log.debug("could not settle a delivery (%s): the broker will redeliver it", exc)


def _delivery(message: aio_pika.abc.AbstractIncomingMessage) -> Delivery:
    return Delivery(
        body=message.body, content_type=message.content_type, content_encoding=message.content_encoding,
        headers=dict(message.headers or {}), message_id=message.message_id,
        correlation_id=message.correlation_id, type=message.type, app_id=message.app_id,
        timestamp=message.timestamp, exchange=message.exchange or "", routing_key=message.routing_key or "",
        redelivered=bool(message.redelivered))


class Dispatcher:
    """Consumes every event trigger's queue and calls its function; see the module docstring."""

    def __init__(self, config: EventsConfig, list_targets: ListTargets, invoke: Invoke, store: DedupStore,
                 report: Report | None = None, max_body_bytes: int = 6 * 1024 * 1024,
                 owner: str | None = None) -> None:
        self.config = config
        self.list_targets = list_targets
        self.invoke = invoke
        self.store = store
        self.report = report
        self.max_body = max_body_bytes
        self.owner = owner or process_owner()
        self.stats: Counter[str] = Counter()
        self.connected = asyncio.Event()
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._consumers: dict[tuple[str, str], _Consumer] = {}
        self._retry_at: dict[tuple[str, str], tuple[int, float]] = {}
        self._inflight: dict[tuple[str, str], asyncio.Task[Final]] = {}
        self._publisher: aio_pika.abc.AbstractChannel | None = None
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping: set[asyncio.Task[None]] = set()

    # lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run(), name="events-connection"),
                       asyncio.create_task(self._housekeeping(), name="events-housekeeping")]

    def consuming(self) -> list[tuple[str, str]]:
        """The triggers (namespace, name) with a live consumer, for probes and diagnostics."""
        return sorted(self._consumers)

    def refresh(self) -> None:
        """Re-read the trigger list now (called on every trigger change)."""
        self._wake.set()

    async def close(self) -> None:
        """Stop consuming, let calls in flight finish (up to ``drain_sec``), then disconnect."""
        self._closing.set()
        self._wake.set()
        consumers = list(self._consumers.values())
        self._consumers.clear()
        await asyncio.gather(*(c.stop(self.config.drain_sec) for c in consumers), return_exceptions=True)
        pending = [t for t in self._inflight.values() if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.config.drain_sec)
        for task in [*self._tasks, *self._stopping, *pending]:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._stopping, *pending, return_exceptions=True)
        if self._connection is not None:
            with contextlib.suppress(*AMQP_ERRORS):
                await self._connection.close()

    # connection and reconciliation ----------------------------------------------------------------

    async def _sleep(self, seconds: float) -> bool:
        """Sleep unless closing; True when it is time to stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), timeout=seconds)
        return self._closing.is_set()

    async def _run(self) -> None:
        delay = 0.5
        while not self._closing.is_set():
            try:
                connection = await aio_pika.connect(
                    self.config.url, timeout=15, client_properties={"connection_name": f"sless-events {self.owner}"})
            except (*AMQP_ERRORS, aio_pika.exceptions.AMQPConnectionError) as exc:
                log.warning("RabbitMQ unreachable (%s); retrying in %.1fs", exc, delay)
                if await self._sleep(_jitter(delay)):
                    return
                delay = min(delay * 2, self.config.reconnect_max_sec)
                continue
            delay = 0.5
            lost = asyncio.Event()
            connection.close_callbacks.add(functools.partial(_set_event, lost))
            self._connection = connection
            log.info("connected to RabbitMQ")
            try:
                self._publisher = await connection.channel(publisher_confirms=True, on_return_raises=True)
                self.connected.set()
                self.stats["connections"] += 1
                await self._serve(connection, lost)
            except AMQP_ERRORS as exc:
                log.warning("RabbitMQ connection failed: %s", exc)
            finally:
                self.connected.clear()
                self._publisher = None
                for consumer in self._consumers.values():
                    consumer.stopping.set()  # their channels are gone; messages in hand will be redelivered
                self._consumers.clear()
                if not self._closing.is_set():
                    with contextlib.suppress(*AMQP_ERRORS):
                        await connection.close()
            if not lost.is_set() and self._closing.is_set():
                return
            log.warning("lost the RabbitMQ connection; reconnecting")
            if await self._sleep(_jitter(delay)):
                return

    async def _serve(self, connection: aio_pika.abc.AbstractConnection, lost: asyncio.Event) -> None:
        while not self._closing.is_set() and not lost.is_set():
            self._wake.clear()
            try:
                targets = await self.list_targets()
            except Exception:
                log.exception("could not list event triggers; keeping the current consumers")
            else:
                await self._reconcile(connection, targets)
            waiters = [asyncio.ensure_future(e.wait()) for e in (self._wake, lost, self._closing)]
            try:
                await asyncio.wait(waiters, timeout=self._next_wait(), return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()

    def _next_wait(self) -> float:
        now = time.monotonic()
        retries = [at - now for _, at in self._retry_at.values()]
        return max(0.05, min([self.config.resync_sec, *retries]))

    async def _reconcile(self, connection: aio_pika.abc.AbstractConnection, targets: list[EventTarget]) -> None:
        desired = {t.key: t for t in targets}
        for key, consumer in list(self._consumers.items()):
            target = desired.get(key)
            if target is None or consumer.broken or not consumer.target.same_consumer(target):
                why = consumer.broken or ("changed" if target else "removed or disabled")
                log.info("stopping the consumer of %s/%s (%s)", *key, why)
                del self._consumers[key]
                self._stop_in_background(consumer)
                if target is None:  # a deleted trigger ignores the report; a disabled one shows it
                    await self._report(consumer.target, f"not consuming {consumer.target.broker_queue}: the "
                                                        "trigger is disabled; messages wait in the queue")
                if consumer.broken and target is not None:
                    self._note_failure(key)
            else:
                consumer.target = target
        for key in list(self._retry_at):
            if key not in desired:
                del self._retry_at[key]
        for key, target in desired.items():
            if key in self._consumers or self._retry_at.get(key, (0, 0.0))[1] > time.monotonic():
                continue
            consumer = _Consumer(self, target)
            try:
                await consumer.start(connection)
            except AMQP_ERRORS as exc:
                log.warning("cannot consume %s for %s/%s: %s", target.broker_queue, *key, exc)
                self._note_failure(key)
                await self._report(target, f"not consuming {target.broker_queue}: {exc}"[:500])
                if consumer.channel is not None:
                    with contextlib.suppress(*AMQP_ERRORS):
                        await consumer.channel.close()
                continue
            self._consumers[key] = consumer
            self._retry_at.pop(key, None)
            log.info("consuming %s for %s/%s", target.broker_queue, *key)
            note = f" ({consumer.queue_note})" if consumer.queue_note else ""
            await self._report(target, f"consuming {target.broker_queue}; dead letters go to {target.dlq}{note}")

    def _note_failure(self, key: tuple[str, str]) -> None:
        count = self._retry_at.get(key, (0, 0.0))[0] + 1
        delay = min(self.config.reconnect_max_sec, 0.5 * 2 ** (count - 1))
        self._retry_at[key] = (count, time.monotonic() + _jitter(delay))

    def _stop_in_background(self, consumer: _Consumer) -> None:
        task = asyncio.create_task(consumer.stop(self.config.drain_sec))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def _report(self, target: EventTarget, message: str, active: bool = False) -> None:
        if self.report is None:
            return
        try:
            await self.report(target, message, active)
        except Exception:
            log.exception("could not record the state of trigger %s/%s", *target.key)

    async def _housekeeping(self) -> None:
        """Purge the store past the retention window; publish per-trigger counts into the trigger's message."""
        last_purge = 0.0
        while not await self._sleep(REPORT_EVERY_SEC):
            if time.monotonic() - last_purge > PURGE_EVERY_SEC:
                last_purge = time.monotonic()
                try:
                    purged = await self.store.purge(time.time() - self.config.dedup_window_sec)
                    if purged:
                        log.info("forgot %d delivery records older than the retention window", purged)
                except Exception:
                    log.exception("purging delivery records failed")
            for consumer in list(self._consumers.values()):
                await self._measure_queues(consumer)
                if consumer.stats != consumer.reported:
                    consumer.reported = consumer.stats.copy()
                    s = consumer.stats
                    await self._report(consumer.target, (
                        f"consuming {consumer.target.broker_queue}: {s['done']} done, {s['retried']} retried, "
                        f"{s['dead']} dead-lettered, {s['duplicate']} duplicates skipped (since start)"), active=True)

    async def _measure_queues(self, consumer: _Consumer) -> None:
        """Messages waiting in a trigger's queue and its dead-letter queue (a passive declare reads the count)."""
        channel, target = consumer.channel, consumer.target
        if channel is None or channel.is_closed:
            return
        for kind, name in (("queue", target.broker_queue), ("dlq", target.dlq)):
            with contextlib.suppress(*AMQP_ERRORS, aio_pika.exceptions.ChannelClosed):
                queue = await channel.declare_queue(name, passive=True, timeout=10)
                count = queue.declaration_result.message_count
                metrics.EVENT_QUEUE_MESSAGES.labels(target.namespace, target.trigger, kind).set(count or 0)

    def _count(self, consumer: _Consumer, outcome: str) -> None:
        consumer.stats[outcome] += 1
        self.stats[outcome] += 1
        metrics.EVENT_MESSAGES.labels(consumer.target.namespace, consumer.target.trigger, outcome).inc()

    # one message -----------------------------------------------------------------------------------

    async def handle(self, consumer: _Consumer, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        """Settle one delivery. The work runs in a task of its own, so a channel that closes under the
        delivery (and cancels its callback) never cuts a call short; its redelivery joins that task."""
        target = consumer.target
        if consumer.stopping.is_set() or self._closing.is_set():
            await consumer.settle(message, Final.REQUEUE)  # delivered just before the cancel took effect
            return
        delivery = _delivery(message)
        self.stats["delivered"] += 1
        metrics.EVENT_MESSAGES.labels(target.namespace, target.trigger, "delivered").inc()
        work: Callable[[], Awaitable[Final]]
        try:
            mapped = map_delivery(delivery, target.trigger, target.broker_queue, self.max_body)
            body = encode_event(mapped.event, self.max_body)
        except Malformed as exc:
            key = message_key(delivery)
            work = functools.partial(self._dead_letter, consumer, delivery, key, "malformed", str(exc), 0, None)
        else:
            key = mapped.key
            work = functools.partial(self._process, consumer, delivery, key, body)
        if key is None:
            final = await asyncio.shield(asyncio.ensure_future(work()))
        else:
            slot = (target.broker_queue, key)
            task = self._inflight.get(slot)
            joined = task is not None
            if task is None:
                task = asyncio.create_task(work())
                self._inflight[slot] = task
                task.add_done_callback(lambda t: self._inflight.pop(slot) if self._inflight.get(slot) is t else None)
            final = await asyncio.shield(task)
            if joined:  # a second delivery of a message being handled: settled by the first one's outcome
                self._count(consumer, "duplicate")
        await consumer.settle(message, final)

    async def _process(self, consumer: _Consumer, delivery: Delivery, key: str | None, body: bytes) -> Final:
        target = consumer.target
        attempts, last_reason, last_status = 0, "", None
        seen = time.time()  # when the platform first took the message: this delivery, or the store's first one
        if key is not None:
            claim = await self._claim(consumer, delivery, key)
            if isinstance(claim, Final):
                return claim
            seen = claim.first_seen or seen
            if claim.state == State.DLQ:  # a crash came between deciding to dead-letter and doing it
                kind, _, reason = claim.reason.partition(": ")
                return await self._dead_letter(consumer, delivery, key, kind or "failed", reason, claim.attempts,
                                               None, first_seen=seen)
            attempts, last_reason = claim.attempts, claim.reason
        while True:
            if attempts > self.config.max_retries:
                return await self._dead_letter(consumer, delivery, key, "failed", last_reason, attempts, last_status,
                                               first_seen=seen)
            if consumer.stopping.is_set() or self._closing.is_set():
                if key is not None:
                    await self.store.record(target.broker_queue, key, State.FAILED, attempts, last_reason)
                return Final.REQUEUE
            attempts += 1
            result = await self._call(target, body, attempts)
            verdict = judge(result)
            if verdict == Verdict.OK:
                if key is not None:
                    await self.store.record(target.broker_queue, key, State.DONE, attempts)
                self._count(consumer, "done")
                return Final.DONE
            last_status = result.status
            last_reason = f"HTTP {result.status}: {result.error or 'no detail'}"[:REASON_MAX]
            if verdict == Verdict.REJECT:
                return await self._dead_letter(consumer, delivery, key, "rejected", last_reason, attempts, last_status,
                                               first_seen=seen)
            if attempts > self.config.max_retries:
                return await self._dead_letter(consumer, delivery, key, "failed", last_reason, attempts, last_status,
                                               first_seen=seen)
            if key is not None:
                await self.store.record(target.broker_queue, key, State.FAILED, attempts, last_reason)
            self._count(consumer, "retried")
            log.info("%s/%s: attempt %d failed (%s); retrying", *target.key, attempts, last_reason[:200])
            if await self._wait_or_stop(consumer, _jitter(self.config.backoff(attempts))):
                return Final.REQUEUE
            if key is not None:
                claim = await self._claim(consumer, delivery, key)
                if isinstance(claim, Final):
                    return claim

    async def _wait_or_stop(self, consumer: _Consumer, seconds: float) -> bool:
        """Sleep; True (give the message back) as soon as the consumer or the dispatcher stops."""
        if consumer.stopping.is_set() or self._closing.is_set():
            return True
        waiters = [asyncio.ensure_future(e.wait()) for e in (consumer.stopping, self._closing)]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        return consumer.stopping.is_set() or self._closing.is_set()

    async def _call(self, target: EventTarget, body: bytes, attempt: int) -> CallResult:
        try:
            return await self.invoke(target, body, attempt)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("calling %s/%s failed", target.namespace, target.function)
            return CallResult(500, f"the dispatcher could not call the function: {type(exc).__name__}: {exc}",
                              platform_error=True)

    async def _claim(self, consumer: _Consumer, delivery: Delivery, key: str) -> Claim | Final:
        """Take the message for a call, or learn that it was settled before (see :mod:`.dedup`)."""
        target = consumer.target
        while True:
            lease = time.time() + target.timeout_sec + LEASE_SLACK_SEC
            claim = await self.store.claim(target.broker_queue, key, self.owner, lease)
            if claim.granted or claim.state == State.DLQ:
                return claim
            if claim.state in (State.DONE, State.DEAD):
                self._count(consumer, "duplicate")
                return Final.DONE if claim.state == State.DONE else Final.DEAD
            # RUNNING under another claim: a crashed process (or a stuck one, once its lease is over).
            if claim.owner == self.owner or owner_gone(claim.owner) or time.time() > claim.lease_until:
                self.stats["interrupted"] += 1
                if target.at_least_once:  # the interrupted call counts as an attempt; the next claim calls again
                    await self.store.record(target.broker_queue, key, State.FAILED, claim.attempts + 1,
                                            f"interrupted: its dispatcher ({claim.owner}) stopped during the call")
                    continue
                reason = (f"a call was in flight when its dispatcher ({claim.owner}) stopped; the outcome is "
                          "unknown, so the event is not run again")
                return await self._dead_letter(consumer, delivery, key, "interrupted", reason, claim.attempts, None,
                                               first_seen=claim.first_seen)
            if await self._wait_or_stop(consumer, CLAIM_POLL_SEC):
                return Final.REQUEUE

    async def _dead_letter(self, consumer: _Consumer, delivery: Delivery, key: str | None, kind: str, reason: str,
                           attempts: int, status: int | None, first_seen: float | None = None) -> Final:
        """Publish to ``<queue>.dlq`` (confirmed) with why, then record ``dead``. A crash in between
        leaves ``dlq`` in the store, so the redelivery finishes the job instead of calling again."""
        target = consumer.target
        if key is not None:
            await self.store.record(target.broker_queue, key, State.DLQ, attempts, f"{kind}: {reason}")
        headers = {**delivery.headers,
                   "x-sless-reason": reason[:REASON_MAX], "x-sless-kind": kind, "x-sless-attempts": attempts,
                   "x-sless-trigger": f"{target.namespace}/{target.trigger}", "x-sless-function": target.function,
                   "x-sless-queue": target.broker_queue, DEAD_ID_HEADER: uuid.uuid4().hex,
                   "x-sless-first-seen": _iso(first_seen if first_seen is not None else time.time()),
                   "x-sless-failed-at": _iso(time.time())}
        if status is not None:
            headers["x-sless-status"] = status
        message = aio_pika.Message(
            body=delivery.body, headers=headers, content_type=delivery.content_type,
            content_encoding=delivery.content_encoding, message_id=delivery.message_id,
            correlation_id=delivery.correlation_id, type=delivery.type, app_id=delivery.app_id,
            timestamp=delivery.timestamp, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        if not await self._publish(target.dlq, message):
            return Final.REQUEUE
        if key is not None:
            await self.store.record(target.broker_queue, key, State.DEAD, attempts, f"{kind}: {reason}")
        self._count(consumer, "dead")
        self.stats[f"dead_{kind}"] += 1
        metrics.EVENT_DEAD_LETTERS.labels(target.namespace, target.trigger, kind).inc()
        log.warning("%s/%s: message %s dead-lettered to %s (%s: %s)", *target.key, delivery.message_id or "-",
                    target.dlq, kind, reason[:200])
        return Final.DEAD

    async def _publish(self, queue: str, message: aio_pika.Message) -> bool:
        """Publish with a broker confirm, across reconnects; False only when shutting down."""
        delay = 0.5
        while not self._closing.is_set():
            channel = self._publisher
            if channel is None or channel.is_closed:
                if self._connection is not None and not self._connection.is_closed and self.connected.is_set():
                    with contextlib.suppress(*AMQP_ERRORS):
                        self._publisher = await self._connection.channel(publisher_confirms=True,
                                                                         on_return_raises=True)
                        continue
                if await self._sleep(_jitter(delay)):
                    return False
                delay = min(delay * 2, self.config.reconnect_max_sec)
                continue
            try:
                await channel.default_exchange.publish(message, routing_key=queue, mandatory=True, timeout=30)
                return True
            except aio_pika.exceptions.DeliveryError:
                # Unroutable: the dead-letter queue was deleted behind our back. Declare it again.
                with contextlib.suppress(*AMQP_ERRORS):
                    await channel.declare_queue(queue, durable=True, timeout=30)
            except AMQP_ERRORS as exc:
                log.warning("publishing to %s failed (%s); retrying", queue, exc)
                if await self._sleep(_jitter(delay)):
                    return False
                delay = min(delay * 2, self.config.reconnect_max_sec)
        return False
