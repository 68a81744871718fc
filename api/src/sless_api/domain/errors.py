"""The errors a backend reports: each maps to one HTTP status (``rest.http``), with details as JSON fields."""

from __future__ import annotations

from typing import Any


class PlatformError(Exception):
    """Base of the errors a backend reports; the API maps each to one status code."""

    status = 500
    #: seconds after which the same call may succeed (sent as ``Retry-After``); None: no advice
    retry_after: int | None = None

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class NotFound(PlatformError):
    status = 404


class Conflict(PlatformError):
    status = 409


class Unsupported(PlatformError):
    status = 422


class QuotaExceeded(PlatformError):
    """A create beyond the tenant's quota (its functions, triggers, jobs...): the tenant's limit, not the
    platform's failure. The details say which (``quota``), its ``limit``, what is ``used`` and ``requested``."""

    status = 403


class Unavailable(PlatformError):
    """The function exists but cannot serve now (it failed to start, it is building)."""

    status = 503


class NotActivated(Unavailable):
    """A function scaled to zero got no ready pod in time, or too many calls already wait for one."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class CallbackRefused(ValueError):
    """An async call's callback URL is malformed or points where the platform may not send requests."""
