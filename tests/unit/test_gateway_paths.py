"""The invoke path's per-call parsing: the target split from the path, the request id from the raw head."""

from __future__ import annotations

import pytest

from sless_api.gateway import pathguard
from sless_api.gateway.pathguard import InvokeTarget, split_invoke
from sless_api.gateway.requestid import accept_or_new_raw, is_request_id

NS = "sless-0123456789abcdef"


@pytest.mark.parametrize(("path", "tail"), [(f"/fn/{NS}/hello", "/"), (f"/fn/{NS}/hello/", "/"),
                                           (f"/fn/{NS}/hello/a/%2e%2e/b", "/a/%2e%2e/b")])
def test_a_valid_target_splits_the_same_the_first_and_the_second_time(path: str, tail: str) -> None:
    assert split_invoke(path) == split_invoke(path) == InvokeTarget(NS, "hello", tail)


@pytest.mark.parametrize("path", ["/fn/default/hello", f"/fn/{NS}/Hello", f"/fn/{NS}", "/fn/", f"/fn/{NS}/a_b"])
def test_an_invalid_target_is_refused_even_after_valid_ones(path: str) -> None:
    assert split_invoke(f"/fn/{NS}/hello") == InvokeTarget(NS, "hello", "/")
    assert split_invoke(path) is None
    assert split_invoke(path) is None


def test_the_remembered_valid_names_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pathguard, "_VALID_PAIRS_MAX", 3)
    pathguard._VALID_PAIRS.clear()
    for index in range(10):
        assert split_invoke(f"/fn/{NS}/f{index}") is not None
        assert len(pathguard._VALID_PAIRS) <= 3


def test_the_request_id_from_a_raw_head() -> None:
    assert accept_or_new_raw([(b"host", b"x"), (b"x-request-id", b"abc-1")]) == "abc-1"
    for head in ([], [(b"x-request-id", b"a b")], [(b"x-request-id", b"abc"), (b"x-request-id", b"abd")]):
        made = accept_or_new_raw(head)
        assert is_request_id(made) and len(made) == 32
