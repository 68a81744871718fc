"""A tenant's queues as the REST API offers them: publish a message, and browse, redrive and purge dead letters.

Every name is the tenant's own: the API passes the namespace of the verified caller and the short queue name,
and only ``<namespace>.<queue>`` and its ``.dlq`` are ever touched (the same prefix that keeps tenants apart for
the dispatcher, ``model.broker_queue``).

Dead letters are read from the broker, the one place they are kept: AMQP has no "peek", so a browse takes
messages off the dead-letter queue without acknowledging them and gives them back, in their order, when its
channel closes (RabbitMQ requeues unacknowledged messages at their original positions). A redrive publishes a
copy to the live queue with a broker confirm before it acknowledges the dead letter, so a crash between the two
leaves a duplicate, never a loss; the copy's ``message_id`` is derived from the dead letter's own id, so the
dispatcher's deduplication still runs it once (and the original id stays in ``x-sless-original-message-id``).
One browse, redrive or purge scans at most ``SCAN_MAX`` messages or ``SCAN_MAX_BYTES`` bytes; the answer says
when there were more.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aio_pika
import aio_pika.abc
import aio_pika.exceptions

from sless_api.services.events.message import Delivery, Malformed, jsonable, map_delivery
from sless_api.services.events.model import DEAD_ID_HEADER, broker_queue, dead_letter_queue

ORIGINAL_ID_HEADER = "x-sless-original-message-id"
#: What the platform adds to a dead letter; a redrive leaves these out of the copy.
PLATFORM_HEADER_PREFIX = "x-sless-"
SCAN_MAX = 10_000
SCAN_MAX_BYTES = 64 * 1024 * 1024
BROKER_TIMEOUT_SEC = 30.0


class QueueMissing(LookupError):
    """The queue (or its dead-letter queue) does not exist on the broker."""


class NoSuchDeadLetter(LookupError):
    pass


def dead_id(message: aio_pika.abc.AbstractIncomingMessage) -> str:
    """A dead letter's id: the dispatcher's header; for one dead-lettered before it had that header, a digest of
    what identifies it (stable across browses)."""
    given = (message.headers or {}).get(DEAD_ID_HEADER)
    if isinstance(given, (str, bytes)) and given:
        return given.decode() if isinstance(given, bytes) else given
    digest = hashlib.sha256(message.body)
    for part in (message.message_id, (message.headers or {}).get("x-sless-failed-at")):
        digest.update(b"\0" + str(part).encode())
    return digest.hexdigest()[:32]


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter as the API shows it."""

    id: str
    message_id: str | None
    kind: str
    reason: str
    attempts: int
    status: int | None
    function: str
    trigger: str
    published_at: str | None  # the message's timestamp: when it was first published (when the publisher says)
    first_seen_at: str | None  # when the platform first took it (its first delivery to the trigger)
    failed_at: str | None  # when it was dead-lettered: the last time it was seen
    redelivered: bool
    content_type: str | None
    headers: dict[str, Any]
    body: str
    body_encoding: str  # utf-8 or base64
    size: int

    def summary(self) -> dict[str, Any]:
        """The listing's fields (no body)."""
        whole = self.view()
        return {k: v for k, v in whole.items() if k not in ("body", "body_encoding", "headers")}

    def view(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def describe(message: aio_pika.abc.AbstractIncomingMessage) -> DeadLetter:
    headers = dict(message.headers or {})
    status = headers.get("x-sless-status")
    try:
        body, encoding = message.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(message.body).decode(), "base64"
    attempts = headers.get("x-sless-attempts", 0)
    return DeadLetter(
        id=dead_id(message), message_id=message.message_id, kind=_text(headers.get("x-sless-kind", "")),
        reason=_text(headers.get("x-sless-reason", "")), attempts=int(attempts) if isinstance(attempts, int) else 0,
        status=int(status) if isinstance(status, int) else None,
        function=_text(headers.get("x-sless-function", "")), trigger=_text(headers.get("x-sless-trigger", "")),
        published_at=message.timestamp.isoformat() if isinstance(message.timestamp, datetime) else None,
        first_seen_at=_text(headers["x-sless-first-seen"]) if "x-sless-first-seen" in headers else None,
        failed_at=_text(headers["x-sless-failed-at"]) if "x-sless-failed-at" in headers else None,
        redelivered=bool(message.redelivered), content_type=message.content_type,
        headers={k: jsonable(v) for k, v in headers.items() if not k.startswith(PLATFORM_HEADER_PREFIX)},
        body=body, body_encoding=encoding, size=len(message.body))


@dataclass(frozen=True)
class Scan:
    """What one pass over a dead-letter queue did."""

    items: list[DeadLetter]
    touched: int  # redriven or purged
    more: bool  # the scan stopped at its bound with messages left unseen


class TenantQueues:
    """The broker operations of the REST API; one connection per process, opened at the first use."""

    def __init__(self, rabbitmq_url: str, max_body_bytes: int) -> None:
        self.url = rabbitmq_url
        self.max_body_bytes = max_body_bytes
        self._connection: aio_pika.abc.AbstractRobustConnection | None = None
        self._opening = asyncio.Lock()
        # one scan of a dead-letter queue at a time in this process: two would each see half of it
        self._scans: dict[str, asyncio.Lock] = {}

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None

    async def _channel(self) -> aio_pika.abc.AbstractChannel:
        async with self._opening:
            if self._connection is None or self._connection.is_closed:
                self._connection = await aio_pika.connect_robust(self.url, timeout=BROKER_TIMEOUT_SEC)
        return await self._connection.channel(publisher_confirms=True, on_return_raises=True)

    # -- publish ---------------------------------------------------------------------------------------

    async def publish(self, namespace: str, queue: str, body: bytes, content_type: str | None,
                      headers: dict[str, str], message_id: str | None) -> str:
        """Publish BODY to the tenant's queue (persistent, confirmed); the message's id. Raises Malformed for a
        message the dispatcher would dead-letter as malformed, QueueMissing when no queue has that name."""
        name = broker_queue(namespace, queue)
        message_id = message_id or uuid.uuid4().hex
        delivery = Delivery(body=body, content_type=content_type, headers=dict(headers), message_id=message_id,
                            routing_key=name)
        map_delivery(delivery, "-", name, self.max_body_bytes)  # what the dispatcher will do, checked first
        message = aio_pika.Message(body=body, content_type=content_type, headers=dict(headers),
                                   message_id=message_id, timestamp=datetime.now().astimezone(),
                                   delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        channel = await self._channel()
        try:
            await channel.default_exchange.publish(message, routing_key=name, mandatory=True,
                                                   timeout=BROKER_TIMEOUT_SEC)
        except aio_pika.exceptions.DeliveryError as exc:  # unroutable: nothing declared that queue
            raise QueueMissing(f"no queue {queue!r}: an event trigger declares it when it is created") from exc
        finally:
            with contextlib.suppress(Exception):
                await channel.close()
        return message_id

    # -- dead letters ----------------------------------------------------------------------------------

    async def browse(self, namespace: str, queue: str, limit: int) -> Scan:
        """Up to LIMIT dead letters, oldest first, all of them left in place."""
        return await self._scan(namespace, queue, None, lambda _m: False, limit)

    async def get(self, namespace: str, queue: str, ident: str) -> DeadLetter:
        scan = await self._scan(namespace, queue, None, lambda _m: False, SCAN_MAX, only=ident)
        if not scan.items:
            raise NoSuchDeadLetter(f"no dead letter {ident!r} in {queue!r}")
        return scan.items[0]

    async def redrive(self, namespace: str, queue: str, ids: Iterable[str] | None, to_queue: str | None) -> Scan:
        """Publish the chosen dead letters (IDS; None: all) again to their queue, or TO_QUEUE of the same tenant,
        each confirmed before its dead letter is acknowledged."""
        target = broker_queue(namespace, to_queue or queue)
        chosen = None if ids is None else set(ids)

        async def resend(channel: aio_pika.abc.AbstractChannel, message: aio_pika.abc.AbstractIncomingMessage) -> None:
            await channel.default_exchange.publish(redrive_copy(message), routing_key=target, mandatory=True,
                                                   timeout=BROKER_TIMEOUT_SEC)

        await self._require(target, to_queue or queue)
        return await self._scan(namespace, queue, resend, lambda m: chosen is None or dead_id(m) in chosen, 0)

    async def purge(self, namespace: str, queue: str, ids: Iterable[str] | None) -> Scan:
        """Drop the chosen dead letters (IDS; None: all)."""
        chosen = None if ids is None else set(ids)

        async def drop(_channel: aio_pika.abc.AbstractChannel, _message: aio_pika.abc.AbstractIncomingMessage) -> None:
            return None

        return await self._scan(namespace, queue, drop, lambda m: chosen is None or dead_id(m) in chosen, 0)

    async def _require(self, name: str, shown: str) -> None:
        channel = await self._channel()
        try:
            await channel.declare_queue(name, passive=True, timeout=BROKER_TIMEOUT_SEC)
        except aio_pika.exceptions.ChannelClosed as exc:  # 404 NOT_FOUND closes the channel
            raise QueueMissing(f"no queue {shown!r}") from exc
        finally:
            with contextlib.suppress(Exception):
                await channel.close()

    async def _scan(self, namespace: str, queue: str,
                    act: Callable[[aio_pika.abc.AbstractChannel, aio_pika.abc.AbstractIncomingMessage],
                                  Awaitable[None]] | None,
                    chosen: Callable[[aio_pika.abc.AbstractIncomingMessage], bool], keep: int,
                    only: str | None = None) -> Scan:
        """One pass over the dead-letter queue: ACT on (then acknowledge) each CHOSEN message, keep the first KEEP
        others (or the one with id ONLY) as items; everything not acted on goes back as the channel closes."""
        name = dead_letter_queue(broker_queue(namespace, queue))
        lock = self._scans.setdefault(name, asyncio.Lock())
        items: list[DeadLetter] = []
        touched = seen = size = 0
        more = False
        async with lock:
            channel = await self._channel()
            try:
                try:
                    dlq = await channel.declare_queue(name, passive=True, timeout=BROKER_TIMEOUT_SEC)
                except aio_pika.exceptions.ChannelClosed as exc:
                    raise QueueMissing(f"no dead letters of {queue!r}: no event trigger has consumed it") from exc
                while True:
                    if seen >= SCAN_MAX or size >= SCAN_MAX_BYTES:
                        more = await dlq.get(no_ack=False, fail=False, timeout=BROKER_TIMEOUT_SEC) is not None
                        break
                    message = await dlq.get(no_ack=False, fail=False, timeout=BROKER_TIMEOUT_SEC)
                    if message is None:
                        break
                    seen, size = seen + 1, size + len(message.body)
                    if act is not None and chosen(message):
                        await act(channel, message)
                        await message.ack()
                        touched += 1
                    elif only is not None:
                        if dead_id(message) == only:
                            items.append(describe(message))
                            break
                    elif len(items) < keep:
                        items.append(describe(message))
                    elif act is None:
                        more = True
                        break
            finally:
                with contextlib.suppress(Exception):
                    await channel.close()  # every message not acknowledged goes back, in order
        return Scan(items, touched, more)


def redrive_copy(message: aio_pika.abc.AbstractIncomingMessage) -> aio_pika.Message:
    """The message as first published, with a message id of its own derived from the dead letter's (so the
    dispatcher's deduplication neither skips it as the original nor runs two redrives of it twice)."""
    headers = {k: v for k, v in (message.headers or {}).items() if not k.startswith(PLATFORM_HEADER_PREFIX)}
    if message.message_id:
        headers[ORIGINAL_ID_HEADER] = message.message_id
    return aio_pika.Message(
        body=message.body, headers=headers, content_type=message.content_type,
        content_encoding=message.content_encoding, message_id=f"redrive-{dead_id(message)}",
        correlation_id=message.correlation_id, type=message.type, app_id=message.app_id,
        timestamp=message.timestamp, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)


__all__ = ["DEAD_ID_HEADER", "DeadLetter", "Malformed", "NoSuchDeadLetter", "QueueMissing", "Scan", "TenantQueues"]
