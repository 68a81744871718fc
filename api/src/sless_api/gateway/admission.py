"""Concurrency limits at the invoke proxy: a function's ``max_concurrency`` and the tenant's, with a short queue.

A call beyond a limit waits while at most ``queue_max`` others wait and for at most
``queue_wait_sec``; then it is refused with 429 and ``Retry-After``, before the function sees it. Limits count the
calls of this API process: `sless up` is one process, `sless-api` runs ``SLESS_WORKERS`` per replica, so there the
bound is per worker (as Knative's containerConcurrency is per pod).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


class Throttled(Exception):
    """The call was refused for a limit; ``retry_after`` (s) says when trying again makes sense."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


@dataclass
class _Gate:
    limit: int
    running: int = 0
    waiting: int = 0
    freed: asyncio.Condition = field(default_factory=asyncio.Condition)


class Admission:
    """Per-function and per-tenant gates; the gate of a key lives while calls use it."""

    def __init__(self, tenant_limit: int = 0, queue_max: int = 100, queue_wait_sec: float = 10.0) -> None:
        self.tenant_limit = tenant_limit
        self.queue_max = queue_max
        self.queue_wait_sec = queue_wait_sec
        self._gates: dict[tuple[str, ...], _Gate] = {}

    def admit(self, namespace: str, function: str, function_limit: int) -> contextlib.AbstractAsyncContextManager[None]:
        """Hold a slot of the tenant's gate and of the function's for the call's length (429 when refused).

        Without any limit (the default) there is nothing to hold: a shared no-op context, since this is on every
        proxied call's path and the gates' bookkeeping costs several microseconds.
        """
        if self.tenant_limit <= 0 and function_limit <= 0:
            return _UNLIMITED
        return self._admit(namespace, function, function_limit)

    @contextlib.asynccontextmanager
    async def _admit(self, namespace: str, function: str, function_limit: int) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if self.tenant_limit > 0:
                busy = f"the tenant has its {self.tenant_limit} calls in flight"
                await stack.enter_async_context(self._slot(("tenant", namespace), self.tenant_limit, busy))
            if function_limit > 0:
                busy = f"{function} has its max_concurrency of {function_limit} calls in flight"
                await stack.enter_async_context(self._slot(("function", namespace, function), function_limit, busy))
            yield

    @contextlib.asynccontextmanager
    async def _slot(self, key: tuple[str, ...], limit: int, busy: str) -> AsyncIterator[None]:
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = _Gate(limit)
        gate.limit = limit  # a changed max_concurrency applies to the next call
        try:
            if gate.running >= gate.limit:
                await self._wait(gate, busy)
            gate.running += 1
            try:
                yield
            finally:
                gate.running -= 1
                async with gate.freed:
                    gate.freed.notify()
        finally:
            if gate.running == 0 and gate.waiting == 0:
                self._gates.pop(key, None)

    async def _wait(self, gate: _Gate, busy: str) -> None:
        retry_after = max(1, math.ceil(self.queue_wait_sec))
        if gate.waiting >= self.queue_max:
            raise Throttled(f"{busy} and {gate.waiting} waiting", retry_after)
        gate.waiting += 1
        try:
            async with gate.freed:
                await asyncio.wait_for(gate.freed.wait_for(lambda: gate.running < gate.limit), self.queue_wait_sec)
        except TimeoutError:
            raise Throttled(f"{busy}; waited {self.queue_wait_sec:g}s for a slot", retry_after) from None
        finally:
            gate.waiting -= 1


_UNLIMITED: contextlib.AbstractAsyncContextManager[None] = contextlib.nullcontext()
