"""A record's row: a plain record (every value already what its column takes) goes through as it is, and one odd
value anywhere sends the record through the field-by-field sanitizing (the fast check may never let one pass)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sless_api.stores.invocations.model import MAX_ERROR_CHARS, MAX_PATH_CHARS, Invocation, sanitized_row

PLAIN = Invocation("sless-0123456789abcdef", "hello", "GET", "/a/b", 200, 1.25, 0, 2, "http", None, 1.7e9,
                   "0123456789abcdef0123456789abcdef", False, 0.01, 0.0, 0.5, 3, 2)


def test_a_plain_record_is_its_row() -> None:
    fields = dataclasses.astuple(PLAIN)[:-2]  # all but the output (a column of its own) and the store's id
    assert sanitized_row(PLAIN) == fields


@pytest.mark.parametrize(("field", "odd", "stored"), [
    ("path", "/a\x00b", "/ab"),
    ("path", "/" * (MAX_PATH_CHARS + 5), "/" * MAX_PATH_CHARS),
    ("error", "e" * (MAX_ERROR_CHARS + 1), "e" * MAX_ERROR_CHARS),
    ("function", "fn\x00", "fn"),
    ("method", "M" * 40, "M" * 16),
    ("request_id", "r" * 200, "r" * 128),
    ("status", True, 1),
    ("status", 10**30, 2**31 - 1),
    ("duration_ms", float("nan"), 0.0),
    ("duration_ms", float("inf"), 0.0),
    ("duration_ms", 7, 7.0),
    ("request_bytes", -5, 0),
    ("started_at", -1.0, 0.0),
    ("cold", 1, True),
    ("queue_ms", float("nan"), 0.0),
    ("version", -1, 0),
    ("attempt", -1, 0),
    ("attempt", "2", 2),
])
def test_one_odd_value_is_sanitized(field: str, odd: Any, stored: Any) -> None:
    row = sanitized_row(dataclasses.replace(PLAIN, **{field: odd}))
    index = [f.name for f in dataclasses.fields(Invocation)].index(field)
    assert row[index] == stored and type(row[index]) is type(stored)
    assert row[:index] + row[index + 1:] == sanitized_row(PLAIN)[:index] + sanitized_row(PLAIN)[index + 1:]
