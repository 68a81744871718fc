"""The OpenAPI document's part for what is not the REST resources: a function's calls and the console.

``/fn/{ns}/{name}`` is each function's own HTTP interface, so its success answers are whatever the
function says (``default``); what the document can promise is the platform's side of a call: the async
answer (202 and where its outcome will be), the refusals the platform makes before the function sees the
call (401, 403, 404, 413, 429 with ``Retry-After``) and the answers it gives for a function that did not
answer (502, 503, 504). The console is a page for people: documented so a client knows it is there.
Kept apart from ``openapi`` so that module stays the REST API's resources.
"""

from __future__ import annotations

from typing import Any

from sless_api.gateway.headers import CALLBACK_HEADER
from sless_api.gateway.requestid import HEADER as REQUEST_ID_HEADER

#: The methods a function receives (HEAD is GET without a body; a WebSocket upgrade is a GET).
FN_METHODS = ("get", "post", "put", "patch", "delete", "head", "options")
#: The paths ``fn_paths`` documents, none of them a route of the REST app (the proxy serves them).
FN_PATHS = ("/fn/{ns}/{name}", "/fn/{ns}/{name}/{path}")

_ERROR = {"$ref": "#/components/schemas/Error"}
_ASYNC_ACCEPTED = {
    "type": "object", "required": ["id", "state", "status_url", "request_id"], "properties": {
        "id": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
        "state": {"const": "queued"},
        "status_url": {"type": "string", "description": "GET it with the tenant's token: the call's state and result"},
        "request_id": {"type": "string"}}}
_REFUSALS = {
    "400": "an asynchronous call's callback URL refused, or a callback without an asynchronous call",
    "401": "the trigger has `auth: token` and the call has no valid token",
    "403": "the token is another tenant's",
    "404": "no such function, or no enabled http trigger exposes it, or it is not ready",
    "413": "the body is larger than SLESS_MAX_BODY_BYTES",
    "429": "a concurrency limit (the tenant's or the function's) is reached: `Retry-After` says when to retry",
    "502": "the function's process or pod did not answer (it crashed or refused the connection)",
    "503": "the function is starting, or waits at zero longer than the platform holds a call: `Retry-After` "
           "when known",
    "504": "the function ran past its timeout",
}


def _header(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "schema": schema or {"type": "string"},
            "description": description}


def _fn_operation(method: str) -> dict[str, Any]:
    responses: dict[str, Any] = {
        "default": {"description": "the function's own answer: its status, headers and body"},
        "202": {"description": "an asynchronous call is queued (`Prefer: respond-async` or `X-Sless-Async: 1`); "
                               "`Location` is its status URL",
                "headers": {"Location": {"schema": {"type": "string"}}},
                "content": {"application/json": {"schema": _ASYNC_ACCEPTED}}},
    }
    for code, reason in _REFUSALS.items():
        answer: dict[str, Any] = {"description": reason, "content": {"application/json": {"schema": _ERROR}}}
        if code in ("429", "503"):
            answer["headers"] = {"Retry-After": {"schema": {"type": "integer", "minimum": 0}}}
        responses[code] = answer
    return {
        "summary": f"call the function ({method.upper()})",
        "description": "The call reaches the function as its event (see the runtime contract). A token is "
                       "needed only when the function's http trigger says `auth: token`. A GET with "
                       "`Upgrade: websocket` opens a WebSocket to the function.",
        # A token is optional: whether the call needs one is the trigger's `auth`, not the route's.
        "security": [{}, {"bearer": []}],
        "parameters": [
            _header("Prefer", "`respond-async`: queue the call and answer 202 at once"),
            _header("X-Sless-Async", "`1` or `true`: the same as `Prefer: respond-async`", {"enum": ["1", "true"]}),
            _header(CALLBACK_HEADER, "an asynchronous call's outcome is POSTed to this URL when it ends"),
            _header(REQUEST_ID_HEADER, "the call's id in the records and logs (a new one when absent or malformed)"),
        ],
        "responses": responses,
    }


def fn_paths() -> dict[str, Any]:
    """``/fn/{ns}/{name}`` and every path below it, each method documented alike."""
    ns = {"name": "ns", "in": "path", "required": True, "description": "the function's tenant namespace",
          "schema": {"type": "string", "pattern": r"^sless-[0-9a-f]{16}$"}}
    name = {"name": "name", "in": "path", "required": True, "schema": {"$ref": "#/components/schemas/Name"}}
    rest = {"name": "path", "in": "path", "required": True,
            "schema": {"type": "string", "pattern": r"^[A-Za-z0-9._~-]+(/[A-Za-z0-9._~-]+)*$", "maxLength": 1024},
            "description": "the rest of the path, passed to the function as the event's `_path`"}
    operations = {method: _fn_operation(method) for method in FN_METHODS}
    return {FN_PATHS[0]: {"parameters": [ns, name], **operations},
            FN_PATHS[1]: {"parameters": [ns, name, rest], **operations}}


def console_paths(assets: frozenset[str]) -> dict[str, Any]:
    """The console's page and the static files it loads (ASSETS)."""
    page = {"text/html": {"schema": {"type": "string"}}, "text/plain": {"schema": {"type": "string"}}}
    static = {kind: {"schema": {"type": "string"}} for kind in ("text/javascript", "text/css")}
    return {
        "/console": {"get": {
            "summary": "the console: an HTML page when `Accept` has text/html, else the tenant's functions and "
                       "triggers as plain text (that listing needs the tenant's token)",
            "security": [],
            "responses": {"200": {"description": "the page, or the listing", "content": page},
                          "401": {"$ref": "#/components/responses/E401"},
                          "503": {"$ref": "#/components/responses/E503"}}}},
        "/console/{asset}": {
            "parameters": [{"name": "asset", "in": "path", "required": True,
                            "schema": {"type": "string", "enum": sorted(assets)}}],
            "get": {"summary": "a script or style sheet of the console page", "security": [],
                    "responses": {"200": {"description": "the file", "content": static},
                                  "404": {"$ref": "#/components/responses/E404"}}}},
    }
