"""Parse a JSON request body into values every later step can handle.

``json.loads`` accepts documents that fail much later, far from the input, as a 500: nesting deep enough
to exhaust the interpreter's recursion (or any later recursive walk), ``NaN``/``Infinity``, integers
with thousands of digits, and ``"\\ud800"`` escapes that decode to lone surrogates no UTF-8 encoder,
database or file name accepts. They are refused here, with a message, before any resource sees them.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 32
MAX_INT_DIGITS = 30


class JsonShapeError(ValueError):
    """The body is not a JSON document this API accepts; the message is safe to return."""


def _no_constants(name: str) -> Any:
    raise JsonShapeError(f"JSON constant {name} is not accepted")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise JsonShapeError(f"JSON integer longer than {MAX_INT_DIGITS} digits")
    return int(text)


def parse_json(data: bytes) -> Any:
    """The document in DATA, or JsonShapeError saying what is wrong with it."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise JsonShapeError("the request body is not UTF-8") from None
    try:
        value = json.loads(text, parse_constant=_no_constants, parse_int=_bounded_int)
    except RecursionError:
        raise JsonShapeError(f"JSON nesting deeper than {MAX_DEPTH} levels") from None
    except JsonShapeError:
        raise
    except ValueError:
        raise JsonShapeError("the request body is not valid JSON") from None
    check_shape(value)
    return value


def check_shape(value: Any) -> None:
    """Depth and string checks without recursion (the walk itself must not be the thing that overflows)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise JsonShapeError(f"JSON nesting deeper than {MAX_DEPTH} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    _check_text(key)
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)


def is_utf8_text(value: str) -> bool:
    """False for a string holding lone surrogates (what ``"\\udc80"`` escapes in JSON, and so in a JWT,
    decode to): no UTF-8 encoder (hashes, databases, logs, headers to functions) accepts them."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_text(text: str) -> None:
    if not is_utf8_text(text):
        raise JsonShapeError("JSON string holds a lone surrogate (\\ud800-\\udfff escape)")
