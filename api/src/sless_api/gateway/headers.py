"""Header rules of the invoke path: what of a caller's request reaches a function (no credentials, the platform's
``X-Forwarded-*``, ``X-Sless-Sub`` and ``X-Request-Id``), what of a function's answer reaches the caller, and
which request headers change how a call is handled (an async wish, a callback)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from sless_api.domain import calloutput
from sless_api.domain.httppaths import PARAMS_HEADER
from sless_api.gateway import calltiming
from sless_api.gateway.requestid import HEADER
from sless_api.gateway.upstream import UpstreamBroken

# RFC 9110 7.6.1 connection-specific fields, plus those that describe this hop's framing.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})


def end_to_end(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Headers minus hop-by-hop ones, including any the Connection header names."""
    pairs = list(headers)
    named = connection_named(pairs)
    return [(k, v) for k, v in pairs if (low := k.lower()) not in HOP_BY_HOP and low not in named]


def connection_named(headers: list[tuple[str, str]]) -> set[str]:
    """The fields a Connection header names (hop-by-hop for this exchange only)."""
    return {t.strip().lower() for k, v in headers if k.lower() == "connection" for t in v.split(",")}


#: Response headers in which a runtime reports to the platform (runtimes/README.md): never a caller's to see.
_RUNTIME_REPORTS = frozenset({calltiming.HANDLER_MS_HEADER, calloutput.OUTPUT_HEADER})


