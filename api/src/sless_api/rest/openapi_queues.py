"""The OpenAPI document's part for a tenant's queues: publishing, and the dead letters (``resources.queues``)."""

from __future__ import annotations

from typing import Any

JSON = "application/json"
_NS = {"name": "ns", "in": "path", "required": True, "description": "the tenant's namespace",
       "schema": {"type": "string", "pattern": r"^sless-[0-9a-f]{16}$"}}
_QUEUE = {"name": "queue", "in": "path", "required": True,
          "description": "the queue an event trigger consumes (its `queue`), without the namespace prefix (a "
                         "name with `:` is out of these routes' reach: a path segment is [A-Za-z0-9._-])",
          "schema": {"type": "string", "pattern": r"^[A-Za-z0-9_.-]{1,200}$"}}
_IDS = {"type": "array", "minItems": 1, "maxItems": 1000, "items": {"type": "string", "pattern": "^[0-9a-f]{32}$"}}
DEAD_LETTER_SUMMARY: dict[str, Any] = {
    "type": "object", "required": ["id", "kind", "reason", "attempts", "size"], "properties": {
        "id": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
        "message_id": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "kind": {"type": "string", "description": "failed, rejected, malformed or interrupted"},
        "reason": {"type": "string"}, "attempts": {"type": "integer"},
        "status": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "function": {"type": "string"}, "trigger": {"type": "string"},
        "published_at": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "first_seen_at": {"anyOf": [{"type": "string"}, {"type": "null"}],
                          "description": "when the platform first took the message (its first delivery)"},
        "failed_at": {"anyOf": [{"type": "string"}, {"type": "null"}],
                      "description": "when it was dead-lettered, after its last attempt"},
        "redelivered": {"type": "boolean"}, "content_type": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "size": {"type": "integer"}}}
DEAD_LETTER: dict[str, Any] = {**DEAD_LETTER_SUMMARY, "required": [*DEAD_LETTER_SUMMARY["required"], "body"],
                               "properties": {**DEAD_LETTER_SUMMARY["properties"],
                                              "headers": {"type": "object"}, "body": {"type": "string"},
                                              "body_encoding": {"enum": ["utf-8", "base64"]}}}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(code): {"$ref": f"#/components/responses/E{code}"} for code in codes}


def _ok(code: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {code: {"description": description, "content": {JSON: {"schema": schema}}}}


def _selection(extra: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {JSON: {"schema": {"oneOf": [
        {"type": "object", "required": ["ids"], "additionalProperties": False, "properties": {"ids": _IDS, **extra}},
        {"type": "object", "required": ["all"], "additionalProperties": False,
         "properties": {"all": {"const": True}, **extra}}]}}}}


def queue_paths(ns: str) -> dict[str, Any]:
    """The queue routes below NS (``/v1/namespaces/{ns}``)."""
    base = f"{ns}/queues/{{queue}}"
    common = (400, 401, 403, 404, 422, 503)
    counted = {"type": "object", "required": ["more"], "properties": {
        "redriven": {"type": "integer"}, "purged": {"type": "integer"}, "more": {"type": "boolean"}}}
    return {
        f"{base}/messages": {"parameters": [_NS, _QUEUE], "post": {
            "summary": "publish a message to the queue (persistent, confirmed by the broker); CloudEvents "
                       "attributes as `ce-*` headers or a structured `application/cloudevents+json` body; "
                       "`X-Sless-Message-Id` sets its id (the key of deduplication)",
            "parameters": [{"name": "X-Sless-Message-Id", "in": "header", "required": False,
                            "schema": {"type": "string", "pattern": r"^[A-Za-z0-9._:@+=-]{1,128}$"}}],
            "requestBody": {"required": False, "content": {"*/*": {"schema": {}}}},
            "responses": {**_ok("202", "published", {"type": "object", "required": ["queue", "message_id"],
                                                      "properties": {"queue": {"type": "string"},
                                                                     "message_id": {"type": "string"}}}),
                          **_errors(*common, 413)}}},
        f"{base}/dead-letters": {"parameters": [_NS, _QUEUE], "get": {
            "summary": "the oldest dead letters, left in place (`more`: there are others after them)",
            "parameters": [{"name": "limit", "in": "query", "required": False,
                            "schema": {"type": "integer", "minimum": 1, "maximum": 100}}],
            "responses": {**_ok("200", "dead letters", {"type": "object", "required": ["items", "more"],
                                                         "properties": {"items": {"type": "array",
                                                                                  "items": DEAD_LETTER_SUMMARY},
                                                                        "more": {"type": "boolean"}}}),
                          **_errors(*common)}}},
        f"{base}/dead-letters/{{ident}}": {"parameters": [_NS, _QUEUE, {
            "name": "ident", "in": "path", "required": True, "schema": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
            "description": "a dead letter's id"}], "get": {
            "summary": "one dead letter: why, how often tried, its headers and payload",
            "responses": {**_ok("200", "the dead letter", DEAD_LETTER), **_errors(*common)}}},
        f"{base}/dead-letters/redrive": {"parameters": [_NS, _QUEUE], "post": {
            "summary": "publish dead letters again, to their queue or `to_queue` (the tenant's), and take them out "
                       "of the dead-letter queue",
            "requestBody": _selection({"to_queue": {"type": "string", "pattern": r"^[A-Za-z0-9_.:-]{1,200}$"}}),
            "responses": {**_ok("200", "how many were redriven", counted), **_errors(*common, 413, 415)}}},
        f"{base}/dead-letters/purge": {"parameters": [_NS, _QUEUE], "post": {
            "summary": "drop dead letters for good",
            "requestBody": _selection({}),
            "responses": {**_ok("200", "how many were purged", counted), **_errors(*common, 413, 415)}}},
    }
