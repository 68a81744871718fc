"""One spelling per resource: request paths are checked before any routing decision.

Routers are forgiving: Falcon matches ``//v1/...`` and a server decodes ``/%2Fv1/...`` to ``//v1/...``,
so a decision taken on a path prefix ("does it start with /v1/?") can be walked around by spelling the
same resource differently. Here the raw request target decides: a platform path must be canonical
(one slash between segments, no ``.``/``..`` segment, no percent-escape, no backslash, no control
character), anything else is refused before it reaches the REST router or the invoke proxy.

Only the part of an invoke path that belongs to the function (``/fn/{ns}/{name}`` + *tail*) may carry
escapes and odd spellings: it is the function's business and is forwarded exactly as sent.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import MutableMapping
from typing import Any, NamedTuple
from urllib.parse import unquote

from sless_core.naming import is_function_name, is_tenant_namespace

# Characters a canonical platform path may hold: names are DNS-1123 labels, assets have a dot.
_CANONICAL = re.compile(r"(/[A-Za-z0-9._-]+)*/?")
FN_PREFIX = "/fn/"
# The runtime's own endpoints (health probe) live under this prefix and are not the caller's to reach.
RUNTIME_PREFIX = "/_"


class InvokeTarget(NamedTuple):
    """An invoke request split into the platform's part (validated) and the function's part (as sent).

    A named tuple rather than a frozen dataclass: one is made for every call, and a frozen dataclass's ``__init__``
    sets each field through ``object.__setattr__``.
    """

    namespace: str
    function: str
    tail: str  # raw path after /fn/{ns}/{name}, starting with "/" (or "/" when empty)


def raw_path(scope: MutableMapping[str, Any]) -> str:
    """The request path exactly as the client sent it (percent-escapes kept), without the query."""
    raw = scope.get("raw_path")
    if raw:
        return bytes(raw).split(b"?", 1)[0].decode("latin-1")
    return str(scope["path"])


def is_canonical(path: str) -> bool:
    """Whether PATH names a platform resource in its one accepted spelling."""
    if not path.startswith("/") or "//" in path or not _CANONICAL.fullmatch(path):
        return False
    return all(segment not in (".", "..") for segment in path.split("/"))


def is_invoke_path(path: str) -> bool:
    return path.startswith(FN_PREFIX)


def split_invoke(path: str) -> InvokeTarget | None:
    """``/fn/{ns}/{name}[/tail]`` with a tenant namespace and a function name, else None (answer 404)."""
    parts = path.split("/", 4)  # "", "fn", ns, name, tail
    if len(parts) < 4:
        return None
    pair = (parts[2], parts[3])
    if pair not in _VALID_PAIRS:
        if not is_tenant_namespace(pair[0]) or not is_function_name(pair[1]):
            return None
        if len(_VALID_PAIRS) >= _VALID_PAIRS_MAX:  # bounded: callers choose what they send
            _VALID_PAIRS.clear()
        _VALID_PAIRS.add(pair)
    tail = "/" + (parts[4] if len(parts) > 4 else "")
    return InvokeTarget(pair[0], pair[1], tail)


#: (namespace, function) pairs found valid already: the two pattern matches are skipped for the next call to them.
_VALID_PAIRS: set[tuple[str, str]] = set()
_VALID_PAIRS_MAX = 10_000


def reaches_runtime_internals(tail: str) -> bool:
    """Whether TAIL, as any runtime might decode and normalise it, names the runtime's ``/_/`` endpoints."""
    if "_" not in tail and "%" not in tail:
        return False  # no underscore, literal or escaped: nothing to decode or normalise into one (most calls)
    decoded = tail
    for _ in range(3):  # double-encoded spellings too (%255F -> %5F -> _)
        decoded = unquote(decoded)
    normal = "/" + posixpath.normpath("/" + decoded.replace("\\", "/")).lstrip("/")
    return normal == RUNTIME_PREFIX or normal.startswith(RUNTIME_PREFIX + "/")


async def refuse_path(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
    """Answer a non-canonical spelling with 404 (a websocket is closed): no route is ever tried for it."""
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps({"error": "no such route: spell the path without '//', '.', '..', escapes or "
                                "backslashes"}).encode()
    await send({"type": "http.response.start", "status": 404,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
