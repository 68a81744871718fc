"""A small asyncio Kubernetes client for the operator's own calls.

Why not the official client: it is synchronous (a thread per call) and deserialises every
response into generated model classes, which costs both time and memory when a thousand
Functions reconcile at once. This client speaks plain JSON over one pooled aiohttp session
built from the same ``kopf.ConnectionInfo`` Kopf logs in with, so the operator and Kopf share
one way of authenticating (kubeconfig certificates, a service-account token, ...).

Errors come back as :class:`ApiError`; ``transient`` tells handlers whether to retry.
Transient failures are retried here a few times first, so a single apiserver hiccup does not
cost a Kopf handler round-trip (and an event handler, which Kopf never retries, is not lost).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import aiohttp
import kopf

log = logging.getLogger(__name__)

TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0)
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"

Relogin = Callable[[], Awaitable["kopf.ConnectionInfo | None"]]


class ApiError(Exception):
    """A failed API request: HTTP status (0 when no response), the API's reason and message."""

    def __init__(self, status: int, reason: str, message: str, method: str = "", path: str = "") -> None:
        super().__init__(f"{method} {path}: {status} {reason}: {message}".strip())
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def transient(self) -> bool:
        """Worth retrying later: throttling, server trouble, or no answer at all."""
        return self.status == 0 or self.status in TRANSIENT_STATUSES

    @property
    def conflict(self) -> bool:
        return self.status == 409


def api_path(api_version: str, plural: str, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:  # fmt: skip
    """``/api/v1/...`` for the core group, ``/apis/<group>/<version>/...`` for the others."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    parts = [base]
    if namespace:
        parts.append(f"namespaces/{quote(namespace, safe='')}")
    parts.append(plural)
    if name:
        parts.append(quote(name, safe=""))
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


def object_path(obj: dict[str, Any], plural: str) -> str:
    """The path of an object dict (apiVersion + metadata) in the collection PLURAL."""
    meta = obj["metadata"]
    return api_path(obj["apiVersion"], plural, meta.get("namespace"), meta["name"])


class Kube:
    """JSON requests against the apiserver; ``connect`` must run before the first call."""

    def __init__(self, concurrency: int = 32, request_timeout: float = 30.0) -> None:
        self._concurrency = concurrency
        self._timeout = aiohttp.ClientTimeout(total=request_timeout, sock_connect=10)
        self._session: aiohttp.ClientSession | None = None
        self._server = ""
        self._connected = asyncio.Event()
        self._relogin: Relogin | None = None
        self._relogin_lock = asyncio.Lock()

    async def connect(self, info: kopf.ConnectionInfo, relogin: Relogin | None = None) -> None:
        """(Re)build the session from Kopf's credentials; RELOGIN fetches fresh ones after a 401."""
        old = self._session
        connector = aiohttp.TCPConnector(limit=self._concurrency, ssl=info.as_ssl_context(),
                                         keepalive_timeout=30)  # fmt: skip
        headers = {"User-Agent": "sless-operator", "Accept": "application/json", **info.as_http_headers()}
        self._session = aiohttp.ClientSession(connector=connector, headers=headers, timeout=self._timeout)
        self._server = info.server.rstrip("/")
        if relogin is not None:
            self._relogin = relogin
        self._connected.set()
        if old is not None:
            await old.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        self._connected.clear()

    async def request(self, method: str, path: str, *, params: dict[str, str] | None = None,
                      body: Any = None, content_type: str = "application/json",
                      raw: bool = False) -> Any:  # fmt: skip
        """Send one request (retrying transient failures); the parsed JSON, or text when RAW."""
        attempt = 0
        relogged = False
        while True:
            try:
                return await self._once(method, path, params, body, content_type, raw)
            except ApiError as exc:
                if exc.status == 401 and not relogged and self._relogin is not None:
                    relogged = True
                    await self._refresh_credentials()
                    continue
                if not exc.transient or attempt >= len(RETRY_DELAYS):
                    raise
                await asyncio.sleep(RETRY_DELAYS[attempt])
                attempt += 1

    async def _once(self, method: str, path: str, params: dict[str, str] | None, body: Any,
                    content_type: str, raw: bool) -> Any:  # fmt: skip
        if not self._connected.is_set():
            try:
                await asyncio.wait_for(self._connected.wait(), timeout=60)
            except TimeoutError:
                raise ApiError(0, "NotConnected", "no credentials yet", method, path) from None
        session = self._session
        assert session is not None
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        headers = {"Content-Type": content_type} if data is not None else None
        try:
            async with session.request(method, self._server + path, params=params, data=data,
                                       headers=headers) as resp:  # fmt: skip
                text = await resp.text()
                if resp.status >= 400:
                    raise _api_error(resp.status, text, method, path)
                if raw:
                    return text
                return json.loads(text) if text else None
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            raise ApiError(0, type(exc).__name__, str(exc) or "connection failed", method, path) from exc

    async def _refresh_credentials(self) -> None:
        async with self._relogin_lock:
            assert self._relogin is not None
            info = await self._relogin()
            if info is not None:
                await self.connect(info)

    # -- verbs -------------------------------------------------------------------------------

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            result: dict[str, Any] = await self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        result = await self.request("GET", path, params=params)
        return list(result.get("items") or [])

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to the collection PATH; a 409 raises ApiError with ``conflict`` set."""
        result: dict[str, Any] = await self.request("POST", path, body=body)
        return result

    async def patch(self, path: str, body: Any, content_type: str = MERGE) -> dict[str, Any] | None:
        """Patch an object; None when it does not exist (any more)."""
        try:
            result: dict[str, Any] = await self.request("PATCH", path, body=body, content_type=content_type)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def delete(self, path: str, propagation: str = "Background") -> bool:
        """Delete an object; False when it was already gone."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        try:
            await self.request("DELETE", path, body=body)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def delete_collection(self, path: str, label_selector: str, propagation: str = "Background") -> None:
        """Delete every object under PATH matching LABEL_SELECTOR (one request)."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        try:
            await self.request("DELETE", path, params={"labelSelector": label_selector}, body=body)
        except ApiError as exc:
            if exc.status != 404:  # e.g. the namespace does not exist: nothing to delete
                raise

    async def text(self, path: str, params: dict[str, str] | None = None) -> str:
        """A plain-text subresource, e.g. a pod's log."""
        result: str = await self.request("GET", path, params=params, raw=True)
        return result


def _api_error(status: int, text: str, method: str, path: str) -> ApiError:
    reason, message = "", text[:500]
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        reason = str(data.get("reason") or "")
        message = str(data.get("message") or message)
    return ApiError(status, reason, message, method, path)
