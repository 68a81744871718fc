"""The background service that runs asynchronous calls: claim a due call, invoke, settle, retry with backoff.

Runs inside every API process (the `sless up` process; each `sless-api` worker and replica), all sharing one
store, so the calls survive a restart and spread over replicas. An answer below 500 ends a call (a 4xx is the
function's answer, not a failure to retry); 5xx, timeouts and unreachable functions are retried up to
``max_retries`` times with doubling backoff, then the call is dead: its record, with the last error, is the
dead letter. A function deleted meanwhile makes the call dead at once. A call submitted with a callback URL has
its outcome POSTed there once it has ended (``callback.py``); a delivery its runner never got to is made by the
next runner that finds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from sless_api.domain.errors import PlatformError
from sless_api.gateway.invoker import Invoker
from sless_api.services.asynccalls.callback import CallbackSender, check_url
from sless_api.services.asynccalls.model import FINISHED, AsyncCall, CallState, new_call_id
from sless_api.services.asynccalls.settings import AsyncSettings
from sless_api.services.asynccalls.store import CallStore
from sless_api.services.events.dedup import owner_gone, process_owner

log = logging.getLogger("sless.async")
ORPHAN_CHECK_SEC = 15.0
PURGE_EVERY_SEC = 600.0
STALE_CALLBACK_SEC = 120.0  # longer than a delivery can take (attempts x timeout): its runner has stopped


class AsyncRunner:
    def __init__(self, store: CallStore, invoker: Invoker, settings: AsyncSettings) -> None:
        self.store = store
        self.invoker = invoker
        self.settings = settings
        self.owner = process_owner()
        self._wake = asyncio.Event()
        self._closing = asyncio.Event()
        self._slots = asyncio.Semaphore(settings.workers)
        self._tasks: set[asyncio.Task[None]] = set()
        self._attempts: dict[asyncio.Task[None], AsyncCall] = {}  # the calls being run, by the task running each
        self._loop_task: asyncio.Task[None] | None = None
        self.callbacks = CallbackSender(settings.callback_policy)

    # -- the API's side

    async def submit(self, namespace: str, function: str, method: str, path: str, headers: list[tuple[str, str]],
                     body: bytes, request_id: str, callback_url: str | None = None) -> str:
        """Store a call (durably, before the caller hears 202) and wake a runner; CallbackRefused (nothing stored)
        when CALLBACK_URL may not be called."""
        if callback_url is not None:
            await asyncio.to_thread(check_url, callback_url, self.settings.callback_policy)
        now = time.time()
        call = AsyncCall(id=new_call_id(), namespace=namespace, function=function, method=method, path=path,
                         headers=headers, body=body, request_id=request_id, created_at=now, next_attempt_at=now,
                         callback_url=callback_url, callback_state="pending" if callback_url else None)
        await asyncio.to_thread(self.store.add, call)
        self._wake.set()
        return call.id

    # -- the runner

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._run(), name="sless-async-runner")

    async def close(self, drain_sec: float = 10.0) -> None:
        """Stop claiming; calls in flight get DRAIN_SEC, then they are cut and given back to the store at once
        (queued, due now: another replica runs them without waiting for their lease to end)."""
        self._closing.set()
        if self._loop_task is not None:  # it may wait for a free slot: cancel rather than wait for a call to end
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=drain_sec)
            cut = [self._attempts[task] for task in pending if task in self._attempts]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await self._release(cut)
        await self.callbacks.close()
        await asyncio.to_thread(self.store.close)

    async def _run(self) -> None:
        last_orphans = last_purge = 0.0
        while not self._closing.is_set():
            now = time.monotonic()
            try:
                if now - last_orphans >= ORPHAN_CHECK_SEC:
                    last_orphans = now
                    requeued = await asyncio.to_thread(self.store.requeue_orphans, owner_gone)
                    if requeued:
                        log.info("queued %d call(s) again whose runner stopped", requeued)
                    for stale in await asyncio.to_thread(self.store.stale_callbacks,
                                                         time.time() - STALE_CALLBACK_SEC, 20):
                        self._track(asyncio.create_task(self._callback(stale), name=f"sless-callback-{stale.id}"))
                if now - last_purge >= PURGE_EVERY_SEC:
                    last_purge = now
                    await asyncio.to_thread(self.store.purge, time.time() - self.settings.retention_sec)
                await self._slots.acquire()
                call = await asyncio.to_thread(self.store.claim, self.owner, time.time(),
                                               time.time() + self.settings.lease_sec)
            except Exception:
                log.exception("async calls: the store failed; trying again shortly")
                call = None
            if call is None:
                self._slots.release()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self.settings.poll_sec)
                continue
            task = asyncio.create_task(self._attempt(call), name=f"sless-async-{call.id}")
            self._attempts[task] = call
            task.add_done_callback(self._attempt_done)
            self._track(task)

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _attempt_done(self, task: asyncio.Task[None]) -> None:
        self._attempts.pop(task, None)

    async def _release(self, calls: list[AsyncCall]) -> None:
        """Give CALLS (cut by a stop) back to the store, each due now."""
        released = 0
        for call in calls:
            try:
                released += await asyncio.to_thread(self.store.release, call.id, self.owner, time.time())
            except Exception:
                log.exception("async call %s: cannot give it back; its lease brings it back", call.id)
        if released:
            log.info("stopping: %d async call(s) cut and queued again for another runner", released)

    async def _attempt(self, call: AsyncCall) -> None:
        try:
            await self._settle(call, await self._invoke(call))
        except Exception:
            log.exception("async call %s: attempt failed unexpectedly; its lease brings it back", call.id)
        finally:
            self._slots.release()
            self._wake.set()  # a slot is free: look for the next due call now

    async def _invoke(self, call: AsyncCall) -> tuple[int | None, list[tuple[str, str]], bytes, str | None]:
        try:
            route = await self.invoker.platform.route(call.namespace, call.function)
        except PlatformError as exc:
            if exc.status == 404:
                return None, [], b"", f"the function is gone or not reachable: {exc.message}"
            return exc.status, [], b"", exc.message
        headers = [*((k, v) for k, v in call.headers if k.lower() != "x-request-id"),
                   ("X-Request-Id", call.request_id)]
        result = await self.invoker.call(route, call.method, call.path, headers, call.body, trigger="async",
                                         request_id=call.request_id, waited_sec=time.time() - call.created_at,
                                         attempt=call.attempts)
        return result.status, result.headers, result.body, result.error

    async def _settle(self, call: AsyncCall, outcome: tuple[int | None, list[tuple[str, str]], bytes, str | None]
                      ) -> None:
        status, headers, body, error = outcome
        now = time.time()
        if status is not None and status < 500 and status != 429:  # a 429 is worth waiting out
            cap = self.settings.result_max_bytes
            call.state, call.finished_at, call.error = CallState.SUCCEEDED, now, None
            call.result_status, call.result_headers = status, headers
            call.result_body, call.result_truncated = body[:cap], len(body) > cap
        elif status is None or call.attempts > self.settings.max_retries:
            call.state, call.finished_at, call.result_status = CallState.DEAD, now, status
            call.error = f"after {call.attempts} attempt(s): {error or f'HTTP {status}'}"
            log.warning("async call %s of %s/%s is dead: %s", call.id, call.namespace, call.function, call.error)
        else:
            call.state, call.result_status = CallState.QUEUED, status
            call.error = error or f"HTTP {status}"
            call.next_attempt_at = now + self.settings.backoff(call.attempts)
        if not await asyncio.to_thread(self.store.settle, call, self.owner):
            log.warning("async call %s: the lease was lost while it ran; its new owner decides", call.id)
        elif call.state in FINISHED and call.callback_url:
            # a task of its own: a slow receiver (attempts x timeout) must not hold a slot calls run in
            self._track(asyncio.create_task(self._callback(call), name=f"sless-callback-{call.id}"))

    async def _callback(self, call: AsyncCall) -> None:
        """POST the ended call's record to its callback URL, once (whoever takes the pending delivery makes it)."""
        assert call.callback_url is not None
        if not await asyncio.to_thread(self.store.take_callback, call.id, time.time() - STALE_CALLBACK_SEC):
            return
        payload = call.to_api(f"/v1/namespaces/{call.namespace}")
        payload["callback"] = None  # the receiver gets the outcome of the call, not of this delivery
        state = await self.callbacks.deliver(call.callback_url, payload, call.id, call.request_id)
        if state.startswith("failed"):
            log.warning("async call %s: callback %s", call.id, state)
        await asyncio.to_thread(self.store.set_callback_state, call.id, state[:500])
