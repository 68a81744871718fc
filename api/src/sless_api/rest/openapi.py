"""The REST API's OpenAPI 3.1 document, served at ``/v1/openapi.json``.

Written out rather than derived from the resources: the schemas say what a client may rely on, and a
test keeps the document and the router table in step (every route documented, nothing documented that
is not routed), while a schemathesis run checks the answers against the schemas.
"""

from __future__ import annotations

from typing import Any

import falcon.asgi

from sless_api.domain.secrets import MAX_KEYS, MAX_SECRET_BYTES, MAX_VALUE_BYTES
from sless_api.rest.console.resource import ASSETS
from sless_api.rest.http import PublicResource
from sless_api.rest.openapi_gateway import console_paths, fn_paths
from sless_api.rest.openapi_queues import queue_paths
from sless_core.httproutes import METHODS as HTTP_METHODS
from sless_core.models import (
    ENV_MAX_VARS,
    MAX_CONCURRENCY,
    MAX_RUN_ID,
    MEMORY_DEFAULT_MB,
    MEMORY_MAX_MB,
    MEMORY_MIN_MB,
    RUNTIMES,
    SANDBOXES,
    SCALE_DEFAULTS,
    SCALE_IDLE_MAX_SEC,
    SCALE_IDLE_MIN_SEC,
    SCALE_MAX_REPLICAS,
    TIMEOUT_DEFAULT_SEC,
)
from sless_core.naming import NAME_MAX

JSON = "application/json"
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
NAMESPACE_PATTERN = r"^sless-[0-9a-f]{16}$"
SECRET_KEY_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$"  # noqa: S105  (a pattern, not a secret)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


ERROR_REASONS = {400: "invalid input (`field` names it)", 401: "missing or bad token",
                 403: "another tenant's namespace, or the tenant's quota reached (`quota` names it)",
                 404: "no such object (or path)", 405: "method not allowed",
                 409: "conflict", 413: "body too large", 415: "wrong content type",
                 422: "not supported by this backend or cluster (e.g. scale without KEDA)",
                 501: "this cluster does not let the API read pod logs (and none were kept with the record)",
                 503: "not ready, or no token key configured"}
COMMON = (400, 401, 403, 404, 405, 413, 503)
WRITE = (*COMMON, 409, 415)


def _page(item: str) -> dict[str, Any]:
    return {"type": "object", "required": ["items", "next_cursor"], "properties": {
        "items": {"type": "array", "items": _ref(item)}, "next_cursor": _nullable({"type": "string"})}}


SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "required": ["error"], "additionalProperties": True,
              "properties": {"error": {"type": "string"}, "field": {"type": "string"}}},
    "SecretRef": {"type": "object", "required": ["name", "key"], "additionalProperties": False,
                  "description": "one key of a tenant secret, as the env var `env` or as the file `file` in "
                                 "$SLESS_SECRETS_DIR (exactly one of the two); the secret and key must exist",
                  "properties": {"name": {"type": "string", "pattern": NAME_PATTERN, "maxLength": NAME_MAX},
                                 "key": {"type": "string", "pattern": SECRET_KEY_PATTERN},
                                 "env": {"type": "string"},
                                 "file": {"type": "string", "pattern": SECRET_KEY_PATTERN}}},
    "SecretWrite": {"type": "object", "required": ["data"], "additionalProperties": False, "properties": {
        "name": _ref("Name"),
        "data": {"type": "object", "minProperties": 1, "maxProperties": MAX_KEYS,
                 "propertyNames": {"pattern": SECRET_KEY_PATTERN},
                 "additionalProperties": {"type": "string", "maxLength": MAX_VALUE_BYTES},
                 "description": f"key: value, at most {MAX_VALUE_BYTES} bytes a value and {MAX_SECRET_BYTES} "
                                "in all; values are never returned"}}},
    "SecretCreate": {"allOf": [_ref("SecretWrite"), {"type": "object", "required": ["name"]}]},
    "Secret": {"type": "object", "required": ["name", "namespace", "keys", "version"], "properties": {
        "name": {"type": "string"}, "namespace": {"type": "string"},
        "keys": {"type": "array", "items": {"type": "string"}},
        "version": {"type": "integer", "minimum": 1, "description": "counts writes; 1 at creation"},
        "created_at": _nullable({"type": "string"}), "updated_at": _nullable({"type": "string"})}},
    "Scale": {"type": "object", "additionalProperties": False,
              "description": "demand-driven replicas: between min and max, target calls in flight per replica, back "
                             "to min after idle_sec without calls (min 0: scale to zero, the first call waits for "
                             "a start or gets 503 with Retry-After). Every field is optional, with its default; "
                             "min must not exceed max. On Kubernetes it needs KEDA in the cluster (422 without).",
              "properties": {
                  "min": {"type": "integer", "minimum": 0, "maximum": SCALE_MAX_REPLICAS,
                          "default": SCALE_DEFAULTS["min"], "description": "replicas when idle; 0: scale to zero"},
                  "max": {"type": "integer", "minimum": 1, "maximum": SCALE_MAX_REPLICAS,
                          "default": SCALE_DEFAULTS["max"], "description": "replicas at most"},
                  "target": {"type": "integer", "minimum": 1, "maximum": MAX_CONCURRENCY,
                             "default": SCALE_DEFAULTS["target"],
                             "description": "calls in flight per replica the scaler aims at"},
                  "idle_sec": {"type": "integer", "minimum": SCALE_IDLE_MIN_SEC, "maximum": SCALE_IDLE_MAX_SEC,
                               "default": SCALE_DEFAULTS["idle_sec"],
                               "description": "seconds without calls before going back to min"}}},
    "FunctionFields": {"type": "object", "properties": {
        "runtime": {"enum": list(RUNTIMES)},
        "entrypoint": {"type": "string", "description": "module.function (python), export (node), Function (go)"},
        "memory_mb": {"type": "integer", "minimum": MEMORY_MIN_MB, "maximum": MEMORY_MAX_MB,
                      "default": MEMORY_DEFAULT_MB},
        "timeout_sec": {"type": "integer", "minimum": 1, "default": TIMEOUT_DEFAULT_SEC},
        "env_vars": {"type": "object", "maxProperties": ENV_MAX_VARS, "additionalProperties": {"type": "string"}},
        "secrets": {"type": "array", "items": _ref("SecretRef")},
        "max_concurrency": {"type": "integer", "minimum": 0, "maximum": MAX_CONCURRENCY, "default": 0,
                            "description": "calls in flight through /fn at once (per API process); 0: no limit"},
        "sandbox": {"enum": ["", *SANDBOXES], "default": "",
                    "description": "a stronger sandbox the function's pods must run in (kubernetes: RuntimeClass "
                                   "gvisor; the standalone backend answers 422); empty: the platform's default"},
        "scale": _nullable(_ref("Scale")) | {
            "default": None, "description": "null (or absent): fixed replicas (one process on standalone); an "
                                            "update replaces the whole object, null removes it"}}},
    "FunctionCreate": {"allOf": [_ref("FunctionFields"), {"type": "object", "required": ["name", "runtime"],
                                                          "properties": {"name": _ref("Name")}}]},
    "Function": {"allOf": [_ref("FunctionFields"), {"type": "object", "required": [
        "name", "runtime", "namespace", "phase", "message", "scale"], "properties": {
        "name": {"type": "string"}, "namespace": {"type": "string"},
        "phase": {"enum": ["Pending", "Building", "Ready", "Failed"]}, "message": {"type": "string"},
        "code_hash": _nullable({"type": "string"}), "image": _nullable({"type": "string"}),
        "created_at": _nullable({"type": "string"}), "last_built_at": _nullable({"type": "string"})}}]},
    "Name": {"type": "string", "pattern": NAME_PATTERN, "maxLength": NAME_MAX},
    "TriggerFields": {"type": "object", "properties": {
        "function": _ref("Name"), "enabled": {"type": "boolean", "default": True},
        "schedule": _nullable({"type": "string", "description": "5-field cron expression (cron triggers)"}),
        "queue": _nullable({"type": "string", "description": "queue name (event triggers)"}),
        "delivery": _nullable({"enum": ["at_most_once", "at_least_once"],
                               "description": "event triggers: a call a crash interrupted is dead-lettered "
                                              "(at_most_once, the default: null) or called again (at_least_once)"}),
        "methods": _nullable({"type": "array", "minItems": 1, "maxItems": 7, "uniqueItems": True,
                              "items": {"enum": list(HTTP_METHODS)},
                              "description": "http triggers: the methods that reach the function (others: 405 "
                                             "with Allow); null: all"}),
        "cors": _nullable({"type": "object", "required": ["origins"], "additionalProperties": False,
                           "description": "http triggers: CORS, answered by the platform (preflights included)",
                           "properties": {
                               "origins": {"type": "array", "maxItems": 50, "items": {"type": "string"},
                                           "description": "exact origins (https://app.example.com) or [\"*\"]"},
                               "methods": {"type": "array", "items": {"enum": list(HTTP_METHODS)}},
                               "headers": {"type": "array", "maxItems": 50, "items": {"type": "string"}},
                               "credentials": {"type": "boolean", "default": False},
                               "max_age": {"type": "integer", "minimum": 0, "maximum": 86400, "default": 600}}}),
        "path": _nullable({"type": "string", "maxLength": 400, "pattern": "^/",
                           "description": "http triggers: the path pattern below the function's URL this trigger "
                                          "serves, e.g. /users/{id} (segments of A-Z a-z 0-9 . _ ~ - or a {name} "
                                          "parameter, passed to the handler in the event's _params; a literal "
                                          "segment wins over a parameter); null: every path no pattern serves. "
                                          "Two http triggers of a function with the same pattern: 409"}),
        "auth": {"enum": ["public", "token"], "default": "public"}}},
    "TriggerCreate": {"allOf": [_ref("TriggerFields"), {"type": "object", "required": ["name", "type", "function"],
                                                        "properties": {"name": _ref("Name"),
                                                                       "type": {"enum": ["http", "cron", "event"]}}}]},
    "Trigger": {"allOf": [_ref("TriggerFields"), {"type": "object", "required": [
        "name", "type", "function", "namespace"], "properties": {
        "name": {"type": "string"}, "type": {"enum": ["http", "cron", "event"]}, "namespace": {"type": "string"},
        "message": {"type": "string"}, "url": {"type": "string"},
        "created_at": _nullable({"type": "string"}), "last_fired_at": _nullable({"type": "string"})}}]},
    "JobCreate": {"type": "object", "required": ["name", "function"], "properties": {
        "name": _ref("Name"), "function": _ref("Name"), "event": {"type": "object"},
        "run_id": {"type": "integer", "minimum": 0, "maximum": MAX_RUN_ID, "default": 1}}},
    "AsyncCall": {"type": "object", "required": ["id", "function", "state", "attempts", "status_url"], "properties": {
        "id": {"type": "string", "pattern": "^[0-9a-f]{32}$"}, "function": {"type": "string"},
        "method": {"type": "string"}, "path": {"type": "string"},
        "state": {"enum": ["queued", "running", "succeeded", "dead"]}, "attempts": {"type": "integer"},
        "request_id": {"type": "string"}, "created_at": _nullable({"type": "string"}),
        "finished_at": _nullable({"type": "string"}), "next_attempt_at": _nullable({"type": "string"}),
        "error": _nullable({"type": "string"}), "status_url": {"type": "string"},
        "result": _nullable({"type": "object", "required": ["status", "headers", "truncated"], "properties": {
            "status": {"type": "integer"}, "headers": {"type": "object"}, "truncated": {"type": "boolean"},
            "body": {"type": "string"}, "body_base64": {"type": "string"}}}),
        "callback": _nullable({"type": "object", "required": ["url", "state"], "properties": {
            "url": {"type": "string"}, "state": {"type": "string"}}})}},
    "Job": {"type": "object", "required": ["name", "function", "run_id", "namespace", "phase", "message"],
            "properties": {
                "name": {"type": "string"}, "function": {"type": "string"}, "event": {"type": "object"},
                "run_id": {"type": "integer"}, "namespace": {"type": "string"},
                "phase": {"enum": ["Pending", "Running", "Succeeded", "Failed"]}, "message": {"type": "string"},
                "started_at": _nullable({"type": "string"}), "completed_at": _nullable({"type": "string"}),
                "created_at": _nullable({"type": "string"})}},
    "Version": {"allOf": [_ref("FunctionFields"), {"type": "object", "required": [
        "version", "code_hash", "runtime", "deployed_at", "current"], "properties": {
        "version": {"type": "integer", "minimum": 1}, "code_hash": {"type": "string"},
        "deployed_at": _nullable({"type": "string"}),
        "current": {"type": "boolean", "description": "the version deployed now (the newest)"}}}]},
    "SourceFile": {"type": "object", "required": ["name", "content", "binary"], "properties": {
        "name": {"type": "string"}, "content": {"type": "string"}, "binary": {"type": "boolean"}}},
    "Invocation": {"type": "object", "required": ["namespace", "function", "status", "trigger"], "properties": {
        "id": _nullable({"type": "integer"}), "namespace": {"type": "string"}, "function": {"type": "string"},
        "method": {"type": "string"}, "path": {"type": "string"}, "status": {"type": "integer"},
        "duration_ms": {"type": "number"}, "request_bytes": {"type": "integer"},
        "response_bytes": {"type": "integer"}, "trigger": {"type": "string"},
        "error": _nullable({"type": "string"}), "started_at": {"type": "number"},
        "request_id": _nullable({"type": "string"}),
        "version": _nullable({"type": "integer", "description": "the function's version that answered"}),
        "attempt": _nullable({"type": "integer", "minimum": 1, "description": (
            "which attempt at the same work this was: an event's delivery, counted across redeliveries and "
            "restarts (an at-least-once trigger's call made again after a crash is attempt 2), or an asynchronous "
            "call's try; null for a call made once")}),
        "cold": _nullable({"type": "boolean", "description": "a function process had to start for this call"}),
        "phases_ms": {"type": "object", "required": ["queue", "start", "handler"], "properties": {
            "queue": _nullable({"type": "number", "description": "waiting in the platform, without a start"}),
            "start": _nullable({"type": "number", "description": "waiting for a process to start (cold)"}),
            "handler": _nullable({"type": "number", "description": "in the handler, measured by the runtime"})}}}},
    "TrafficSplit": {"type": "object", "required": ["split"], "additionalProperties": False, "properties": {
        "split": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
            "type": "object", "required": ["version", "weight"], "additionalProperties": False, "properties": {
                "version": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
                "weight": {"type": "integer", "minimum": 0, "maximum": 100}}},
            "description": "the current version and at most one other kept version; the weights sum to 100"}}},
    "Traffic": {"type": "object", "required": ["split"], "properties": {
        "split": _nullable({"type": "array", "items": {"type": "object", "required": ["version", "weight"],
                                                       "properties": {"version": {"type": "integer"},
                                                                      "weight": {"type": "integer"}}}})}},
    "CallLogs": {"type": "object", "required": ["lines", "truncated"], "properties": {
        "lines": {"type": "array", "items": {"type": "object", "required": ["stream", "text", "ts"], "properties": {
            "stream": {"enum": ["stdout", "stderr", "log"],
                       "description": "log: on Kubernetes, where the pod log holds both streams as one"},
            "text": {"type": "string"},
            "ts": {"type": "number", "description": "epoch seconds the platform read the line"}}}},
        "truncated": {"type": "boolean", "description": "the call wrote more than is kept (64 KiB)"}}},
}


