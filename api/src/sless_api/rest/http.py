"""HTTP plumbing shared by the REST resources: JSON errors, tenancy checks, bodies and paging.

Every failure leaves the API as JSON ``{"error": ...}`` with its status; nothing renders HTML or a stack trace.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import falcon
import falcon.asgi

from sless_api.auth import AuthError, Claims, TokenVerifier, bearer_token
from sless_api.domain.errors import PlatformError
from sless_api.domain.jsonshape import JsonShapeError, parse_json
from sless_core.errors import ValidationError
from sless_core.naming import is_tenant_namespace, validate_name

log = logging.getLogger("sless.api")
MAX_JSON_BYTES = 1024 * 1024
READ_CHUNK = 64 * 1024
T = TypeVar("T")


class ApiError(falcon.HTTPError):
    """An HTTP error whose JSON body is exactly ``{"error": message, **details}``."""

    def __init__(self, status: int, message: str, **details: Any) -> None:
        super().__init__(falcon.code_to_http_status(status), title=message)
        self.body = {"error": message, **details}

    def to_dict(self, obj_type: Callable[[], Any] = dict) -> Any:
        result = obj_type()
        result.update(self.body)
        return result


def serialize_error(req: falcon.Request, resp: falcon.Response, exc: falcon.HTTPError) -> None:
    body = exc.to_dict() if isinstance(exc, ApiError) else {"error": exc.title or "error"}
    if not isinstance(exc, ApiError) and exc.description:
        body["detail"] = exc.description
    resp.media = body
    resp.content_type = falcon.MEDIA_JSON


async def handle_platform_error(req: falcon.asgi.Request, resp: falcon.asgi.Response, exc: PlatformError,
                                params: dict[str, Any], **_: Any) -> None:
    raise ApiError(exc.status, exc.message, **exc.details)


async def handle_validation_error(req: falcon.asgi.Request, resp: falcon.asgi.Response, exc: ValidationError,
                                  params: dict[str, Any], **_: Any) -> None:
    raise ApiError(400, exc.message, **({"field": exc.field} if exc.field else {}))


async def handle_unexpected(req: falcon.asgi.Request, resp: falcon.asgi.Response, exc: Exception,
                            params: dict[str, Any], **_: Any) -> None:
    if isinstance(exc, falcon.HTTPError):
        raise exc
    log.exception("unhandled error on %s %s", req.method, req.path)
    raise ApiError(500, "internal error; the server log has the details")


class PublicResource:
    """Base of the resources anyone may call without a token.

    Authentication is attached to resources, not to path prefixes: every routed resource needs a verified
    token unless its class derives from this one, so a public route says so by name and a new route is
    private by default.
    """


class TenantAuth:
    """Middleware: names in the path are validated, then every non-public resource needs a verified token
    whose tenant owns the namespace in the path (admins may cross tenants, never leave tenant namespaces)."""

    def __init__(self, verifier: TokenVerifier | None) -> None:
        self.verifier = verifier

    async def process_resource(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, resource: object,
                               params: dict[str, Any]) -> None:
        if resource is None:
            return  # no route: Falcon answers 404 and nothing is read
        check_path_params(params)
        if isinstance(resource, PublicResource):
            return
        claims = await self.authenticate(req, resp)
        namespace = params.get("ns")
        if namespace is not None and namespace != claims.namespace and not claims.admin:
            raise ApiError(403, "this namespace belongs to another tenant", namespace=namespace)
        req.context.claims = claims

    async def authenticate(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> Claims:
        """The caller's verified claims, or 401 (503 when no key is configured)."""
        if self.verifier is None:
            raise ApiError(503, "authentication is not configured: set SLESS_JWT_SECRET, SLESS_JWT_PUBLIC_KEY "
                                "or SLESS_JWKS_URL")
        try:
            return await self.verifier.verify_async(bearer_token(req.get_header("Authorization")))
        except AuthError as exc:
            resp.set_header("WWW-Authenticate", 'Bearer realm="sless"')
            raise ApiError(401, str(exc)) from exc


def check_path_params(params: dict[str, Any]) -> None:
    """Names from the path become file paths, keys and object names: validate them before anything runs."""
    if "ns" in params and not is_tenant_namespace(params["ns"]):
        raise ApiError(400, "not a tenant namespace: 'sless-' and 16 lower-case hex digits", field="namespace")
    if "name" in params:
        validate_name(params["name"])


def claims_of(req: falcon.asgi.Request) -> Claims:
    claims: Claims = req.context.claims
    return claims


async def json_body(req: falcon.asgi.Request) -> Any:
    """The request's JSON document, read with a bound (chunked bodies too) and checked for shape."""
    if req.content_length is not None and req.content_length > MAX_JSON_BYTES:
        raise ApiError(413, f"JSON body exceeds {MAX_JSON_BYTES} bytes", limit=MAX_JSON_BYTES)
    if not (req.content_type or "").startswith("application/json"):
        raise ApiError(415, "send a JSON body with Content-Type: application/json")
    data = await read_bounded(req.stream, MAX_JSON_BYTES)
    if not data.strip():
        raise ApiError(400, "the request body is empty; a JSON object is required")
    try:
        return parse_json(data)
    except JsonShapeError as exc:
        raise ApiError(400, str(exc)) from None


async def read_bounded(stream: Any, limit: int) -> bytes:
    """The whole body, refused with 413 as soon as it passes LIMIT (never buffered past it)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await stream.read(READ_CHUNK)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body exceeds {limit} bytes", limit=limit)
        chunks.append(chunk)


def page(items: Sequence[T], req: falcon.asgi.Request, key: Callable[[T], str],
         render: Callable[[T], dict[str, Any]]) -> dict[str, Any]:
    """Keyset paging over a sorted list: ?limit=N&cursor=<opaque>."""
    limit = query_int(req, "limit", 100, 1, 1000)
    cursor = req.get_param("cursor")
    after = None
    if cursor:
        try:
            # Any well-formed base64 is a position in the sorted names (an unknown one is merely a place).
            after = base64.urlsafe_b64decode(cursor.encode("ascii")).decode("utf-8", "replace")
        except ValueError as exc:  # bad base64, a non-ASCII cursor
            raise ApiError(400, "cursor is not one this API returned") from exc
    rest = [i for i in items if after is None or key(i) > after]
    chosen = rest[:limit]
    next_cursor = None
    if len(rest) > limit:
        next_cursor = base64.urlsafe_b64encode(key(chosen[-1]).encode()).decode()
    return {"items": [render(i) for i in chosen], "next_cursor": next_cursor}


def query_int(req: falcon.asgi.Request, name: str, default: int, low: int, high: int) -> int:
    raw = req.get_param(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18) or not low <= int(raw) <= high:
        raise ApiError(400, f"{name} must be an integer between {low} and {high}", field=name)
    return int(raw)
