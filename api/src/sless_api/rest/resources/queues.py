"""``/v1/namespaces/{ns}/queues/{queue}/...``: publish to a tenant's queue, and its dead letters.

``POST .../messages`` publishes the request body (any content type; CloudEvents attributes optional, as
``ce-*`` headers or a structured ``application/cloudevents+json`` body) to the queue an event trigger consumes;
``GET .../dead-letters`` lists them, ``GET .../dead-letters/{id}`` shows one with its payload,
``POST .../dead-letters/redrive`` and ``.../purge`` act on ``{"ids": [...]}`` or ``{"all": true}``. Every name is
the caller's own namespace (``TenantAuth``); the broker work is ``services.events.tenantqueues``'.
"""

from __future__ import annotations

import re
from typing import Any

import aio_pika.exceptions
import aiormq.exceptions
import falcon.asgi

from sless_api.rest.http import ApiError, json_body, query_int, read_bounded
from sless_api.services.events.tenantqueues import Malformed, NoSuchDeadLetter, QueueMissing, TenantQueues
from sless_core.models import QUEUE_NAME

#: The CloudEvents binary-mode headers a publish passes on (``ce-id``, ``ce-type``, ...), nothing else.
CE_HEADER = re.compile(r"^ce-[a-z0-9]{1,20}\Z")
MESSAGE_ID = re.compile(r"^[A-Za-z0-9._:@+=-]{1,128}\Z")
DEAD_ID = re.compile(r"^[0-9a-f]{32}\Z")
MAX_IDS = 1000
BROKER_ERRORS = (aio_pika.exceptions.AMQPError, aiormq.exceptions.AMQPError, ConnectionError, OSError, TimeoutError)


def _queue(queue: str) -> str:
    if not QUEUE_NAME.match(queue) or queue.endswith(".dlq"):
        raise ApiError(400, "queue must be 1-200 of [A-Za-z0-9_.:-], not ending in .dlq (name the queue, not its "
                            "dead letters)", field="queue")
    return queue


def _broker(queues: TenantQueues | None) -> TenantQueues:
    if queues is None:
        raise ApiError(422, "event queues need a broker: this platform has no SLESS_RABBITMQ_URL")
    return queues


class _Broker:
    """What every queue resource shares: the broker, and its failures as answers."""

    def __init__(self, queues: TenantQueues | None) -> None:
        self.queues = queues

    @staticmethod
    def failed(exc: Exception) -> ApiError:
        if isinstance(exc, QueueMissing):
            return ApiError(404, str(exc))
        if isinstance(exc, NoSuchDeadLetter):
            return ApiError(404, str(exc))
        return ApiError(503, f"the broker cannot be reached now: {type(exc).__name__}")


class Messages(_Broker):
    """``POST``: publish one message; 202 with its id (the dispatcher calls the function soon after)."""

    def __init__(self, queues: TenantQueues | None, max_body_bytes: int) -> None:
        super().__init__(queues)
        self.max_body_bytes = max_body_bytes

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, queue: str) -> None:
        queues = _broker(self.queues)
        _queue(queue)
        if req.content_length is not None and req.content_length > self.max_body_bytes:
            raise ApiError(413, f"a message is at most {self.max_body_bytes} bytes", limit=self.max_body_bytes)
        body = await read_bounded(req.stream, self.max_body_bytes)
        message_id = req.get_header("X-Sless-Message-Id")
        if message_id is not None and not MESSAGE_ID.match(message_id):
            raise ApiError(400, "X-Sless-Message-Id must be 1-128 of [A-Za-z0-9._:@+=-]", field="X-Sless-Message-Id")
        headers = {name.lower(): value for name, value in req.headers.items() if CE_HEADER.match(name.lower())}
        try:
            published = await queues.publish(ns, queue, body, req.content_type, headers, message_id)
        except Malformed as exc:
            raise ApiError(400, f"the message is not a valid event: {exc}") from None
        except (QueueMissing, *BROKER_ERRORS) as exc:
            raise self.failed(exc) from None
        resp.status = 202
        resp.media = {"queue": queue, "message_id": published}


class DeadLetters(_Broker):
    """``GET``: the oldest dead letters (``?limit=``, 1-100, default 20), without their payloads."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, queue: str) -> None:
        queues = _broker(self.queues)
        limit = query_int(req, "limit", 20, 1, 100)
        try:
            scan = await queues.browse(ns, _queue(queue), limit)
        except (QueueMissing, *BROKER_ERRORS) as exc:
            raise self.failed(exc) from None
        resp.media = {"items": [item.summary() for item in scan.items], "more": scan.more}


class DeadLetter(_Broker):
    """``GET``: one dead letter with its headers and payload (text, or base64 for bytes that are not UTF-8)."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, queue: str,
                     ident: str) -> None:
        queues = _broker(self.queues)
        if not DEAD_ID.match(ident):
            raise ApiError(400, "a dead letter's id is 32 lowercase hex digits", field="id")
        try:
            letter = await queues.get(ns, _queue(queue), ident)
        except (QueueMissing, NoSuchDeadLetter, *BROKER_ERRORS) as exc:
            raise self.failed(exc) from None
        resp.media = letter.view()


def _selection(doc: Any) -> list[str] | None:
    """``{"ids": [...]}`` (those) or ``{"all": true}`` (None: every one); anything else is a 400."""
    if not isinstance(doc, dict):
        raise ApiError(400, 'send {"ids": [...]} or {"all": true}')
    unknown = set(doc) - {"ids", "all", "to_queue"}
    if unknown:
        raise ApiError(400, f"unknown field {sorted(unknown)[0]!r}", field=sorted(unknown)[0])
    if doc.get("all") is True and "ids" not in doc:
        return None
    ids = doc.get("ids")
    if "all" in doc or not isinstance(ids, list) or not ids or len(ids) > MAX_IDS:
        raise ApiError(400, f'send {{"ids": [...]}} (1-{MAX_IDS} ids) or {{"all": true}}, not both', field="ids")
    for ident in ids:
        if not isinstance(ident, str) or not DEAD_ID.match(ident):
            raise ApiError(400, "a dead letter's id is 32 lowercase hex digits", field="ids")
    return list(ids)


class Redrive(_Broker):
    """``POST {"ids"|"all", "to_queue"?}``: publish the dead letters again (to their queue, or another of the
    tenant's) and take them out of the dead-letter queue."""

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, queue: str) -> None:
        queues = _broker(self.queues)
        doc = await json_body(req)
        ids = _selection(doc)
        to_queue = doc.get("to_queue")
        if to_queue is not None and (not isinstance(to_queue, str) or not QUEUE_NAME.match(to_queue)):
            raise ApiError(400, "to_queue must be 1-200 of [A-Za-z0-9_.:-]", field="to_queue")
        try:
            scan = await queues.redrive(ns, _queue(queue), ids, to_queue and _queue(to_queue))
        except (QueueMissing, *BROKER_ERRORS) as exc:
            raise self.failed(exc) from None
        resp.media = {"redriven": scan.touched, "more": scan.more}


class Purge(_Broker):
    """``POST {"ids"|"all"}``: drop dead letters for good."""

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, ns: str, queue: str) -> None:
        queues = _broker(self.queues)
        doc = await json_body(req)
        if isinstance(doc, dict) and "to_queue" in doc:
            raise ApiError(400, "unknown field 'to_queue'", field="to_queue")
        ids = _selection(doc)
        try:
            scan = await queues.purge(ns, _queue(queue), ids)
        except (QueueMissing, *BROKER_ERRORS) as exc:
            raise self.failed(exc) from None
        resp.media = {"purged": scan.touched, "more": scan.more}
