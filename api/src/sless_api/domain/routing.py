"""Where a call goes: a function's route (read on every call, so answered from memory) and a traffic split's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sless_api.domain.httppolicy import HttpPolicy
from sless_core.traffic import WeightedRoundRobin

if TYPE_CHECKING:
    from sless_api.domain.httppaths import PathTable


@dataclass(frozen=True)
class Route:
    """Where and how the proxy may call a function; resolved without a backend round trip per call."""

    namespace: str
    function: str
    timeout_sec: float
    auth: str  # "public" or "token"
    max_concurrency: int = 0  # the function's own limit of calls in flight through /fn; 0: none
    #: the version that serves calls of this route (recorded with each call); None: not known
    version: int | None = None
    #: the backend's name of the upstream when it is not the function's own (a split's other version)
    target: str = ""
    #: the function scales with demand and may be at zero replicas: a call waits for a ready pod (``scale``)
    scaled: bool = False
    #: calls one pod takes at once from this process (a scaled function's max_concurrency; then
    #: ``max_concurrency`` is 0, as the limit follows the pods); 0: none
    pod_concurrency: int = 0
    #: the http trigger's methods and CORS settings; None: every method, no CORS (nothing to check per call)
    policy: HttpPolicy | None = None
    #: a traffic split: each call takes one of its routes (``served``); None: this route serves every call
    split: RouteSplit | None = field(default=None, compare=False, repr=False)
    #: the path patterns of the function's http triggers (``httppaths``); None: none has one, and ``auth`` and
    #: ``policy`` govern every path
    paths: PathTable | None = None

    def served(self) -> Route:
        """The route one call takes: under a split, the version the round robin picks next."""
        return self if self.split is None else self.split.pick()

    def at(self, tail: str) -> tuple[Route, str | None] | None:
        """The route of a call to TAIL below the function's URL, with the matched pattern's parameters (JSON) for
        the runtime; None when no trigger serves that path. Raises ``httppaths.DotSegment``."""
        if self.paths is None:
            return self, None
        found = self.paths.match(tail)
        if found is None:
            return (self, None) if self.paths.fallback else None
        return dataclasses.replace(self, auth=found.auth, policy=found.policy), found.params


class RouteSplit:
    """The routes of a split's versions and the deterministic round robin that shares calls among them."""

    def __init__(self, choices: list[tuple[Route, int]]) -> None:
        self.routes = {route.version: route for route, _ in choices}
        self._robin = WeightedRoundRobin((route.version or 0, weight) for route, weight in choices)

    def pick(self) -> Route:
        return self.routes[self._robin.pick()]


@dataclass(frozen=True)
class CallRef:
    """Which call's output to read: its request id and when it ran (epoch seconds)."""

    request_id: str
    started_at: float
    duration_sec: float
