"""Request ids: the caller's ``X-Request-Id`` when it is a sane token, else a new one.

A client's id is kept so a call can be followed from the client's own logs through the platform into
the function; anything else (too long, spaces, control characters, several values) is replaced, because
the id is written to logs, headers and the invocation record and must not carry an injection.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, MutableMapping
from typing import Any

HEADER = "x-request-id"
_SANE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}")
#: Where the id of the call lives in its ASGI scope, for the proxy and the REST resources.
SCOPE_KEY = "sless.request_id"


def new_request_id() -> str:
    """32 random hex digits: the look of a uuid4's hex, without building a UUID on every call's path.

    From the process's Mersenne Twister rather than ``os.urandom``, a system call on every call's path: an id
    correlates log lines and records, it guards nothing, so it needs to be unique, not unpredictable (``random``
    reseeds itself in a forked child, so forked workers never share a sequence).
    """
    return f"{_bits(128):032x}"


_bits = random.getrandbits


def is_request_id(value: str) -> bool:
    """An id the platform would accept from a caller (or has made)."""
    return _SANE.fullmatch(value) is not None


def accept_or_new(values: Iterable[str]) -> str:
    """The caller's id when exactly one sane value was sent, else a fresh one."""
    sent = list(values)
    if len(sent) == 1 and _SANE.fullmatch(sent[0]):
        return sent[0]
    return new_request_id()


def accept_or_new_raw(headers: list[tuple[bytes, bytes]]) -> str:
    """``accept_or_new`` of an ASGI head's ``x-request-id`` values (names in lower case, as servers give them): the
    invoke proxy's form, for every call, without a generator to decode values most calls do not send."""
    sent = [v for k, v in headers if k == _RAW_HEADER]
    if not sent:
        return new_request_id()
    return accept_or_new(v.decode("latin-1") for v in sent)


_RAW_HEADER = HEADER.encode()


def scope_request_id(scope: MutableMapping[str, Any]) -> str:
    """The id the access-log middleware gave this call (a fresh one if it did not run, as in unit tests)."""
    found = scope.get(SCOPE_KEY)
    if isinstance(found, str):
        return found
    made = accept_or_new(v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == HEADER.encode())
    scope[SCOPE_KEY] = made
    return made
