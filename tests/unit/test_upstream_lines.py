"""The bytes form of what a function is sent (`proxy.upstream_lines`, the plain call's path) is the decoded form's
(`proxy.upstream_headers`, used for token triggers, async calls and WebSockets), line for line."""

from __future__ import annotations

import pytest

from sless_api.gateway.headers import upstream_headers, upstream_lines
from sless_api.gateway.upstream import UpstreamBroken

HEADS: list[list[tuple[bytes, bytes]]] = [
    [(b"host", b"api.example:8080"), (b"user-agent", b"wrk")],
    [(b"host", b"h"), (b"accept", b"*/*"), (b"x-custom", b"a, b"), (b"x-custom", b"c")],
    # credentials, platform-owned and hop-by-hop headers never reach the function
    [(b"host", b"h"), (b"authorization", b"Bearer t"), (b"cookie", b"s=1"), (b"x-sless-sub", b"forged"),
     (b"x-request-id", b"theirs"), (b"keep-alive", b"timeout=5"), (b"te", b"trailers"), (b"upgrade", b"h2c"),
     (b"x-sless-callback-url", b"http://x/"), (b"proxy-authorization", b"Basic x"), (b"accept", b"a")],
    # fields named by Connection are this hop's only
    [(b"host", b"h"), (b"connection", b"keep-alive, X-Secret"), (b"x-secret", b"s"), (b"x-kept", b"k")],
    # X-Forwarded-* claims come first, the platform's own values after them
    [(b"x-forwarded-for", b"1.2.3.4"), (b"host", b"h"), (b"x-forwarded-for", b"5.6.7.8"),
     (b"x-forwarded-proto", b"https"), (b"x-forwarded-host", b"claimed")],
    [],  # no Host at all (HTTP/1.0)
    [(b"host", b"h\xe9"), (b"x-latin", b"caf\xe9")],  # latin-1 bytes pass unchanged
]


def as_lines(headers: list[tuple[str, str]]) -> bytes:
    return b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers)


@pytest.mark.parametrize("raw", HEADS)
@pytest.mark.parametrize(("client", "scheme", "sub"), [("10.0.0.9", "http", None), (None, "https", "user-1"),
                                                       ("10.0.0.9", "", None)])
def test_the_raw_lines_are_the_decoded_headers_lines(raw: list[tuple[bytes, bytes]], client: str | None,
                                                     scheme: str, sub: str | None) -> None:
    decoded = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw]
    host = next((v for k, v in decoded if k == "host"), None)
    expected = as_lines(upstream_headers(decoded, client, scheme, host, sub, "rid-1"))
    assert upstream_lines(raw, client, scheme, sub, "rid-1") == expected


@pytest.mark.parametrize("value", [b"a\r\nX-Injected: 1", b"a\nb", b"a\x00b"])
def test_a_value_that_would_break_its_line_is_refused(value: bytes) -> None:
    with pytest.raises(UpstreamBroken):
        upstream_lines([(b"host", b"h"), (b"x-a", value)], "10.0.0.9", "http", None, "rid-1")
    with pytest.raises(UpstreamBroken):
        upstream_lines([(b"host", value)], "10.0.0.9", "http", None, "rid-1")  # it would go on as X-Forwarded-Host
