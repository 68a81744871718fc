"""A list of change listeners: how a backend tells its cron scheduler and event dispatcher that triggers changed.

The listeners subscribe themselves (:class:`~sless_api.domain.ports.ChangeFeed`), so nothing outside a
backend ever sets an attribute on it to be told.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("sless.changes")


class ChangeListeners:
    """Listeners called in order on each change; one that raises is logged and the others still run."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def notify(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # the change itself is done: a listener's failure must not undo it
                log.exception("a change listener failed")
