"""Which of a function's http triggers serves a call's path: their path patterns, matched from memory per call.

A trigger with a ``path`` (``/users/{id}``) serves that pattern below the function's URL with its own auth,
methods and CORS; a trigger without one serves every other path (as a function's only http trigger always did).
Where two patterns both match a path, the one with a literal at the first segment where they differ wins
(``/users/me`` before ``/users/{id}``); patterns of the same shape are refused at creation by the API, and
custom resources written with the same shape anyway share one rule, the strictest of theirs (deny by default).

Paths are matched percent-decoded, segment by segment, so ``/%75sers/1`` is ``/users/1``: a spelling cannot
walk around a pattern's token to a public fallback when the function decodes its path. A path with a ``.`` or
``..`` segment (in any spelling) is refused when the function has patterns, for the same reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from sless_api.domain.httppolicy import HttpPolicy, route_auth, route_policy
from sless_core.httproutes import PATH_PARAM, path_segments, path_shape

#: The request header that carries a matched pattern's parameters to the runtime (its event's ``_params``); the
#: platform's alone: a caller's own copy never reaches a function.
PARAMS_HEADER = "x-sless-params"


@dataclass(frozen=True)
class HttpRule:
    """What routing needs of one enabled http trigger."""

    path: str | None
    auth: str
    methods: Sequence[str] | None = None
    cors: dict[str, Any] | None = None


@dataclass(frozen=True)
class PathRule:
    """One path shape's auth and policy (its triggers' strictest), and where its parameters are."""

    shape: tuple[str | None, ...]  # literals; None where a parameter is
    names: tuple[str, ...]  # the parameters' names, in order (of the first trigger of this shape)
    auth: str
    policy: HttpPolicy | None

    def match(self, segments: Sequence[str]) -> dict[str, str] | None:
        if len(segments) != len(self.shape):
            return None
        params: list[str] = []
        for want, got in zip(self.shape, segments, strict=True):
            if want is None:
                if not got:
                    return None
                params.append(got)
            elif want != got:
                return None
        return dict(zip(self.names, params, strict=True))


@dataclass(frozen=True)
class PathMatch:
    """The rule that serves a call's path: its auth, policy and the parameters' JSON for the runtime."""

    auth: str
    policy: HttpPolicy | None
    params: str  # compact JSON, ASCII only (a header's value)


class DotSegment(ValueError):
    """A path with a ``.`` or ``..`` segment, to a function whose triggers have path patterns."""


@dataclass(frozen=True)
class PathTable:
    """The path patterns of one function, most specific first; ``fallback`` when a trigger without a path
    serves the paths none of them matches (then the route's own auth and policy apply)."""

    rules: tuple[PathRule, ...]
    fallback: bool

    def match(self, tail: str) -> PathMatch | None:
        """The rule serving TAIL (the raw path below the function's URL); None: no pattern matches it (the
        fallback trigger serves it, if there is one). DotSegment for ``.`` or ``..`` in any spelling."""
        stripped = tail.strip("/")
        segments = [unquote(s, errors="replace") for s in stripped.split("/")] if stripped else []
        if any(s in (".", "..") for s in segments):
            raise DotSegment(tail)
        for rule in self.rules:
            params = rule.match(segments)
            if params is not None:
                return PathMatch(rule.auth, rule.policy, json.dumps(params, separators=(",", ":")))
        return None


def _precedence(shape: tuple[str | None, ...]) -> tuple[tuple[int, str], ...]:
    """Sort key: at the first segment where two shapes differ, a literal before a parameter."""
    return tuple((1, "") if s is None else (0, s) for s in shape)


def path_table(rules: Iterable[HttpRule]) -> PathTable | None:
    """The path table of a function's enabled http triggers; None when none has a path (the fast path)."""
    given = list(rules)
    shapes: dict[tuple[str | None, ...], list[HttpRule]] = {}
    for rule in given:
        shape = path_shape(rule.path)
        if shape is not None:
            shapes.setdefault(shape, []).append(rule)
    if not shapes:
        return None
    table = []
    for shape, same in sorted(shapes.items(), key=lambda item: _precedence(item[0])):
        first = same[0].path or "/"
        names = tuple(m.group(1) for s in path_segments(first) if (m := PATH_PARAM.match(s)) is not None)
        table.append(PathRule(shape, names, route_auth(r.auth for r in same),
                              route_policy((r.methods, r.cors) for r in same)))
    return PathTable(tuple(table), fallback=any(r.path is None for r in given))


def route_rules(rules: Iterable[HttpRule]) -> tuple[str, HttpPolicy | None, PathTable | None]:
    """``(auth, policy, paths)`` of a function's route from its enabled http triggers: the auth and policy of
    those without a path (the paths no pattern serves; ``token`` when there is none, though no call then gets
    that far), and the path table of those with one."""
    given = list(rules)
    fallback = [r for r in given if r.path is None]
    return (route_auth(r.auth for r in fallback), route_policy((r.methods, r.cors) for r in fallback),
            path_table(given))
