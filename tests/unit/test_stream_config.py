"""SLESS_PROXY_STREAM_MAX_SEC: the longest a call through /fn may last, a positive number of seconds."""

from __future__ import annotations

import pytest

from sless_api.main.config import ApiConfig


def test_default_and_value() -> None:
    assert ApiConfig.from_env({}, {"SLESS_DATA_DIR": "/tmp/x"}).stream_max_sec == 3600.0
    assert ApiConfig.from_env({"SLESS_PROXY_STREAM_MAX_SEC": "2.5"}, {"SLESS_DATA_DIR": "/tmp/x"}).stream_max_sec == 2.5


@pytest.mark.parametrize("value", ["0", "-1", "x", "nan"])
def test_bad_values_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match="SLESS_PROXY_STREAM_MAX_SEC"):
        ApiConfig.from_env({"SLESS_PROXY_STREAM_MAX_SEC": value}, {"SLESS_DATA_DIR": "/tmp/x"})
