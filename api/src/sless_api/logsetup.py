"""One log line per event, as JSON, with the request id of the call it belongs to.

Log collectors (Loki, Elasticsearch, CloudWatch) parse JSON lines without a per-service grammar, and a
request id in every line joins the API's access log, the proxy's errors and the function's own output.
``SLESS_LOG_FORMAT`` is ``json``, ``text`` (the human format), or ``auto`` (the default: text on a terminal, JSON
otherwise, so a pod or a log file gets JSON and `sless up` in a shell stays readable); ``SLESS_LOG_LEVEL`` sets
the level.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sless_core.envconfig import ConfigError, EnvReader

#: The request id of the call being served, set by the access-log middleware for everything it awaits.
current_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("sless_request_id", default=None)

FORMATS = ("auto", "json", "text")
# LogRecord's own attributes: everything else on a record came from `extra=` and is logged as a field.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class RequestIdFilter(logging.Filter):
    """Stamps the current request id on every record, so any logger inside a call carries it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = current_request_id.get()
        return True


@functools.lru_cache(maxsize=4)
def _second(epoch: int) -> str:
    """``%Y-%m-%dT%H:%M:%S`` (UTC) of EPOCH, formatted once per second rather than once per line."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch))


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "msg", "request_id"?, ...extra fields, "exc"?}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line = json_head(record.created, record.levelname.lower(), record.name, record.getMessage(), record.process)
        for key, value in vars(record).items():
            if key not in _STANDARD and value is not None:
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def json_ts(created: float) -> str:
    """The ``ts`` of a JSON line: UTC to the millisecond (lines of the same millisecond share the string)."""
    whole = int(created)
    key = (whole, int((created - whole) * 1000))
    last = _last_ts.value  # one reference, read and replaced whole: threads that log at once never mix two
    if last[0] != key:
        last = _last_ts.value = (key, _second(whole) + f".{key[1]:03d}Z")
    return last[1]


class _LastTs:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: tuple[tuple[int, int], str] = ((-1, -1), "")


_last_ts = _LastTs()


def json_head(created: float, level: str, logger: str, msg: str, pid: int | None) -> dict[str, Any]:
    """The fields every JSON line starts with, in this order."""
    return {
        "ts": json_ts(created),
        "level": level,
        "logger": logger,
        "msg": msg,
        "pid": pid,  # tells gunicorn's workers apart
    }


def json_stream_handler(logger: logging.Logger) -> logging.StreamHandler[Any] | None:
    """The one handler an INFO line of ``logger`` reaches when logging is as ``configure_logging`` left it (the
    root's stream handler with the JSON format and the request id filter, nothing else on the way); else None.

    For a line per request (the access log), which then skips the LogRecord and the handler chain: the same
    line, a fraction of the time. Any other set-up (text format, extra handlers or filters) takes the usual way.
    """
    if logger.handlers or logger.filters or not logger.propagate or not logger.isEnabledFor(logging.INFO):
        return None
    root = logging.getLogger()
    if logger.parent is not root or root.filters or len(root.handlers) != 1:
        return None
    handler = root.handlers[0]
    if (type(handler) is not logging.StreamHandler or type(handler.formatter) is not JsonFormatter
            or handler.level > logging.INFO or len(handler.filters) != 1
            or type(handler.filters[0]) is not RequestIdFilter):
        return None
    return handler


class TextFormatter(logging.Formatter):
    """The terminal format, with the request id when there is one."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        request_id = getattr(record, "request_id", None)
        return f"{text} [{request_id}]" if request_id else text


@dataclass(frozen=True)
class LogSettings:
    """``SLESS_LOG_LEVEL`` and ``SLESS_LOG_FORMAT``, read once with the API's config."""

    level: str = "INFO"
    format: str = "auto"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LogSettings:
        reader = EnvReader(env)
        level = reader.text("SLESS_LOG_LEVEL", cls.level).upper()
        if not isinstance(logging.getLevelName(level), int):
            raise ConfigError(f"SLESS_LOG_LEVEL must be a log level (DEBUG, INFO, WARNING, ERROR), got {level!r}")
        return cls(level=level, format=reader.choice("SLESS_LOG_FORMAT", cls.format, FORMATS))


def log_format(settings: LogSettings) -> str:
    """``json`` or ``text``, as configured (``auto``: text when stderr is a terminal)."""
    if settings.format == "auto":
        return "text" if sys.stderr.isatty() else "json"
    return settings.format


def configure_logging(settings: LogSettings) -> None:
    """Route the root logger to stderr in the configured format; called once by each entry point."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format(settings) == "json" else TextFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.level)
    for noisy in ("aiormq", "aio_pika", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
