"""Build the invocation log from ``SLESS_DATABASE_URL``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sless_api.stores.invocations.log import InvocationLog
from sless_api.stores.invocations.postgres_sink import PostgresSink
from sless_api.stores.invocations.sink import Sink
from sless_api.stores.invocations.sqlite_sink import SqliteSink


def sqlite_path(url: str) -> Path:
    """The file of a ``sqlite:///relative/path`` or ``sqlite:////absolute/path`` URL
    (the SQLAlchemy convention: three slashes, then the path)."""
    if not url.startswith("sqlite:///"):
        raise ValueError(f"not a sqlite:/// URL: {url!r}")
    path = url.removeprefix("sqlite:///").split("?", 1)[0]
    if not path or path == ":memory:":
        raise ValueError("the invocation log needs a SQLite file, not an in-memory database")
    return Path(path)


def sink_from_url(url: str) -> Sink:
    """A sink for ``sqlite:///path`` or ``postgresql://...`` (``postgres://`` too)."""
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        return SqliteSink(sqlite_path(url))
    if scheme in ("postgresql", "postgres"):
        return PostgresSink(url)
    raise ValueError(f"unsupported database URL scheme {scheme!r} (use sqlite:/// or postgresql://)")


def log_from_url(url: str, **options: Any) -> InvocationLog:
    """An :class:`InvocationLog` over the sink URL picks; OPTIONS go to InvocationLog."""
    return InvocationLog(sink_from_url(url), **options)