def to_caller(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """A function's response headers as its caller gets them: end-to-end, without the runtime's report
    to the platform (``X-Sless-Handler-Ms``, ``X-Sless-Output``)."""
    return [(k, v) for k, v in end_to_end(headers) if k.lower() not in _RUNTIME_REPORTS]


# Response headers the server in front sets on every response: the function's copy would be a duplicate.
SERVER_OWNED = frozenset({"date", "server"})
# Request headers the platform owns: the caller's credentials never reach a function, the caller
# cannot claim a verified identity the platform did not check, and an async call's callback URL (it may
# carry the receiver's token) stays with the platform.
CALLBACK_HEADER = "x-sless-callback-url"
CREDENTIAL_HEADERS = frozenset({"authorization", "cookie", "x-sless-sub", CALLBACK_HEADER})
FORWARDED = ("x-forwarded-for", "x-forwarded-proto", "x-forwarded-host")
# The path parameters of the trigger that matched (``httppaths``): the platform's to set, never the caller's.
_NOT_UPSTREAM = HOP_BY_HOP | CREDENTIAL_HEADERS | {HEADER, PARAMS_HEADER}
# What a caller never gets of a function's response head (raw bytes, lower case); Content-Length is set again, and
# X-Request-Id is the platform's (the one the call was given).
_NOT_TO_CALLER = frozenset(h.encode() for h in HOP_BY_HOP | SERVER_OWNED | _RUNTIME_REPORTS | {HEADER})
REQUEST_ID_RAW = HEADER.encode()


def caller_head(raw: Iterable[tuple[bytes, bytes]]) -> tuple[list[tuple[bytes, bytes]], bytes | None]:
    """A function's response head as the proxy sends it on, from the bytes the runtime sent (never decoded
    and encoded again): lower-case names, end-to-end only (``to_caller``), without the fields the server in
    front sets itself (``SERVER_OWNED``); and the runtime's ``Content-Length``, if it sent one."""
    pairs = list(raw)
    named: set[bytes] = set()
    length: bytes | None = None
    for k, v in pairs:
        low = k.lower()
        if low == b"connection":
            named.update(t.strip().lower() for t in v.split(b","))
        elif low == b"content-length" and length is None:
            length = v
    return [(low, v) for k, v in pairs if (low := k.lower()) not in _NOT_TO_CALLER and low not in named], length


def upstream_headers(headers: list[tuple[str, str]], client: str | None, scheme: str, host: str | None,
                     sub: str | None, request_id: str) -> list[tuple[str, str]]:
    """What the function sees: end-to-end headers without credentials, ``X-Forwarded-*`` with the platform's
    values appended to whatever the client claimed, ``X-Sless-Sub`` only when the platform verified it, and
    the call's ``X-Request-Id`` (the one the platform accepted or made, never a second one)."""
    named = connection_named(headers) if any(k.lower() == "connection" for k, _ in headers) else ()
    kept: list[tuple[str, str]] = []
    claimed: dict[str, list[str]] | None = None
    for k, v in headers:
        low = k.lower()
        if low in _NOT_UPSTREAM or low in named:
            continue
        if low in FORWARDED:
            if claimed is None:
                claimed = {}
            claimed.setdefault(low, []).append(v)
        else:
            kept.append((k, v))
    for name, title, own in (("x-forwarded-for", "X-Forwarded-For", client),
                             ("x-forwarded-proto", "X-Forwarded-Proto", scheme),
                             ("x-forwarded-host", "X-Forwarded-Host", host)):
        values = claimed.get(name, []) if claimed is not None else []
        if own:
            values.append(own)
        if values:
            kept.append((title, ", ".join(values)))
    if sub is not None:
        kept.append(("X-Sless-Sub", sub))
    kept.append(("X-Request-Id", request_id))
    return kept


_NOT_UPSTREAM_RAW = frozenset(name.encode() for name in _NOT_UPSTREAM)
_FORWARDED_RAW = {name.encode(): (name.title().encode(), index) for index, name in enumerate(FORWARDED)}
_LINE_BREAKING = re.compile(b"[\r\n\0]")


def upstream_lines(headers: list[tuple[bytes, bytes]], client: str | None, scheme: str, sub: str | None,
                   request_id: str) -> bytes:
    """``upstream_headers`` of an ASGI head (lower-case names, raw values), as the header lines of the runtime's
    request, made in one pass without decoding. UpstreamBroken when a value would break its line."""
    named: frozenset[bytes] | set[bytes] = frozenset()
    if any(k == b"connection" for k, _ in headers):
        named = {t.strip().lower() for k, v in headers if k == b"connection" for t in v.split(b",")}
    parts: list[bytes] = []
    claimed: list[list[bytes]] | None = None
    host: bytes | None = None
    for k, v in headers:
        if k in _NOT_UPSTREAM_RAW or k in named:
            if k == b"host" and host is None:
                host = v
            continue
        forwarded = _FORWARDED_RAW.get(k)
        if forwarded is not None:
            if claimed is None:
                claimed = [[], [], []]
            claimed[forwarded[1]].append(v)
            continue
        parts += (k, b": ", v, b"\r\n")
    own = (client.encode("latin-1") if client else None, scheme.encode("latin-1") if scheme else None, host)
    for title, index in _FORWARDED_RAW.values():
        values = claimed[index] if claimed is not None else []
        mine = own[index]
        if mine:
            values.append(mine)
        if values:
            parts += (title, b": ", b", ".join(values), b"\r\n")
    if sub is not None:
        parts += (b"X-Sless-Sub", b": ", sub.encode("latin-1"), b"\r\n")
    parts += (b"X-Request-Id", b": ", request_id.encode("latin-1"), b"\r\n")
    # Lines of four parts each: the values are every fourth (the names came through the server's parser).
    if _LINE_BREAKING.search(b"".join(parts[2::4])):
        raise UpstreamBroken("request not sent: a line break or NUL in a header")
    return b"".join(parts)


#: Request headers that change how a call is handled; the rest are only passed on.
_NOTABLE = frozenset({b"content-length", b"transfer-encoding", b"prefer", b"x-sless-async", CALLBACK_HEADER.encode()})


def scan_request_head(headers: list[tuple[bytes, bytes]]) -> tuple[str | None, bool, bool]:
    """One look at a request head: its declared Content-Length, whether it has a body at all (a Content-Length or
    a Transfer-Encoding), and whether it asks for more than a plain call (an async wish, a callback)."""
    declared, framed, asks = None, False, False
    for k, v in headers:
        if k in _NOTABLE:
            if k == b"content-length":
                framed = True
                if declared is None:
                    declared = v.decode("latin-1")
            elif k == b"transfer-encoding":
                framed = True
            else:
                asks = True
    return declared, framed, asks


def wants_async(headers: list[tuple[str, str]]) -> bool:
    """`Prefer: respond-async` (RFC 7240, among other preferences) or `X-Sless-Async: 1`."""
    for key, value in headers:
        name = key.lower()
        if name == "prefer" and any(p.split(";", 1)[0].strip().lower() == "respond-async" for p in value.split(",")):
            return True
        if name == "x-sless-async" and value.strip() in ("1", "true"):
            return True
    return False