def _operation(summary: str, ok: str, ok_schema: dict[str, Any] | None, errors: tuple[int, ...],
               body: dict[str, Any] | None = None, params: list[dict[str, Any]] | None = None,
               public: bool = False, also_ok: tuple[str, ...] = ()) -> dict[str, Any]:
    success = _json(ok_schema, summary) if ok_schema else {"description": summary}
    responses: dict[str, Any] = {code: success for code in (ok, *also_ok)}
    responses |= {str(code): {"$ref": f"#/components/responses/E{code}"} for code in errors}
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = body
    if public:
        op["security"] = []
    return op


def _query(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema}


# A cursor is the next_cursor of the previous page: base64url (padded) of the last name seen.
CURSOR = {"type": "string", "pattern": r"^([A-Za-z0-9_-]{4})*([A-Za-z0-9_-]{2}==|[A-Za-z0-9_-]{3}=)?$",
          "maxLength": 200}
PAGING = [_query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}), _query("cursor", CURSOR)]
NS = {"name": "ns", "in": "path", "required": True,
      "schema": {"type": "string", "pattern": NAMESPACE_PATTERN}, "description": "the tenant's namespace"}
NAME = {"name": "name", "in": "path", "required": True, "schema": _ref("Name")}


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {JSON: {"schema": schema}}}


