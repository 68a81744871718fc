"""A broker message becomes the function's event: a CloudEvents 1.0 attribute set with its data.

Three input shapes are accepted, and all give the function the same event shape:

- structured mode: ``content_type: application/cloudevents+json``, the body is the whole event;
- binary mode: attributes in headers (``ce-id``, ``ce-source``, ... as the ask says; the AMQP
  binding's ``cloudEvents:``/``cloudEvents_`` prefixes too), the body is the data;
- a plain message: a JSON body is the data; id, source, type and time come from the message's
  properties (``message_id``, the queue, ``type``, ``timestamp``).

The event is ``{"specversion": "1.0", "id", "source", "type", ... , "data": ...}`` plus ``_trigger``,
``_queue`` and ``_amqp`` (message id, headers, redelivered flag). Anything that cannot become an event
raises :class:`Malformed`: such a message goes straight to the dead-letter queue.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"
REQUIRED = ("id", "source", "specversion", "type")
SPECVERSION = "1.0"
DEFAULT_TYPE = "dev.sless.queue.message"
_BINARY_PREFIXES = ("ce-", "ce_", "cloudevents:", "cloudevents_")
_ATTRIBUTE = re.compile(r"^[a-z0-9]{1,64}\Z")
_PLAIN_ENCODINGS = ("", "identity", "utf-8", "utf8")
#: Keys the dispatcher adds; an event attribute may not take them.
RESERVED = ("_trigger", "_queue", "_amqp")


class Malformed(ValueError):
    """The message cannot be turned into an event; the text says why (it goes into the DLQ headers)."""


@dataclass(frozen=True)
class Delivery:
    """The parts of a delivered AMQP message the mapping reads (kept free of the client library)."""

    body: bytes
    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    message_id: str | None = None
    correlation_id: str | None = None
    type: str | None = None
    app_id: str | None = None
    timestamp: datetime | None = None
    exchange: str = ""
    routing_key: str = ""
    redelivered: bool = False


@dataclass(frozen=True)
class Mapped:
    event: dict[str, Any]
    #: The idempotency key: the message_id, else the CloudEvent's source and id; None = no dedup possible.
    key: str | None
    mode: str  # structured | binary | plain


def message_key(delivery: Delivery) -> str | None:
    """The key usable before mapping (for messages that fail to map): the message_id alone."""
    return f"mid:{delivery.message_id}" if delivery.message_id else None


def jsonable(value: Any) -> Any:
    """AMQP field values (bytes, Decimal, datetime, nested tables) as JSON values."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime):
        return _rfc3339(value)
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _rfc3339(value: datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _is_json(media: str) -> bool:
    return media in ("", "application/json", "text/json") or media.endswith("+json")


def _attribute_value(name: str, value: Any) -> str:
    value = jsonable(value)
    if isinstance(value, dict | list) or value is None:
        raise Malformed(f"CloudEvents attribute {name!r} must be a string, got {type(value).__name__}")
    return value if isinstance(value, str) else json.dumps(value)


def _check_attributes(attrs: dict[str, Any], mode: str) -> None:
    missing = [a for a in REQUIRED if not attrs.get(a)]
    if missing:
        raise Malformed(f"{mode} CloudEvent without {', '.join(missing)}")
    if attrs["specversion"] != SPECVERSION:
        raise Malformed(f"CloudEvents specversion {attrs['specversion']!r} is not supported (only {SPECVERSION})")
    for name, value in attrs.items():
        if name in ("data", "data_base64"):
            continue
        if not _ATTRIBUTE.match(name):
            raise Malformed(f"CloudEvents attribute name {name!r} is not lower-case alphanumeric")
        if not isinstance(value, str | int | bool):
            raise Malformed(f"CloudEvents attribute {name!r} must be a string, number or boolean")


def _decode_data(delivery: Delivery, media: str) -> dict[str, Any]:
    """The body as ``data`` (JSON value or text) or ``data_base64`` (anything else)."""
    body = delivery.body
    if not body:
        return {}
    if _is_json(media):
        try:
            return {"data": json.loads(body)}
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise Malformed(f"the body is not JSON ({exc})") from None
    if media.startswith("text/") or media in ("application/xml", "application/x-www-form-urlencoded"):
        try:
            return {"data": body.decode("utf-8")}
        except UnicodeDecodeError:
            raise Malformed(f"the body is not UTF-8 text although its content type is {media}") from None
    return {"data_base64": base64.b64encode(body).decode("ascii")}


def _binary_attributes(headers: dict[str, Any]) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for raw_name, value in headers.items():
        lowered = raw_name.lower()
        prefix = next((p for p in _BINARY_PREFIXES if lowered.startswith(p)), None)
        if prefix is not None and len(lowered) > len(prefix):
            name = lowered[len(prefix):]
            attrs[name] = _attribute_value(name, value)
    return attrs


def _structured(delivery: Delivery) -> dict[str, Any]:
    try:
        envelope = json.loads(delivery.body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Malformed(f"structured CloudEvent is not JSON ({exc})") from None
    if not isinstance(envelope, dict):
        raise Malformed("structured CloudEvent must be a JSON object")
    if "data" in envelope and "data_base64" in envelope:
        raise Malformed("structured CloudEvent has both data and data_base64")
    if "data_base64" in envelope:
        try:
            base64.b64decode(envelope["data_base64"], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise Malformed("data_base64 is not valid base64") from None
    _check_attributes(envelope, "structured")
    return envelope


def _plain(delivery: Delivery, media: str, broker_queue: str) -> dict[str, Any]:
    event: dict[str, Any] = {
        "specversion": SPECVERSION,
        "id": delivery.message_id or str(uuid.uuid4()),
        "source": f"/sless/queues/{broker_queue}",
        "type": delivery.type or DEFAULT_TYPE,
        "datacontenttype": _media_type(delivery.content_type) or "application/json",
    }
    if delivery.timestamp is not None:
        event["time"] = _rfc3339(delivery.timestamp)
    event.update(_decode_data(delivery, media))
    return event


def map_delivery(delivery: Delivery, trigger: str, broker_queue: str, max_bytes: int) -> Mapped:
    """Turn one delivery into the event for the function, or raise :class:`Malformed`."""
    encoding = (delivery.content_encoding or "").lower()
    if encoding not in _PLAIN_ENCODINGS:
        raise Malformed(f"content_encoding {delivery.content_encoding!r} is not supported")
    if len(delivery.body) > max_bytes:
        raise Malformed(f"the message body has {len(delivery.body)} bytes; a function accepts at most {max_bytes}")
    media = _media_type(delivery.content_type)
    if media == BATCH:
        raise Malformed("CloudEvents batches are not supported: publish one event per message")
    other_headers = delivery.headers
    if media == STRUCTURED:
        event, mode = _structured(delivery), "structured"
    elif attrs := _binary_attributes(delivery.headers):
        mode = "binary"
        if delivery.content_type and "datacontenttype" not in attrs:
            attrs["datacontenttype"] = delivery.content_type
        _check_attributes(attrs, "binary")
        event = {**attrs, **_decode_data(delivery, _media_type(attrs.get("datacontenttype")))}
        other_headers = {k: v for k, v in delivery.headers.items()
                         if not k.lower().startswith(_BINARY_PREFIXES)}
    else:
        event, mode = _plain(delivery, media, broker_queue), "plain"
    for reserved in RESERVED:
        event.pop(reserved, None)
    event["_trigger"] = trigger
    event["_queue"] = broker_queue
    event["_amqp"] = {
        "message_id": delivery.message_id, "correlation_id": delivery.correlation_id,
        "app_id": delivery.app_id, "exchange": delivery.exchange, "routing_key": delivery.routing_key,
        "redelivered": delivery.redelivered, "headers": jsonable(other_headers),
    }
    if delivery.message_id:
        key: str | None = f"mid:{delivery.message_id}"
    elif mode != "plain":
        key = f"ce:{event['source']}\x00{event['id']}"
    else:
        key = None
    return Mapped(event=event, key=key, mode=mode)


def encode_event(event: dict[str, Any], max_bytes: int) -> bytes:
    body = json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(body) > max_bytes:
        raise Malformed(f"the event has {len(body)} bytes of JSON; a function accepts at most {max_bytes}")
    return body
