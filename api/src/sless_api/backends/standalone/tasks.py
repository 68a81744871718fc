"""The standalone backend's background work (builds, job runs), one task per key.

A new task under a key cancels the one it replaces (a new upload supersedes a build in progress), and
close cancels every one, so a stop never leaves a build writing into a closed state database.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class TaskSet:
    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def spawn(self, key: str, coro: Coroutine[Any, Any, None]) -> None:
        old = self._tasks.get(key)
        if old is not None and not old.done():
            old.cancel()
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._tasks[key] = task
        task.add_done_callback(lambda t: self._tasks.pop(key, None) if self._tasks.get(key) is t else None)

    def cancel(self, key: str) -> None:
        task = self._tasks.get(key)
        if task is not None:
            task.cancel()

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
