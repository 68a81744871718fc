"""An http trigger's rules for its URL: the path pattern it serves, which methods reach the function, and its
CORS settings.

Validated here, where the API, the operator and the custom resources' codec all read triggers, so a Trigger
written with kubectl obeys the same bounds as one created through the API. What the proxy does with them is
``sless_api.domain.httppolicy``.
"""

from __future__ import annotations

import re
from typing import Any

from sless_core.errors import ValidationError

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
#: An origin as browsers send it: scheme, host and an optional port, nothing else (no path, no wildcard part).
ORIGIN = re.compile(r"^https?://[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?(:[0-9]{1,5})?\Z")
HEADER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}\Z")
MAX_ORIGINS = 50
MAX_HEADERS = 50
MAX_AGE_SEC = 86_400  # browsers cap a preflight's cache at a day or less
DEFAULT_MAX_AGE_SEC = 600
CORS_FIELDS = frozenset({"origins", "methods", "headers", "credentials", "max_age"})
#: A path pattern's literal segment: unreserved characters only (RFC 3986), so it is spelled one way.
PATH_LITERAL = re.compile(r"^[A-Za-z0-9._~-]{1,100}\Z")
#: A path pattern's parameter segment: ``{name}``, the name as in a Python or JavaScript identifier, lower case.
PATH_PARAM = re.compile(r"^\{([a-z_][a-z0-9_]{0,31})\}\Z")
MAX_PATH_SEGMENTS = 16
MAX_PATH_CHARS = 400


def validate_path(value: object) -> str:
    """An http trigger's path pattern below its function's URL: ``/`` or ``/seg/{param}/...``, each segment
    a literal of unreserved characters or one ``{name}`` parameter (at most 16 segments, names distinct), no
    trailing ``/``; ``.`` and ``..`` are not segments."""
    why = ("path must be / or /segment/{param}/...: segments of A-Z a-z 0-9 . _ ~ - or a {name} parameter "
           f"(a-z 0-9 _), at most {MAX_PATH_SEGMENTS} segments and {MAX_PATH_CHARS} characters")
    if not isinstance(value, str) or not value.startswith("/") or len(value) > MAX_PATH_CHARS:
        raise ValidationError(why, field="path")
    if value == "/":
        return value
    segments = value[1:].split("/")
    if len(segments) > MAX_PATH_SEGMENTS:
        raise ValidationError(why, field="path")
    names: list[str] = []
    for segment in segments:
        param = PATH_PARAM.match(segment)
        if param is not None:
            names.append(param.group(1))
        elif not PATH_LITERAL.match(segment) or segment in (".", ".."):
            raise ValidationError(why, field="path")
    if len(set(names)) != len(names):
        raise ValidationError("path names a parameter twice", field="path")
    return value


def path_segments(path: str) -> list[str]:
    """A valid pattern's segments (``/`` has none)."""
    return [] if path == "/" else path[1:].split("/")


def path_shape(path: str | None) -> tuple[str | None, ...] | None:
    """What two patterns must share to serve the same URLs: their literals, None where a parameter is; None for a
    trigger without a path (it serves every path no pattern of its function serves)."""
    if path is None:
        return None
    return tuple(None if PATH_PARAM.match(s) else s for s in path_segments(path))


def validate_methods(value: object, field: str = "methods") -> list[str]:
    """1-7 distinct HTTP methods, upper case, in the canonical order."""
    if not isinstance(value, list) or not value or len(value) > len(METHODS):
        raise ValidationError(f"{field} must be a list of 1-{len(METHODS)} of {', '.join(METHODS)}", field=field)
    if any(not isinstance(m, str) or m.upper() not in METHODS for m in value):
        raise ValidationError(f"{field} must be among {', '.join(METHODS)}", field=field)
    chosen = {m.upper() for m in value}
    if len(chosen) != len(value):
        raise ValidationError(f"{field} lists a method twice", field=field)
    return [m for m in METHODS if m in chosen]


def _names(value: object, field: str, pattern: re.Pattern[str], bound: int, what: str) -> list[str]:
    if not isinstance(value, list) or len(value) > bound or any(not isinstance(v, str) or not pattern.match(v)
                                                                 for v in value):
        raise ValidationError(f"{field} must be a list of at most {bound} {what}", field=field)
    if len(set(value)) != len(value):
        raise ValidationError(f"{field} lists a value twice", field=field)
    return list(value)


def validate_cors(value: object) -> dict[str, Any]:
    """The CORS settings, with their defaults filled in: ``origins`` (required: exact origins, or ``["*"]``),
    ``methods`` (default: the simple ones the trigger allows), ``headers`` a preflight may ask for, ``credentials``
    (cookies and Authorization; never with ``*``) and ``max_age`` (seconds a browser keeps a preflight's answer)."""
    if not isinstance(value, dict):
        raise ValidationError("cors must be an object with origins and optionally methods, headers, credentials, "
                              "max_age", field="cors")
    unknown = sorted(set(value) - CORS_FIELDS)
    if unknown:
        raise ValidationError(f"unknown field cors.{unknown[0]}", field=f"cors.{unknown[0]}")
    origins = value.get("origins")
    if origins == ["*"]:
        chosen_origins = ["*"]
    else:
        chosen_origins = _names(origins, "cors.origins", ORIGIN, MAX_ORIGINS,
                                "origins such as https://app.example.com (or just [\"*\"])")
        if not chosen_origins:
            raise ValidationError("cors.origins needs at least one origin", field="cors.origins")
    methods = validate_methods(value["methods"], "cors.methods") if "methods" in value else ["GET", "HEAD", "POST"]
    headers = [h.lower() for h in _names(value.get("headers", []), "cors.headers", HEADER_NAME, MAX_HEADERS,
                                          "header names")]
    credentials = value.get("credentials", False)
    if not isinstance(credentials, bool):
        raise ValidationError("cors.credentials must be true or false", field="cors.credentials")
    if credentials and chosen_origins == ["*"]:
        raise ValidationError("cors.credentials needs the origins listed: browsers refuse credentials with \"*\"",
                              field="cors.credentials")
    max_age = value.get("max_age", DEFAULT_MAX_AGE_SEC)
    if not isinstance(max_age, int) or isinstance(max_age, bool) or not 0 <= max_age <= MAX_AGE_SEC:
        raise ValidationError(f"cors.max_age must be 0-{MAX_AGE_SEC} seconds", field="cors.max_age")
    return {"origins": chosen_origins, "methods": methods, "headers": headers, "credentials": credentials,
            "max_age": max_age}
