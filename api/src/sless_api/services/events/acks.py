"""Acknowledgements in batches: one ``basic.ack`` with ``multiple`` for the messages of a channel that finished
in the same turn of the event loop, instead of a frame (and a socket write) each.

A multiple ack settles every unacknowledged delivery of the channel up to its tag, so it may only be sent for a
run of deliveries that are all settled: the channel's deliveries are tracked in order, and the ack goes up to
the last one of the run at the front that finished this turn (a tag the broker still holds open: a tag it no
longer knows would close the channel). A message that finishes while an earlier one is still being handled is
acked on its own at once, so one slow call never holds back the acks (and the prefetch window) of the others.
Messages given back (``nack``) are settled by the caller and only marked here.
"""

from __future__ import annotations

import asyncio
import collections
import logging

import aio_pika
import aio_pika.abc
import aio_pika.exceptions
import aiormq.exceptions

log = logging.getLogger("sless.events")
#: What a broker operation raises when the channel or connection under it has gone.
AMQP_ERRORS = (aio_pika.exceptions.AMQPError, aiormq.exceptions.AMQPError, ConnectionError, OSError,
               RuntimeError, asyncio.TimeoutError)


class AckBatcher:
    """The acks of one consumer's channel (delivery tags are per channel: a new channel gets a new batcher)."""

    def __init__(self) -> None:
        self._outstanding: collections.deque[int] = collections.deque()  # delivered, in delivery order
        self._settled: set[int] = set()  # of those, the ones acked or given back (still in the deque)
        self._done: dict[int, aio_pika.abc.AbstractIncomingMessage] = {}  # finished this turn, not yet acked
        self._flushed: asyncio.Future[None] | None = None
        self._flushing: set[asyncio.Task[None]] = set()  # held while running: the loop keeps only weak references
        self.frames = 0  # acks sent, for tests and diagnostics

    def delivered(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        """Called first thing for every delivery, in the order the channel delivers them."""
        if message.delivery_tag is not None:
            self._outstanding.append(message.delivery_tag)

    def given_back(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        """The caller settled the message otherwise (a nack it has sent)."""
        if message.delivery_tag is not None:
            self._settled.add(message.delivery_tag)

    async def ack(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        """Ack MESSAGE with the others that finish in this turn; returns once its ack is written."""
        if message.delivery_tag is None:  # not a consumed delivery (never the case with acks on): alone
            await _send(message, multiple=False)
            return
        self._done[message.delivery_tag] = message
        if self._flushed is None:
            loop = asyncio.get_running_loop()
            self._flushed = loop.create_future()
            loop.call_soon(self._start_flush)
        await asyncio.shield(self._flushed)

    def _start_flush(self) -> None:
        task = asyncio.ensure_future(self._flush())
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def _flush(self) -> None:
        flushed, self._flushed = self._flushed, None
        done, self._done = self._done, {}
        self._settled.update(done)
        last_done: int | None = None
        while self._outstanding and self._outstanding[0] in self._settled:
            tag = self._outstanding.popleft()
            self._settled.discard(tag)
            if tag in done:
                last_done = tag
        try:
            if last_done is not None:  # the run at the front: one frame
                await _send(done.pop(last_done), multiple=True)
                self.frames += 1
                for tag in [t for t in done if t < last_done]:
                    del done[tag]  # covered by the multiple ack
            for message in done.values():  # finished behind a message still in hand: on their own
                await _send(message, multiple=False)
                self.frames += 1
        finally:
            if flushed is not None and not flushed.done():
                flushed.set_result(None)


async def _send(message: aio_pika.abc.AbstractIncomingMessage, multiple: bool) -> None:
    """One ack frame; on a closed channel the broker redelivers and the store settles the message then."""
    try:
        await message.ack(multiple=multiple)
    except (*AMQP_ERRORS, aio_pika.exceptions.MessageProcessError) as exc:
        log.debug("could not ack a delivery (%s): the broker will redeliver it", exc)
