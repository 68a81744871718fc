"""Batched acknowledgements on a real broker: the messages finishing together are acked in fewer frames than
messages, nothing is acked that was not handled (a message still in hand is redelivered when the channel goes),
and a slow message does not hold back the acks of the ones behind it."""

from __future__ import annotations

import asyncio
import uuid

import aio_pika
import aio_pika.abc

from sless_api.services.events.acks import AckBatcher
from tests.support.poll import until
from tests.support.rabbitmq import RabbitBroker, publish, queue_counts

POLL = 0.05


def _queue(broker: RabbitBroker, prefix: str, count: int) -> str:
    """A new durable queue holding messages 0..count-1."""
    queue = f"{prefix}-{uuid.uuid4().hex[:8]}"
    conn = broker.connection()
    try:
        conn.channel().queue_declare(queue, durable=True)
    finally:
        conn.close()
    publish(broker, queue, [str(i).encode() for i in range(count)])
    return queue


async def _consume(url: str, queue: str, count: int, prefetch: int, hold: set[int]
                   ) -> tuple[AckBatcher, list[int]]:
    """Consume COUNT messages (bodies 0..count-1) with batched acks, holding those in HOLD unacked; then close
    the connection while they are held. Returns the batcher and the bodies acked."""
    acks = AckBatcher()
    acked: list[int] = []
    finished = asyncio.Event()
    held: list[asyncio.Future[None]] = []
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=prefetch)
        q = await channel.declare_queue(queue, durable=True)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            acks.delivered(message)
            number = int(message.body)
            if number in hold:
                waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                held.append(waiter)
                await waiter  # never set: the connection closes under it
                return
            await acks.ack(message)
            acked.append(number)
            if len(acked) == count - len(hold):
                finished.set()

        await q.consume(on_message)
        await asyncio.wait_for(finished.wait(), timeout=60)
    finally:
        await connection.close()
    return acks, acked


def test_a_burst_is_acked_in_fewer_frames_and_nothing_is_lost(rabbitmq_broker: RabbitBroker) -> None:
    queue = _queue(rabbitmq_broker, "acks-burst", 300)
    acks, acked = asyncio.run(_consume(rabbitmq_broker.url, queue, 300, 64, set()))
    assert sorted(acked) == list(range(300))
    assert acks.frames < 300, acks.frames  # several messages per frame
    until("the queue to be empty after the channel closed", lambda: queue_counts(rabbitmq_broker, queue)[0] == 0,
          10, POLL)


def test_a_message_in_hand_is_not_covered_by_the_acks_behind_it(rabbitmq_broker: RabbitBroker) -> None:
    """Message 0 is held while 1..39 finish: they are acked (on their own, the front of the channel being open),
    and when the connection goes message 0 alone comes back."""
    queue = _queue(rabbitmq_broker, "acks-slow", 40)
    _, acked = asyncio.run(_consume(rabbitmq_broker.url, queue, 40, 16, {0}))
    assert sorted(acked) == list(range(1, 40))
    until("message 0 back in the queue", lambda: queue_counts(rabbitmq_broker, queue)[0] == 1, 10, POLL)
