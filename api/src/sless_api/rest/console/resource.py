"""``/console``: a browser page, or a plain-text listing for curl.

The page itself holds no tenant data: it asks for a token and then reads the REST API with it, so there is
never a public page listing a tenant's functions or source. Without ``Accept: text/html`` the same URL
needs the bearer token and answers a plain-text table of the caller's functions.
"""

from __future__ import annotations

from importlib import resources

import falcon
import falcon.asgi

from sless_api.auth import AuthError, TokenVerifier, bearer_token
from sless_api.domain.ports import FunctionBackend
from sless_api.domain.records import FunctionRecord, TriggerRecord
from sless_api.rest.http import ApiError, PublicResource

STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _static(name: str) -> bytes:
    return resources.files("sless_api.rest.console").joinpath("static", name).read_bytes()


def _assets() -> frozenset[str]:
    """The script and style files the page loads: a fixed set read once, so a request names one or gets 404."""
    folder = resources.files("sless_api.rest.console").joinpath("static")
    return frozenset(item.name for item in folder.iterdir() if item.name.endswith((".js", ".css")))


ASSETS = _assets()


def text_listing(functions: list[FunctionRecord], triggers: list[TriggerRecord], base_url: str) -> str:
    by_function: dict[str, list[TriggerRecord]] = {}
    for trig in triggers:
        by_function.setdefault(trig.spec.function, []).append(trig)

    def active(fn: FunctionRecord) -> tuple[int, str]:
        enabled = any(t.spec.enabled for t in by_function.get(fn.spec.name, []))
        return (0 if enabled and fn.phase == "Ready" else 1, fn.spec.name)

    lines = [f"{'NAME':28} {'RUNTIME':10} {'PHASE':9} {'SCALE':9} {'TRIGGERS':24} URL"]
    for fn in sorted(functions, key=active):
        trigs = ",".join(f"{t.spec.type}{'' if t.spec.enabled else '(off)'}" for t in by_function.get(fn.spec.name, []))
        http = any(t.spec.type == "http" and t.spec.enabled for t in by_function.get(fn.spec.name, []))
        url = f"{base_url}/fn/{fn.namespace}/{fn.spec.name}" if http else "-"
        scale = f"{fn.spec.scale.min}..{fn.spec.scale.max}" if fn.spec.scale is not None else "fixed"
        lines.append(f"{fn.spec.name:28} {fn.spec.runtime:10} {fn.phase:9} {scale:9} {trigs or '-':24} {url}")
        if fn.phase == "Failed":
            lines.append(f"    {fn.message.splitlines()[-1] if fn.message else ''}")
    return "\n".join(lines) + "\n"


class Console(PublicResource):
    """Public by name: the page holds no data, and the plain-text listing checks the token itself."""

    def __init__(self, platform: FunctionBackend, verifier: TokenVerifier | None, public_url: str) -> None:
        self.platform = platform
        self.verifier = verifier
        self.public_url = public_url

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        if "text/html" in (req.get_header("Accept") or ""):
            self._send(resp, "index.html")
            return
        if self.verifier is None:
            raise ApiError(503, "authentication is not configured")
        try:
            claims = await self.verifier.verify_async(bearer_token(req.get_header("Authorization")))
        except AuthError as exc:
            raise ApiError(401, str(exc)) from exc
        functions = await self.platform.list_functions(claims.namespace)
        triggers = await self.platform.list_triggers(claims.namespace)
        resp.content_type = "text/plain; charset=utf-8"
        resp.text = text_listing(functions, triggers, self.public_url or req.prefix)

    @staticmethod
    def _send(resp: falcon.asgi.Response, name: str) -> None:
        resp.data = _static(name)
        resp.content_type = STATIC_TYPES[name[name.rindex("."):]]
        for key, value in SECURITY_HEADERS.items():
            resp.set_header(key, value)


class ConsoleAsset(Console):
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,  # type: ignore[override]
                     asset: str) -> None:
        if asset not in ASSETS:
            raise ApiError(404, "no such console file")
        self._send(resp, asset)
