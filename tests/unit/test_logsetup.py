"""Log lines: the format chosen by SLESS_LOG_FORMAT, JSON fields, and the request id on every line of a call."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from sless_api.logsetup import (
    JsonFormatter,
    LogSettings,
    RequestIdFilter,
    TextFormatter,
    current_request_id,
    log_format,
)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def chosen(env: dict[str, str]) -> str:
    return log_format(LogSettings.from_env(env))


def test_the_format_follows_the_setting_and_auto_follows_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    assert chosen({"SLESS_LOG_FORMAT": "json"}) == "json"
    assert chosen({"SLESS_LOG_FORMAT": " Text "}) == "text"
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert chosen({}) == chosen({"SLESS_LOG_FORMAT": "auto"}) == "text"
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert chosen({}) == "json"
    with pytest.raises(ValueError, match="SLESS_LOG_FORMAT must be one of auto, json, text"):
        chosen({"SLESS_LOG_FORMAT": "xml"})


def test_the_level_is_a_log_level() -> None:
    assert LogSettings.from_env({}).level == "INFO"
    assert LogSettings.from_env({"SLESS_LOG_LEVEL": " debug "}).level == "DEBUG"
    with pytest.raises(ValueError, match="SLESS_LOG_LEVEL must be a log level"):
        LogSettings.from_env({"SLESS_LOG_LEVEL": "LOUD"})


def record(message: str, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("sless.test", logging.WARNING, __file__, 1, message, (), None)
    for key, value in extra.items():
        setattr(made, key, value)
    RequestIdFilter().filter(made)
    return made


def test_a_json_line_has_the_fields_the_extras_and_the_call_s_request_id() -> None:
    token = current_request_id.set("rid-1")
    try:
        line = json.loads(JsonFormatter().format(record("a \"quoted\"\nline", status=200, path="/x")))
    finally:
        current_request_id.reset(token)
    assert (line["level"], line["logger"], line["msg"], line["request_id"]) == (
        "warning", "sless.test", "a \"quoted\"\nline", "rid-1")
    assert (line["status"], line["path"]) == (200, "/x") and line["ts"].endswith("Z") and isinstance(line["pid"], int)
    outside = json.loads(JsonFormatter().format(record("no call")))
    assert "request_id" not in outside


def test_text_lines_name_the_request_id_when_there_is_one() -> None:
    token = current_request_id.set("rid-2")
    try:
        assert TextFormatter().format(record("hello")).endswith("hello [rid-2]")
    finally:
        current_request_id.reset(token)
    assert TextFormatter().format(record("plain")).endswith("plain")
