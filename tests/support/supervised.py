"""Helpers of the supervisor's integration tests: a fresh supervisor per scenario, checked to leave no child
process behind, and the small async probes its scenarios use."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from sless_api.backends.standalone.host.supervisor import Supervisor
from tests.support.services import children_of

T = TypeVar("T")

# s between looks of a scenario's waits (poll.until_async): a supervisor acts in milliseconds
POLL = 0.02


def child_pids() -> set[int]:
    """Live or unreaped children of this test process."""
    return children_of(os.getpid())


def run_scenario(
    tmp_path: Path, scenario: Callable[[Supervisor], Awaitable[T]], timeout: float = 180.0, **options: Any
) -> T:
    """Run ``scenario`` with a fresh supervisor (``options`` are its own); close it and check no child process
    survives."""
    before = child_pids()

    async def main() -> T:
        sup = Supervisor(log_dir=tmp_path / "logs", **options)
        try:
            return await asyncio.wait_for(scenario(sup), timeout)
        finally:
            await sup.close()

    result = asyncio.run(main())
    assert child_pids() - before == set(), "runtime processes survived Supervisor.close()"
    return result


async def get(session: aiohttp.ClientSession, base_url: str, **query: str) -> dict[str, Any]:
    async with session.get(base_url + "/", params=query) as response:
        text = await response.text()
        assert response.status == 200, f"{response.status}: {text}"
        body: dict[str, Any] = await response.json()
        return body
