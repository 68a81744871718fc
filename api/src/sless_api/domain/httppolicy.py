"""What an http trigger's ``methods`` and ``cors`` mean for a call through ``/fn``: answered from memory per call.

The proxy asks three things: may this method reach the function (else 405 with ``Allow``), is this a CORS
preflight it answers itself (a browser's ``OPTIONS`` with ``Access-Control-Request-Method``), and which CORS
headers go on the function's answer. A function with several http triggers (possible only for custom resources
written directly) gets the strictest of them: the methods all allow, and CORS only when they all say the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Headers = list[tuple[str, str]]


@dataclass(frozen=True)
class Cors:
    origins: frozenset[str]  # exact origins; empty with any_origin
    any_origin: bool
    methods: tuple[str, ...]
    headers: tuple[str, ...]  # lower case
    credentials: bool
    max_age: int

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> Cors:
        origins = list(spec["origins"])
        return cls(frozenset(o for o in origins if o != "*"), origins == ["*"], tuple(spec["methods"]),
                   tuple(spec["headers"]), bool(spec["credentials"]), int(spec["max_age"]))

    def allowed_origin(self, origin: str) -> str | None:
        """The ``Access-Control-Allow-Origin`` value for ORIGIN; None when it is not allowed."""
        if self.any_origin:
            return "*"
        return origin if origin in self.origins else None

    def answer_headers(self, origin: str) -> Headers:
        """The CORS headers on an answer to ORIGIN (none for an origin not allowed: the browser then refuses)."""
        allowed = self.allowed_origin(origin)
        if allowed is None:
            return []
        out = [("access-control-allow-origin", allowed)]
        if not self.any_origin:
            out.append(("vary", "Origin"))  # the answer differs by origin: caches must key on it
        if self.credentials:
            out.append(("access-control-allow-credentials", "true"))
        return out

    def preflight(self, origin: str, method: str, asked_headers: str) -> Headers | None:
        """The headers of the platform's 204 to a preflight; None when its origin, method or a header it asks
        for is not allowed (then 403)."""
        allowed = self.allowed_origin(origin)
        wanted = [h.strip().lower() for h in asked_headers.split(",") if h.strip()]
        if allowed is None or method not in self.methods or any(h not in self.headers for h in wanted):
            return None
        out = self.answer_headers(origin)
        out.append(("access-control-allow-methods", ", ".join(self.methods)))
        if self.headers:
            out.append(("access-control-allow-headers", ", ".join(self.headers)))
        out.append(("access-control-max-age", str(self.max_age)))
        return out


@dataclass(frozen=True)
class HttpPolicy:
    methods: frozenset[str] | None  # None: every method reaches the function
    cors: Cors | None

    def allows(self, method: str) -> bool:
        return self.methods is None or method in self.methods

    def allow_header(self) -> str:
        order = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
        return ", ".join(m for m in order if self.methods is None or m in self.methods)


def route_auth(auths: Iterable[str]) -> str:
    """The auth of a URL (a function's, or one path pattern's) given the settings of the enabled http triggers that
    serve it: ``public`` only when every one says so. The API refuses two triggers for the same URL, but custom
    resources written directly may hold two; then the stricter wins (deny by default), never the looser (a public
    trigger once opened a URL another trigger said needs a token). None at all: ``token``."""
    found = list(auths)
    return "public" if found and all(auth == "public" for auth in found) else "token"


def route_policy(specs: Iterable[tuple[Sequence[str] | None, dict[str, Any] | None]]) -> HttpPolicy | None:
    """The policy of a function's URL from its enabled http triggers' (methods, cors); None: no rule at all (every
    method, no CORS: the fast path). Several triggers: methods all of them allow, CORS only when all agree."""
    given = list(specs)
    methods: frozenset[str] | None = None
    for listed, _ in given:
        if listed is not None:
            methods = frozenset(listed) if methods is None else methods & frozenset(listed)
    corses = [cors for _, cors in given]
    cors = Cors.from_spec(corses[0]) if corses and corses[0] is not None and all(c == corses[0] for c in corses) \
        else None
    if methods is None and cors is None:
        return None
    return HttpPolicy(methods, cors)
