"""The one error type validation raises, so callers map it to a 400 (API) or a PermanentError (operator)."""

from __future__ import annotations


class ValidationError(ValueError):
    """Bad user input; ``field`` names what was wrong so the API can say it back."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def as_dict(self) -> dict[str, str]:
        body = {"error": self.message}
        if self.field:
            body["field"] = self.field
        return body
