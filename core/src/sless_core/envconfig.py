"""Typed reads of configuration variables, shared by the API's and the operator's one parser each.

Both processes read their whole configuration once at start-up; a bad value stops the process there with
one line naming the variable, instead of surfacing later as a failed call or a broken Job. Empty values
count as unset, so a chart can pass ``""`` for "the default".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


class ConfigError(ValueError):
    """A configuration variable holds a value the process cannot use (the message names the variable)."""


class EnvReader:
    """Typed getters over one environment mapping; every error names the variable and the value given."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env

    def raw(self, name: str) -> str | None:
        """The stripped value, or None when unset or blank."""
        value = self.env.get(name)
        return None if value is None or value.strip() == "" else value.strip()

    def text(self, name: str, default: str, required: bool = False) -> str:
        value = self.raw(name)
        if value is None and required and not default:
            raise ConfigError(f"{name} is required")
        return default if value is None else value

    def optional(self, name: str) -> str | None:
        """The value, or None when unset: for settings whose absence means "off"."""
        return self.raw(name)

    def integer(self, name: str, default: int, low: int | None = None, high: int | None = None) -> int:
        raw = self.raw(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
        _check_range(name, value, low, high)
        return value

    def number(self, name: str, default: float, low: float | None = None, high: float | None = None) -> float:
        """A finite decimal number (seconds, ratios)."""
        raw = self.raw(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"{name} must be a number, got {raw!r}") from None
        if not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {raw!r}")
        _check_range(name, value, low, high)
        return value

    def boolean(self, name: str, default: bool) -> bool:
        raw = self.raw(name)
        if raw is None:
            return default
        if raw.lower() in TRUE:
            return True
        if raw.lower() in FALSE:
            return False
        raise ConfigError(f"{name} must be true or false, got {raw!r}")

    def choice(self, name: str, default: str, choices: Iterable[str]) -> str:
        """One of CHOICES (compared lower-case)."""
        allowed = tuple(choices)
        raw = self.raw(name)
        value = default if raw is None else raw.lower()
        if value not in allowed:
            raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {raw!r}")
        return value


def _check_range(name: str, value: float, low: float | None, high: float | None) -> None:
    if low is not None and high is not None and not low <= value <= high:
        raise ConfigError(f"{name} must be between {low:g} and {high:g}, got {value:g}")
    if low is not None and value < low:
        raise ConfigError(f"{name} must be at least {low:g}, got {value:g}")
    if high is not None and value > high:
        raise ConfigError(f"{name} must be at most {high:g}, got {value:g}")