def paths() -> dict[str, Any]:
    ns = "/v1/namespaces/{ns}"
    probe = {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}
    health = {"type": "object", "required": ["status", "version"], "properties": {
        "status": {"type": "string"}, "version": {"type": "string", "description": "the platform's release"}}}
    upload = {"required": True, "content": {
        "multipart/form-data": {"schema": {"type": "object", "required": ["code"], "properties": {
            "code": {"type": "string", "contentMediaType": "application/zip"}}}},
        "application/zip": {"schema": {"type": "string", "contentMediaType": "application/zip"}}}}
    return {
        "/health": {"get": _operation("the process answers", "200", health, (), public=True)},
        "/ready": {"get": _operation("the backend has started", "200", probe, (), public=True)},
        "/v1/openapi.json": {"get": _operation("this document", "200", {"type": "object"}, (), public=True)},
        "/metrics": {"get": _operation("Prometheus metrics (text exposition); 404 until SLESS_METRICS_TOKEN is set",
                                       "200", None, (401, 404)) | {"security": [{"scrapeToken": []}]}},
        "/v1/whoami": {"get": _operation("the caller", "200", {"type": "object", "required": ["sub", "namespace"],
                                                               "properties": {"sub": {"type": "string"},
                                                                              "namespace": {"type": "string"},
                                                                              "admin": {"type": "boolean"}}},
                                         (401, 503))},
        f"{ns}/ensure": {"parameters": [NS], "post": _operation(
            "create the tenant namespace (200 when it existed)", "201",
            {"type": "object", "required": ["namespace", "created"]}, COMMON, also_ok=("200",))},
        f"{ns}/functions": {"parameters": [NS],
                            "get": _operation("list functions", "200", _page("Function"), COMMON, params=PAGING),
                            "post": _operation("create a function", "201", _ref("Function"), (*WRITE, 422),
                                               body=_body(_ref("FunctionCreate")))},
        f"{ns}/functions/{{name}}": {"parameters": [NS, NAME],
                                     "get": _operation("read a function", "200", _ref("Function"), COMMON),
                                     "put": _operation("update a function: the fields given replace the "
                                                       "stored ones", "200", _ref("Function"), (*WRITE, 422),
                                                       body=_body(_ref("FunctionFields"))),
                                     "patch": _operation("update a function (the same as PUT)", "200",
                                                         _ref("Function"), (*WRITE, 422),
                                                         body=_body(_ref("FunctionFields"))),
                                     "delete": _operation("delete a function and its triggers and jobs", "204",
                                                          None, COMMON)},
        f"{ns}/functions/{{name}}/upload": {"parameters": [NS, NAME], "post": _operation(
            "upload the code (a zip): build queued", "202", _ref("Function"), WRITE, body=upload)},
        f"{ns}/functions/{{name}}/source": {"parameters": [NS, NAME], "get": _operation(
            "the uploaded files", "200", {"type": "object", "required": ["files"], "properties": {
                "files": {"type": "array", "items": _ref("SourceFile")}}}, COMMON)},
        f"{ns}/functions/{{name}}/versions": {"parameters": [NS, NAME], "get": _operation(
            "the deployed versions (code hash and configuration), newest first", "200",
            {"type": "object", "required": ["items"], "properties": {"items": {"type": "array",
                                                                               "items": _ref("Version")}}},
            COMMON)},
        f"{ns}/functions/{{name}}/rollback": {"parameters": [NS, NAME], "post": _operation(
            "deploy an earlier version's code and configuration again (default: the previous version)", "202",
            _ref("Function"), WRITE, body={"required": False, "content": {JSON: {"schema": {
                "type": "object", "additionalProperties": False, "properties": {
                    "version": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1}}}}}})},
        f"{ns}/functions/{{name}}/traffic": {
            "parameters": [NS, NAME],
            "get": _operation("the split of http calls between two versions (null: none)", "200", _ref("Traffic"),
                              COMMON),
            "put": _operation("share http calls between the current version and another kept one by weight",
                              "200", _ref("Traffic"), WRITE, body=_body(_ref("TrafficSplit"))),
            "delete": _operation("drop the split: every call goes to the current version", "204", None, COMMON)},
        f"{ns}/functions/{{name}}/invocations": {"parameters": [NS, NAME], "get": _operation(
            "recent invocations, newest first", "200", _page("Invocation"), COMMON,
            params=[_query("limit", {"type": "integer", "minimum": 1, "maximum": 500}),
                    _query("cursor", {"type": "string", "pattern": "^[0-9]{1,18}$"})])},
        f"{ns}/functions/{{name}}/invocations/{{ident}}/logs": {"parameters": [NS, NAME, {
            "name": "ident", "in": "path", "required": True, "schema": {"type": "string",
                                                        "pattern": "^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}$"},
            "description": "an invocation record's id, or the call's request id (X-Request-Id)"}], "get": _operation(
            "what one call wrote to stdout/stderr: the lines kept with its record (written before its answer) or "
            "those its process or pod still holds, whichever has more", "200",
            _ref("CallLogs"), (*COMMON, 501))},
        f"{ns}/triggers": {"parameters": [NS],
                           "get": _operation("list triggers", "200", _page("Trigger"), COMMON, params=PAGING),
                           "post": _operation("create a trigger", "201", _ref("Trigger"), (*WRITE, 422),
                                              body=_body(_ref("TriggerCreate")))},
        f"{ns}/triggers/{{name}}": {"parameters": [NS, NAME],
                                    "get": _operation("read a trigger", "200", _ref("Trigger"), COMMON),
                                    "patch": _operation("change a trigger", "200", _ref("Trigger"), (*WRITE, 422),
                                                        body=_body(_ref("TriggerFields"))),
                                    "delete": _operation("delete a trigger", "204", None, COMMON)},
        f"{ns}/jobs": {"parameters": [NS],
                       "get": _operation("list jobs", "200", _page("Job"), COMMON, params=PAGING),
                       "post": _operation("create (and run) a job", "201", _ref("Job"), WRITE,
                                          body=_body(_ref("JobCreate")))},
        f"{ns}/calls": {"parameters": [NS], "get": _operation(
            "asynchronous calls, newest first (?state=dead: the dead letters)", "200", _page("AsyncCall"), COMMON,
            params=[_query("limit", {"type": "integer", "minimum": 1, "maximum": 500}),
                    _query("cursor", {"type": "string", "pattern": "^[0-9a-f]{32}$"}),
                    _query("function", _ref("Name")),
                    _query("state", {"enum": ["queued", "running", "succeeded", "dead"]})])},
        f"{ns}/calls/{{call_id}}": {"parameters": [NS, {"name": "call_id", "in": "path", "required": True,
                                                        "schema": {"type": "string", "pattern": "^[0-9a-f]{32}$"}}],
                                    "get": _operation("an asynchronous call: its state and result", "200",
                                                      _ref("AsyncCall"), COMMON)},
        f"{ns}/jobs/{{name}}": {"parameters": [NS, NAME],
                                "get": _operation("read a job", "200", _ref("Job"), COMMON),
                                "patch": _operation("run a job again with a larger run_id", "200", _ref("Job"), WRITE,
                                                    body=_body({"type": "object", "required": ["run_id"],
                                                                "additionalProperties": False, "properties": {
                                                                    "run_id": {"type": "integer", "minimum": 0,
                                                                               "maximum": MAX_RUN_ID}}})),
                                "delete": _operation("delete a job", "204", None, COMMON)},
        f"{ns}/secrets": {"parameters": [NS],
                          "get": _operation("list secrets (keys and versions, never values)", "200",
                                            _page("Secret"), COMMON, params=PAGING),
                          "post": _operation("create a secret", "201", _ref("Secret"), WRITE,
                                             body=_body(_ref("SecretCreate")))},
        f"{ns}/secrets/{{name}}": {"parameters": [NS, NAME],
                                   "get": _operation("read a secret's keys and version", "200", _ref("Secret"),
                                                     COMMON),
                                   "put": _operation("replace a secret's data (the functions using it restart)",
                                                     "200", _ref("Secret"), WRITE, body=_body(_ref("SecretWrite"))),
                                   "delete": _operation("delete a secret no function uses (409 otherwise)", "204",
                                                        None, (*COMMON, 409))},
    }




def document() -> dict[str, Any]:
    """The whole OpenAPI 3.1 document."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "sless REST API", "version": "v1",
                 "description": "Functions, triggers and jobs of a tenant, and the calls to its functions "
                                "(`/fn/...`). Every route needs `Authorization: Bearer <JWT>` unless it says "
                                "`security: []` (or, for a call, `{}`: its trigger decides)."},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        # the functions' calls (served by the proxy, not a REST route) and the console's page and files
        "paths": paths() | queue_paths("/v1/namespaces/{ns}") | fn_paths() | console_paths(ASSETS),
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"},
                            "scrapeToken": {"type": "http", "scheme": "bearer",
                                            "description": "the operator's SLESS_METRICS_TOKEN, not a tenant JWT"}},
            "schemas": SCHEMAS,
            "responses": {f"E{code}": _json(_ref("Error"), reason) for code, reason in ERROR_REASONS.items()},
        },
    }


class OpenApiDocument(PublicResource):
    """``GET /v1/openapi.json``: public by name (it describes routes, holds no tenant data)."""

    def __init__(self) -> None:
        self.document = document()

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = self.document
