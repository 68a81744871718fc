"""Supervised runtime processes for the standalone backend.

Each deployed function with an enabled HTTP trigger is one runtime server
(runtimes/<runtime>/server.*) running as a child process on a loopback port
(a scaled one: up to its ``max`` of them, each on its own port).
The supervisor owns their whole life so the invoke proxy only asks "where do I
send this call?":

- lazy cold start on the first call (concurrent callers share one start; the
  Python and Node runtimes say when they listen on a readiness pipe,
  readiness.py, Go is polled every few milliseconds, so the overhead over the
  runtime's own start-up stays small); where a spec allows it, the start takes
  over a warm spare of its tenant and runtime instead of starting a process
  (spares.py);
- zero-downtime redeploy: a new version is started and found healthy before
  traffic switches, and the old process is only told to stop once the calls it
  leased have finished (then SIGTERM lets the runtime drain whatever else it
  serves);
- scale to zero: processes idle for ``idle_timeout_sec`` (or their spec's
  ``idle_sec``) are stopped, unless their spec keeps one warm (``keep_warm``:
  started in the background at deploy and after a crash's backoff);
- scale out (a spec's ``scale`` with ``max`` > 1, pool.py): up to ``max``
  processes of one key, each started as the only one is (its own port and
  sandbox); a call goes to the one with the fewest calls in flight, waits for a
  new one while every process has its ``target``, and processes beyond the
  demand of the last ``idle_sec`` are retired (their calls finish first);
- crash restart with exponential backoff, so a crash-looping function costs a
  fast StartFailed (with the process's stderr tail) rather than a hung call;
- process output appended to ``<log_dir>/<key>.log``, size-capped by rotation.

Children run in their own session (Ctrl-C on the terminal reaches only the
platform, which then drains them) and, on Linux, get SIGTERM when the platform
process dies, so a crashed platform does not leave runtimes behind (Linux
ties that signal to the forking thread: run the supervisor's event loop in a
thread that lives as long as the platform, as uvicorn's main thread does).
All methods must be called from that one event loop.

A spec with a ``sandbox`` and a ``jail`` runs in a bubblewrap sandbox (see
sandbox.py): its own PID namespace, mounts, user and limits; the tree dies
when the sandbox's PID 1 does, and its cgroups are removed with it. Healthy
processes are probed every ``health_interval_sec``: one that stops answering
(SIGSTOPped, a wedged event loop) ``health_failures`` times in a row is killed
and counted as a crash, so the next call starts a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sless_api import metrics
from sless_api.backends.standalone.host.calllogs import CallLogStore, LineRouter
from sless_api.backends.standalone.host.child import (
    READY_WAIT_SEC,
    Child,
    ChildLog,
    drain_pipes,
    kill_child,
    limit_note,
    pause_between_probes,
    pump,
    with_tail,
)
from sless_api.backends.standalone.host.health import health_ok
from sless_api.backends.standalone.host.network import NetworkSetupBroken, NetworkUnavailable, PortTaken
from sless_api.backends.standalone.host.pool import DemandMemory, Scale, pick
from sless_api.backends.standalone.host.process import TERM_WITH_PLATFORM, free_port, kill_group
from sless_api.backends.standalone.host.readiness import READY_FD_ENV, ReadyPipe
from sless_api.backends.standalone.host.sandbox import JailSpec, Sandbox
from sless_api.backends.standalone.host.spares import SPARE_SECRETS_DIR, Spare, SparePool, SpareTemplate
from sless_api.gateway import calltiming

#: Runtimes that say "listening" on the readiness pipe (readiness.py): no polling pause while they start.
READY_PIPE_RUNTIMES = frozenset({"python3.11", "nodejs20"})
#: Extra seconds after the drain period before SIGKILL, so a runtime whose own
#: drain deadline (SLESS_DRAIN_SEC, the same value) fires can still exit cleanly.
KILL_GRACE_SEC = 1.0
#: Start attempts with fresh ports when the chosen port was taken meanwhile.
PORT_ATTEMPTS = 3
#: After a claim, the replacement spare starts when the first call on the claimed process ends, or this many
#: seconds after the claim when no call ends sooner (a slow call, a start for ``keep_warm``).
SPARE_REPLACE_LATEST_SEC = 1.0

_ADDR_IN_USE = re.compile(r"address already in use|EADDRINUSE|Errno 98", re.IGNORECASE)
_UNSAFE_FILENAME = re.compile(r"[^A-Za-z0-9._-]")


class SupervisorError(Exception):
    """Base of the errors callers are expected to map to HTTP answers."""


class NotDeployed(SupervisorError):
    """Nothing is deployed under the key (never deployed, removed, or the supervisor is closed)."""


class StartFailed(SupervisorError):
    """The process could not be started or is crash-looping; the message carries its stderr tail."""


class LimitExceeded(SupervisorError):
    """A call failed because its process was killed for exceeding a limit (memory, CPU, file size)."""


class Busy(SupervisorError):
    """Every process of a scaled key had its limit of calls in flight, and none was freed in time."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _PortInUseError(Exception):
    """The child lost the race for its port, or its network's set-up broke on the way; retried on another port."""


@dataclass(frozen=True)
class ProcessSpec:
    """How to run one version of a function's runtime server.

    ``env`` is the complete environment of the child: the platform's own
    environment (with its credentials) is deliberately not inherited. The
    supervisor adds PORT and SLESS_HOST=127.0.0.1, and SLESS_DRAIN_SEC unless
    set. ``version`` identifies code plus configuration; a different version
    means "redeploy".
    """

    argv: list[str]
    env: dict[str, str] = field(repr=False)  # it holds the function's secrets referenced as env vars
    cwd: Path
    version: str
    #: How long a retired process may finish its calls; None = the supervisor's drain_sec.
    #: The platform sets the function's timeout here, so a redeploy never cuts a call short.
    drain_sec: float | None = None
    #: Where and how confined the process runs; both or neither (None: a plain child process).
    sandbox: Sandbox | None = None
    jail: JailSpec | None = None
    #: The runtime's name: a metrics label, and whether it reports readiness (READY_PIPE_RUNTIMES).
    runtime: str = ""
    #: The warm spares this version may be started from (spares.py); None: always a fresh process.
    spare: SpareTemplate | None = None
    #: Seconds without calls before the process is stopped; None: the supervisor's ``idle_timeout_sec``.
    idle_sec: float | None = None
    #: Keep one process running: started at deploy (and again after a crash, after its backoff), never
    #: stopped for idleness (a function's ``scale.min`` >= 1).
    keep_warm: bool = False
    #: Several processes with demand (``max`` > 1; pool.py); None or ``max`` 1: one process, as without it.
    scale: Scale | None = None

    @property
    def pooled(self) -> bool:
        """Whether calls are shared among several processes (the scaled path) rather than one."""
        return self.scale is not None and self.scale.max > 1

    @property
    def warm(self) -> int:
        """Processes kept running without calls: ``scale.min``, and one when ``keep_warm``."""
        return max(self.scale.min if self.scale is not None else 0, 1 if self.keep_warm else 0)


@dataclass(eq=False)
class _Slot:
    """Everything the supervisor knows about one key."""

    key: str
    spec: ProcessSpec
    log: ChildLog
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: The processes that take calls, oldest first (one unless the spec is pooled); an exited one stays
    #: until its exit is accounted for (``_watch``).
    procs: list[Child] = field(default_factory=list)
    starting: asyncio.Task[Child] | None = None
    #: Starts of further processes of a pooled spec (``_grow``).
    growing: set[asyncio.Task[None]] = field(default_factory=set)
    #: Calls waiting in ``_acquire_pooled`` (they count as demand), and what wakes them.
    waiting: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    demand: DemandMemory = field(default_factory=DemandMemory)
    failures: int = 0
    restarts: int = 0
    retry_at: float = 0.0
    last_error: str | None = None
    last_activity: float = field(default_factory=time.monotonic)
    removed: bool = False
    #: A spare was claimed for this slot and its replacement is still to start (``Supervisor._replace_spare``).
    spare_due: asyncio.TimerHandle | None = None

    @property
    def current(self) -> Child | None:
        """The first process that takes calls, else the first one whose exit is still to be accounted for."""
        for proc in self.procs:
            if proc.alive:
                return proc
        return self.procs[0] if self.procs else None

    def serving(self) -> list[Child]:
        """The processes that take calls now."""
        return [proc for proc in self.procs if proc.alive]

    def starts_in_progress(self) -> int:
        return len(self.growing) + (1 if self.starting is not None and not self.starting.done() else 0)

    def wake_on_done(self, task: asyncio.Task[Any]) -> None:
        self.wake()

    def wake(self) -> None:
        """Calls waiting for a process look again (one started, ended, freed a slot or left)."""
        if self.waiting:
            self.changed.set()
            self.changed = asyncio.Event()


class Lease:
    """One call's hold on a function's process (``Supervisor.lease``).

    A class rather than a generator-based context manager: it is entered on every proxied call, and the
    generator machinery cost several microseconds of it.
    """

    __slots__ = ("key", "proc", "slot", "supervisor")

    def __init__(self, supervisor: Supervisor, key: str) -> None:
        self.supervisor = supervisor
        self.key = key
        self.slot: _Slot | None = None
        self.proc: Child | None = None

    async def __aenter__(self) -> str:
        self.slot, self.proc = await self.supervisor._acquire(self.key)
        self.proc.inflight += 1
        self.proc.idle.clear()
        return self.proc.url

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        proc, slot = self.proc, self.slot
        assert proc is not None and slot is not None
        try:
            if isinstance(exc, Exception):
                note = await limit_note(proc)
                if note:
                    raise LimitExceeded(f"{self.key}: {note}") from exc
        finally:
            self._let_go(slot, proc)
            if slot.spare_due is not None:
                self.supervisor._replace_spare(slot)

    def elsewhere(self, refused: Collection[str]) -> str | None:
        """Another process of a pooled key for this call, whose process (URLs in REFUSED) refused the connection:
        nothing listens there any more (it died, and its exit is not accounted for yet), so trying it again only
        waits. The call's hold moves to a serving process not in REFUSED with room below the key's limit; None
        for a key of one process, or when no other serves now (the caller tries the same address again)."""
        slot, proc = self.slot, self.proc
        if slot is None or proc is None or not slot.spec.pooled:
            return None
        scale = slot.spec.scale or Scale()
        other = pick([p for p in slot.serving() if p is not proc and p.url not in refused], scale.limit)
        if other is None:
            return None
        self._let_go(slot, proc)
        other.inflight += 1
        other.idle.clear()
        self.proc = other
        return other.url

    def _let_go(self, slot: _Slot, proc: Child) -> None:
        """The call no longer holds PROC: its drain may end, and a call waiting for room looks again."""
        proc.inflight -= 1
        if proc.inflight == 0:
            proc.idle.set()
        slot.last_activity = time.monotonic()
        if slot.waiting or slot.spec.pooled:
            self.supervisor._released(slot)


class Supervisor:
    """Runs one runtime process per deployed key; see the module docstring."""

    def __init__(
        self,
        *,
        log_dir: Path,
        idle_timeout_sec: float = 300.0,
        start_timeout_sec: float = 30.0,
        drain_sec: float = 25.0,
        backoff_base_sec: float = 1.0,
        backoff_max_sec: float = 30.0,
        stable_after_sec: float = 60.0,
        log_max_bytes: int = 4 * 1024 * 1024,
        health_interval_sec: float = 5.0,
        health_timeout_sec: float = 2.0,
        health_failures: int = 3,
        call_logs: CallLogStore | None = None,
        warm_spares: int = 0,
        full_wait_sec: float = 10.0,
    ) -> None:
        """``stable_after_sec``: a process that ran this long before crashing resets the backoff.

        ``full_wait_sec``: how long a call to a pooled key whose processes all have their limit of calls in
        flight (and that may start no more) waits for one to be freed before :class:`Busy`.

        A running process failing ``health_failures`` probes in a row (one every
        ``health_interval_sec``, each given ``health_timeout_sec``) is replaced.
        ``warm_spares``: spares kept per tenant for specs that allow them (spares.py); 0: none.
        """
        self.log_dir = Path(log_dir)
        self.idle_timeout_sec = idle_timeout_sec
        self.start_timeout_sec = start_timeout_sec
        self.drain_sec = drain_sec
        self.backoff_base_sec = backoff_base_sec
        self.backoff_max_sec = backoff_max_sec
        self.stable_after_sec = stable_after_sec
        self.log_max_bytes = log_max_bytes
        self.health_interval_sec = health_interval_sec
        self.health_timeout_sec = health_timeout_sec
        self.health_failures = health_failures
        self.full_wait_sec = full_wait_sec
        #: Where the tagged lines of each call go (runtimes/README.md, "Output of a call"); None keeps none.
        self.call_logs = call_logs
        self._prober: asyncio.Task[None] | None = None
        self._slots: dict[str, _Slot] = {}
        self._ports: set[int] = set()
        self._background: dict[asyncio.Task[None], _Slot] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False
        self.spares = SparePool(warm_spares, self._ports)

    # ------------------------------------------------------------------ public API

    async def deploy(self, key: str, spec: ProcessSpec, eager: bool = False) -> None:
        """Record ``spec`` as the desired state of ``key``.

        If an older version is running (or ``eager``), start the new version,
        wait until it is healthy, switch traffic to it and stop the old one in
        the background (it finishes its calls first). Otherwise the process is
        started by the next call. If the new version fails to start, the old
        one keeps serving and StartFailed is raised.
        """
        if self._closed:
            raise NotDeployed(f"{key}: the supervisor is closed")
        self._ensure_reaper()
        slot = self._slots.get(key)
        if slot is None:
            slot = _Slot(key, spec, ChildLog(self._log_path(key), self.log_max_bytes))
            self._slots[key] = slot
        else:
            if slot.spec.version != spec.version:
                # A new version deserves a fresh start, not the old one's crash backoff.
                slot.failures, slot.retry_at, slot.last_error = 0, 0.0, None
            old_spare, slot.spec = slot.spec.spare, spec
            if old_spare is not None and (spec.spare is None or spec.spare.kind != old_spare.kind):
                await self._drop_spares_unless_wanted(old_spare)  # e.g. rebuilt for another runtime
        self._want_spare(spec)
        async with slot.lock:
            if slot.removed or slot.spec is not spec:
                return  # removed, or a newer deploy() takes over
            running = slot.serving()
            if any(proc.version == spec.version for proc in running):
                for proc in running:
                    if proc.version != spec.version:
                        self._retire(slot, proc)
                return
            if not running and not eager:
                if spec.warm:
                    self._warm(slot)
                return
            new = await self._start(slot, spec)
            # The switch: every older process (all of a pooled key's) leaves at once and finishes its calls;
            # further processes of the new version start with demand (or to keep ``warm`` of them).
            old = [proc for proc in slot.procs if proc.version != spec.version]
            slot.procs = [proc for proc in slot.procs if proc.version == spec.version] + [new]
            slot.last_activity = time.monotonic()
            for proc in old:
                if proc.alive:
                    self._retire(slot, proc)
            slot.wake()

    async def endpoint(self, key: str) -> str:
        """Base URL of a healthy process for ``key``, starting one if needed.

        Prefer :meth:`lease` for calls: a bare endpoint is not protected from
        the idle reaper or a redeploy between this return and the request.
        """
        _, proc = await self._acquire(key)
        return proc.url

    def lease(self, key: str) -> Lease:
        """``async with supervisor.lease(key) as base_url:`` one call's use of a process.

        While leased, the process is neither reaped as idle nor sent SIGTERM
        by a redeploy, so a call that got its URL always reaches a listening
        server.
        """
        return Lease(self, key)

    async def remove(self, key: str) -> None:
        """Stop every process of ``key`` (leases finish, then SIGTERM, SIGKILL after drain) and forget it."""
        slot = self._slots.pop(key, None)
        if slot is None:
            return
        slot.removed = True  # aborts a start in progress within one health poll
        slot.wake()
        self._replace_spare(slot)  # nothing starts for a removed slot: only the timer goes
        async with slot.lock:
            for proc in list(slot.procs):
                self._retire(slot, proc)
        pending = [task for task, owner in self._background.items() if owner is slot]
        await asyncio.gather(*pending, return_exceptions=True)
        slot.log.close()
        if slot.spec.spare is not None:
            await self._drop_spares_unless_wanted(slot.spec.spare)

    async def close(self) -> None:
        """Stop every process concurrently; used at shutdown. The supervisor cannot be used afterwards."""
        self._closed = True
        for task in (self._reaper, self._prober):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._reaper = self._prober = None
        await self.spares.close()
        slots = list(self._slots.values())
        self._slots.clear()
        for slot in slots:
            slot.removed = True
            self._replace_spare(slot)  # only cancels its timer: nothing starts any more

        async def retire_when_unlocked(slot: _Slot) -> None:
            slot.wake()
            async with slot.lock:
                for proc in list(slot.procs):
                    self._retire(slot, proc)

        await asyncio.gather(*(retire_when_unlocked(s) for s in slots), return_exceptions=True)
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        for slot in slots:
            slot.log.close()

    def status(self, key: str) -> dict[str, Any]:
        """State of ``key`` for the API and console.

        ``state`` is one of running, starting, backoff (waiting before the next
        restart attempt), crashed (will restart on the next call) or stopped
        (scaled to zero; starts on the next call). ``processes`` counts the
        processes that take calls (several for a pooled spec under load); ``pid``
        and ``port`` are the oldest one's, ``inflight`` is the sum of them all.
        """
        slot = self._slots.get(key)
        if slot is None:
            raise NotDeployed(key)
        now = time.monotonic()
        proc = slot.current
        serving = slot.serving()
        if proc is not None and proc.alive:
            state = "running"
        elif slot.lock.locked() or slot.starts_in_progress():
            state = "starting"
        elif slot.failures and slot.retry_at > now:
            state = "backoff"
        elif slot.failures or (proc is not None and not proc.stopping):
            # The second case: exited on its own, and the exit is not accounted for yet.
            state = "crashed"
        else:
            state = "stopped"
        running = proc if proc is not None and proc.alive else None
        return {
            "state": state,
            "pid": running.proc.pid if running else None,
            "port": running.port if running else None,
            "version": slot.spec.version,
            "running_version": running.version if running else None,
            "restarts": slot.restarts,
            "failures": slot.failures,
            "last_error": slot.last_error,
            "inflight": sum(p.inflight for p in serving),
            "processes": len(serving),
            "idle_sec": round(now - slot.last_activity, 3),
            "retry_in_sec": round(max(0.0, slot.retry_at - now), 3) if slot.failures else 0.0,
        }

    def keys(self) -> list[str]:
        """Every deployed key."""
        return list(self._slots)

    # ------------------------------------------------------------------ acquiring

    async def _acquire(self, key: str) -> tuple[_Slot, Child]:
        for _ in range(5):
            slot = self._slots.get(key)
            if slot is None:
                raise NotDeployed(key)
            slot.last_activity = time.monotonic()
            if slot.spec.pooled:
                return slot, await self._acquire_pooled(slot)
            proc = slot.current
            if proc is not None and proc.alive:
                return slot, proc
            if slot.starting is None or slot.starting.done():
                slot.starting = asyncio.create_task(self._start_for_call(slot), name=f"sless-start-{key}")
                slot.starting.add_done_callback(_retrieve_exception)
                slot.starting.add_done_callback(slot.wake_on_done)  # a pooled call may wait for it too
            waited = time.monotonic()
            try:
                proc = await asyncio.shield(slot.starting)
            finally:
                calltiming.note_start(time.monotonic() - waited)
            # Between the start finishing and this task resuming, a redeploy or
            # removal may already have retired the process: ask again.
            if proc.alive:
                return slot, proc
        raise StartFailed(f"{key}: processes keep being replaced while starting")

    async def _acquire_pooled(self, slot: _Slot) -> Child:
        """A process of a pooled key for one call (pool.py).

        The least busy process below its ``target`` takes the call. Else the call counts as demand: it starts
        another process when the demand wants more than run or start, and waits until one comes below its
        target (a start ends, or a call). When no more may start (``max``, a crash's backoff, a failed start),
        the least busy process below its limit takes it; when all are full, it waits for a freed one at most
        ``full_wait_sec`` (then Busy). Nothing running and nothing starting: StartFailed, as with one process.
        """
        deadline = time.monotonic() + self.full_wait_sec
        failures = slot.failures
        waited_from: float | None = None
        slot.waiting += 1
        try:
            while True:
                if slot.removed:
                    raise NotDeployed(slot.key)
                scale = slot.spec.scale or Scale()
                running = slot.serving()
                now = time.monotonic()
                wanted = scale.wanted(sum(proc.inflight for proc in running) + slot.waiting)
                slot.demand.note(wanted, now)
                proc = pick(running, scale.per_process)
                if proc is not None:
                    return proc
                starting = slot.starts_in_progress()
                if len(running) + starting < wanted and not (slot.failures and slot.retry_at > now):
                    self._grow(slot, cold=not running)
                    starting += 1
                if not starting:
                    proc = pick(running, scale.limit)
                    if proc is not None:
                        return proc
                    if not running:
                        raise self._not_starting(slot, now, failed_meanwhile=slot.failures > failures)
                    if now >= deadline:
                        raise Busy(f"{slot.key}: each of its {len(running)} processes has its limit of "
                                   f"{scale.limit} calls in flight (waited {self.full_wait_sec:g}s for one)",
                                   retry_after=1)
                elif waited_from is None:
                    waited_from = now  # a start this call waits for: a cold call
                changed = slot.changed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), None if starting else max(0.0, deadline - now))
        finally:
            slot.waiting -= 1
            if waited_from is not None:
                calltiming.note_start(time.monotonic() - waited_from)

    @staticmethod
    def _not_starting(slot: _Slot, now: float, failed_meanwhile: bool) -> StartFailed:
        """Why a pooled key has no process for a call: the start it waited for failed, or a backoff runs."""
        if failed_meanwhile and slot.last_error:
            return StartFailed(slot.last_error)
        return StartFailed(
            f"{slot.key}: not restarting for another {max(0.0, slot.retry_at - now):.1f}s after "
            f"{slot.failures} failure(s); last error: {slot.last_error}"
        )

    def _grow(self, slot: _Slot, cold: bool) -> None:
        """Start one more process of a pooled key in the background; it takes calls once healthy.

        COLD: a call waits for it (a cold start, in the metrics). A failure is accounted as any start's.
        """
        task = asyncio.create_task(self._add_process(slot, cold), name=f"sless-grow-{slot.key}")
        slot.growing.add(task)
        self._background[task] = slot

        def done(task: asyncio.Task[None]) -> None:
            slot.growing.discard(task)
            self._background_done(task)
            slot.wake()

        task.add_done_callback(done)

    async def _add_process(self, slot: _Slot, cold: bool) -> None:
        spec, began = slot.spec, time.monotonic()
        proc = await self._start(slot, spec)
        if self._closed or slot.spec.version != proc.version:
            self._retire(slot, proc)  # a redeploy switched versions meanwhile
            return
        if cold:
            metrics.COLD_STARTS.labels(spec.runtime).inc()
            metrics.COLD_START_SECONDS.labels(spec.runtime).observe(time.monotonic() - began)
        slot.procs.append(proc)
        slot.last_activity = time.monotonic()

    def _released(self, slot: _Slot) -> None:
        """A call of a pooled key ended: its demand (the ended call included) is remembered for scale-in, and a
        call waiting for a process below its target looks again."""
        scale = slot.spec.scale
        if scale is not None:
            in_flight = sum(proc.inflight for proc in slot.procs if proc.alive) + 1
            slot.demand.note(scale.wanted(in_flight), time.monotonic())
        slot.wake()

    def _warm(self, slot: _Slot) -> None:
        """Start the slot's process in the background unless one runs or starts (``keep_warm``; a pooled spec:
        up to ``warm`` of them); a failure is accounted as for a call's start (backoff), and the reaper tries
        again once the backoff is over."""
        if self._closed or slot.removed:
            return
        if slot.spec.pooled:
            for _ in range(slot.spec.warm - len(slot.serving()) - slot.starts_in_progress()):
                self._grow(slot, cold=False)
            return
        proc = slot.current
        if proc is not None and proc.alive:
            return
        if slot.starting is None or slot.starting.done():
            slot.starting = asyncio.create_task(self._start_for_call(slot, cold=False), name=f"sless-warm-{slot.key}")
            slot.starting.add_done_callback(_retrieve_exception)
            slot.starting.add_done_callback(slot.wake_on_done)

    async def _start_for_call(self, slot: _Slot, cold: bool = True) -> Child:
        """Start the slot's process unless one runs; COLD: a call waits for it (a cold start, in the metrics)."""
        async with slot.lock:
            if slot.removed:
                raise NotDeployed(slot.key)
            proc = slot.current
            if proc is not None and proc.alive:
                return proc
            for exited in list(slot.procs):
                if exited.monitor is not None:
                    # Let the exit be accounted for (stderr tail, backoff) before deciding.
                    await asyncio.shield(exited.monitor)
            slot.procs = slot.serving()
            if slot.procs:
                return slot.procs[0]
            wait = slot.retry_at - time.monotonic()
            if slot.failures and wait > 0:
                raise StartFailed(
                    f"{slot.key}: not restarting for another {wait:.1f}s after "
                    f"{slot.failures} failure(s); last error: {slot.last_error}"
                )
            began = time.monotonic()
            proc = await self._start(slot, slot.spec)
            if cold:
                metrics.COLD_STARTS.labels(slot.spec.runtime).inc()
                metrics.COLD_START_SECONDS.labels(slot.spec.runtime).observe(time.monotonic() - began)
            slot.procs.append(proc)
            slot.last_activity = time.monotonic()
            return proc

    # ------------------------------------------------------------------ starting

    async def _start(self, slot: _Slot, spec: ProcessSpec) -> Child:
        """Launch ``spec`` (slot lock held) with failure accounting."""
        if slot.failures:
            slot.restarts += 1
        try:
            proc = await self._from_spare(slot, spec)
            if proc is None:
                proc = await self._launch(slot, spec)
        except StartFailed as exc:
            self._record_failure(slot, str(exc), crashed=False)
            raise
        if slot.removed:
            self._retire(slot, proc)
            raise NotDeployed(f"{slot.key} was removed while starting")
        return proc

    async def _drop_spares_unless_wanted(self, template: SpareTemplate) -> None:
        """Stop the spares of the template's tenant and runtime when none of the deployed specs may use them."""
        if not any(s.spec.spare is not None and s.spec.spare.kind == template.kind for s in self._slots.values()):
            await self.spares.drop(template.tenant, template.runtime)

    def _want_spare(self, spec: ProcessSpec) -> None:
        if spec.spare is not None and spec.sandbox is not None and not self._closed:
            self.spares.want(spec.spare, spec.sandbox)

    async def _from_spare(self, slot: _Slot, spec: ProcessSpec) -> Child | None:
        """``spec`` served by a warm spare of its tenant, None when there is no ready one that fits.

        The spare's memory limit becomes the function's, then the claim (the complete environment, the
        working directory, the secret files) goes over its stdin; a replacement starts in the background once
        the first call on the claimed process has ended (``_replace_spare``), at once if the claim failed.
        """
        if spec.spare is None:
            return None
        spare = self.spares.take(spec.argv, spec.env, spec.jail, spec.sandbox)
        if spare is None:
            self._want_spare(spec)
            return None
        proc: Child | None = None
        try:
            proc = await self._claim(slot, spec, spare)
            return proc
        finally:
            if proc is None:
                self._want_spare(spec)
            else:
                self._replace_spare_later(slot)

    def _replace_spare_later(self, slot: _Slot) -> None:
        """Start the claimed spare's replacement after the first call ends (``Lease``), at the latest after
        SPARE_REPLACE_LATEST_SEC. A spare's start (the sandbox, pasta, an interpreter) takes the CPU for tens of
        milliseconds: on a small host, started at the claim it ran beside the very call that waited for the
        claim and slowed it down (the call that a spare is there to make fast)."""
        if slot.spare_due is None:
            slot.spare_due = asyncio.get_running_loop().call_later(SPARE_REPLACE_LATEST_SEC, self._replace_spare, slot)

    def _replace_spare(self, slot: _Slot) -> None:
        """The replacement of the spare claimed for ``slot`` starts now (for the slot's current spec)."""
        due, slot.spare_due = slot.spare_due, None
        if due is not None:
            due.cancel()
        if not slot.removed:
            self._want_spare(slot.spec)

    async def _claim(self, slot: _Slot, spec: ProcessSpec, spare: Spare) -> Child | None:
        assert spec.jail is not None
        drain = spec.drain_sec if spec.drain_sec is not None else self.drain_sec
        env = self._child_env(spec, spare.port, drain)
        env.update(spare.jail.env)
        if spec.jail.files:
            env["SLESS_SECRETS_DIR"] = SPARE_SECRETS_DIR
        claim = json.dumps({"env": env, "cwd": str(spec.cwd), "secrets_dir": SPARE_SECRETS_DIR,
                            "files": [[name, content.hex()] for name, content in spec.jail.files]}).encode()
        slot.log.note(f"starting version {spec.version} on port {spare.port} in warm spare pid {spare.proc.pid}")
        child = spare.proc
        try:
            assert spare.jail.cgroup is not None and child.stdin is not None
            spare.jail.cgroup.set_memory(spec.jail.limits.memory_mb)
            spare.jail.limits = spec.jail.limits  # the function's, for exit notes
            child.stdin.write(claim)
            await child.stdin.drain()
            child.stdin.close()
        except (OSError, ConnectionError) as exc:
            slot.log.note(f"warm spare pid {child.pid} unusable ({exc}); starting a fresh process")
            spare.claimed = False
            await self.spares.discard(spare)
            return None
        proc = Child(child, spare.port, spec.version, time.monotonic(), drain, jail=spare.jail, ready=spare.ready)
        adopted = await self._adopt(slot, proc, listening=True)
        metrics.WARM_SPARE_CLAIMS.labels(spec.runtime).inc()
        return adopted

    def _child_env(self, spec: ProcessSpec, port: int, drain: float) -> dict[str, str]:
        env = dict(spec.env)
        env["PORT"] = str(port)
        env["SLESS_HOST"] = "127.0.0.1"
        env.setdefault("SLESS_DRAIN_SEC", f"{drain:g}")
        return env

    async def _launch(self, slot: _Slot, spec: ProcessSpec) -> Child:
        last = ""
        for _ in range(PORT_ATTEMPTS):
            port = free_port(self._ports)
            self._ports.add(port)
            try:
                return await self._launch_on(slot, spec, port)
            except _PortInUseError as exc:
                self._ports.discard(port)
                last = str(exc)
            except BaseException:
                self._ports.discard(port)
                raise
        raise StartFailed(f"{slot.key}: start failed on {PORT_ATTEMPTS} attempts (port taken or network set-up "
                          f"broken); last:\n{last}")

    async def _launch_on(self, slot: _Slot, spec: ProcessSpec, port: int) -> Child:
        drain = spec.drain_sec if spec.drain_sec is not None else self.drain_sec
        env = self._child_env(spec, port, drain)
        slot.log.note(f"starting version {spec.version} on port {port}")
        argv, preexec, jail = list(spec.argv), TERM_WITH_PLATFORM, None
        ready = ReadyPipe() if spec.runtime in READY_PIPE_RUNTIMES else None
        if ready is not None:
            env[READY_FD_ENV] = str(ready.write_fd)
        try:
            if spec.sandbox is not None and spec.jail is not None:
                # In a thread: cgroup set-up and the port rule (an iptables run) must not stall other calls.
                jail = await asyncio.to_thread(
                    spec.sandbox.prepare, spec.argv, spec.cwd, spec.jail, f"{slot.key}-{port}", port=port,
                )
                argv, preexec = jail.argv, jail.preexec
                env.update(jail.env)
            child = await asyncio.create_subprocess_exec(
                *argv,
                cwd=spec.cwd,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                preexec_fn=preexec,  # a prctl call (and, sandboxed, a cgroup join and rlimits)
                pass_fds=(*(jail.pass_fds if jail is not None else ()), *([ready.write_fd] if ready else [])),
            )
            if jail is not None:
                jail.release_fds()
            if ready is not None:
                ready.release_write()
        except OSError as exc:
            if ready is not None:
                ready.close()
            if jail is not None:
                jail.cleanup()
            message = f"{slot.key}: cannot start {spec.argv[0] if spec.argv else '(empty argv)'}: {exc}"
            slot.log.note(message)
            raise StartFailed(message) from exc
        if jail is not None:
            try:
                await asyncio.to_thread(jail.attach)  # its own network, then its command starts
            except NetworkUnavailable as exc:
                jail.kill(child.pid)
                await child.wait()
                if ready is not None:
                    ready.close()
                await asyncio.to_thread(jail.cleanup)
                message = f"{slot.key}: {exc}"
                slot.log.note(message)
                if isinstance(exc, (PortTaken, NetworkSetupBroken)):
                    raise _PortInUseError(message) from exc  # address in use, or a set-up broken: again
                raise StartFailed(message) from exc
        return await self._adopt(slot, Child(child, port, spec.version, time.monotonic(), drain, jail=jail,
                                             ready=ready))

    async def _adopt(self, slot: _Slot, proc: Child, listening: bool = False) -> Child:
        """Capture a just started (or claimed) process's output and wait until it is healthy.

        ``listening``: the process listened on its port before it was asked to serve (a claimed spare): its
        readiness byte is enough (see ``_wait_healthy``)."""
        child = proc.proc
        assert child.stdout is not None and child.stderr is not None
        proc.readers = [
            asyncio.create_task(pump(child.stdout, slot.log, None, self._router(slot.key, "stdout"))),
            asyncio.create_task(pump(child.stderr, slot.log, proc.stderr_tail, self._router(slot.key, "stderr"))),
        ]
        try:
            await self._wait_healthy(slot, proc, listening)
        except BaseException:
            await kill_child(proc)
            await drain_pipes(proc)
            slot.log.note(f"pid {child.pid} failed to start (exit code {child.returncode})")
            raise
        finally:
            if proc.ready is not None:
                proc.ready.close()
                proc.ready = None
        proc.healthy = True
        proc.monitor = asyncio.create_task(self._watch(slot, proc), name=f"sless-watch-{slot.key}")
        slot.log.note(f"pid {child.pid} healthy after {time.monotonic() - proc.started_at:.3f}s")
        return proc

    async def _wait_healthy(self, slot: _Slot, proc: Child, listening: bool = False) -> None:
        """Until ``proc`` answers ``GET /_/health`` (StartFailed when it exits or the start times out).

        ``listening`` (a claimed spare): its readiness byte ("serving") is taken instead of a probe. Its listener
        has been open since before the claim, so a call sent now waits in the kernel's backlog until the server
        takes it, as the probe would; the probe only cost the first call a round trip through the sandbox's
        network. A byte written early (the function's own code can reach the descriptor while it loads) gains it
        nothing: its call still waits for the server."""
        deadline = proc.started_at + self.start_timeout_sec
        if listening and await self._said_serving(slot, proc, deadline):
            return
        while True:
            if slot.removed:
                raise NotDeployed(f"{slot.key} was removed while starting")
            if proc.proc.returncode is not None:
                await drain_pipes(proc)
                tail = proc.tail()
                if _ADDR_IN_USE.search(tail):
                    raise _PortInUseError(tail)
                code = proc.proc.returncode
                message = f"{slot.key}: process exited with code {code} during start-up"
                note = proc.exit_note()
                if note:
                    message = f"{message} ({note})"
                raise StartFailed(with_tail(message, tail))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StartFailed(
                    with_tail(f"{slot.key}: not healthy within {self.start_timeout_sec:g}s", proc.tail())
                )
            if await health_ok(proc.port, min(remaining, 2.0)):
                return
            await pause_between_probes(proc, remaining)

    @staticmethod
    async def _said_serving(slot: _Slot, proc: Child, deadline: float) -> bool:
        """Whether the runtime wrote its readiness byte before ``deadline``. False when it exited (EOF), has no
        pipe, or the slot was removed meanwhile (looked at every READY_WAIT_SEC): the caller then probes and
        reports as for any start."""
        pipe = proc.ready
        while pipe is not None and not pipe.ended and not slot.removed and proc.proc.returncode is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            got = await pipe.wait(min(remaining, READY_WAIT_SEC))
            if got is True:
                pipe.ended = True  # one byte is all a runtime says
                return True
        return False

    # ------------------------------------------------------------------ stopping and crashes

    def _retire(self, slot: _Slot, proc: Child) -> None:
        """Take ``proc`` out of service now and stop it in the background."""
        if proc in slot.procs:
            slot.procs.remove(proc)
            slot.wake()
        if proc.stopping:
            return
        proc.stopping = True
        task = asyncio.create_task(self._stop(proc), name=f"sless-stop-{slot.key}")
        self._background[task] = slot
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[None]) -> None:
        self._background.pop(task, None)
        _retrieve_exception(task)

    async def _stop(self, proc: Child) -> None:
        """Wait for leases to end, SIGTERM (the runtime drains), SIGKILL after the drain period."""
        deadline = time.monotonic() + proc.drain_sec
        if proc.inflight:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.idle.wait(), proc.drain_sec)
        if proc.proc.returncode is None:
            proc.signal(signal.SIGTERM)
            grace = max(0.0, deadline - time.monotonic()) + KILL_GRACE_SEC
            try:
                await asyncio.wait_for(proc.proc.wait(), grace)
            except TimeoutError:
                await kill_child(proc)
        if proc.monitor is not None:
            await asyncio.shield(proc.monitor)
        self._ports.discard(proc.port)

    async def _watch(self, slot: _Slot, proc: Child) -> None:
        """Notice the exit of a healthy process; an exit we did not ask for is a crash."""
        code = await proc.proc.wait()
        await drain_pipes(proc)
        if proc.jail is None or not proc.jail.sandboxed:
            kill_group(proc.proc.pid)
        # Sandboxed: bwrap's init and the function run in their own session, so once the reaped bwrap's
        # group is empty its number may be reused by anyone; the PID namespace and cgroup took care of
        # the stragglers already.
        note = proc.exit_note()
        if proc.jail is not None:
            await asyncio.to_thread(proc.jail.cleanup)
        self._ports.discard(proc.port)
        if proc.stopping:
            slot.log.note(f"pid {proc.proc.pid} stopped (exit code {code})")
            return
        ran = time.monotonic() - proc.started_at
        why = f" ({note})" if note else ""
        message = with_tail(
            f"{slot.key}: process {proc.proc.pid} (version {proc.version}) exited unexpectedly "
            f"with code {code} after {ran:.1f}s{why}",
            proc.tail(),
        )
        slot.log.note(f"pid {proc.proc.pid} exited unexpectedly (exit code {code}){why}")
        if ran >= self.stable_after_sec:
            slot.failures = 0
        self._record_failure(slot, message, crashed=True)
        proc.stopping = True
        if proc in slot.procs:
            slot.procs.remove(proc)
            slot.wake()

    def _record_failure(self, slot: _Slot, message: str, crashed: bool) -> None:
        """Count a failure and set the earliest next start: the first crash restarts at once."""
        slot.failures += 1
        slot.last_error = message
        if crashed and slot.failures == 1:
            delay = 0.0
        else:
            delay = min(self.backoff_max_sec, self.backoff_base_sec * 2 ** (slot.failures - 1))
        slot.retry_at = time.monotonic() + delay

    # ------------------------------------------------------------------ idle reaper

    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap_idle(), name="sless-idle-reaper")
        if self._prober is None or self._prober.done():
            self._prober = asyncio.create_task(self._probe_health(), name="sless-health-prober")

    async def _probe_health(self) -> None:
        """Replace running processes that stopped answering their health probe (SIGSTOP, a wedged loop)."""
        while True:
            await asyncio.sleep(self.health_interval_sec)
            procs = [
                (slot, proc)
                for slot in list(self._slots.values())
                for proc in slot.procs
                if proc.alive and proc.healthy
            ]
            if not procs:
                continue
            results = await asyncio.gather(
                *(health_ok(proc.port, self.health_timeout_sec) for _, proc in procs)
            )
            for (slot, proc), ok in zip(procs, results, strict=True):
                if ok or not proc.alive:
                    proc.probe_failures = 0
                    continue
                proc.probe_failures += 1
                if proc.probe_failures >= self.health_failures:
                    self._replace_wedged(slot, proc)

    def _replace_wedged(self, slot: _Slot, proc: Child) -> None:
        """Kill a process that stopped answering and count it as a crash (the next call restarts it)."""
        message = (
            f"{slot.key}: process {proc.proc.pid} did not answer {proc.probe_failures} health probes "
            f"in a row (stopped or wedged) and was killed"
        )
        slot.log.note(message)
        self._record_failure(slot, message, crashed=True)
        proc.stopping = True
        if proc in slot.procs:
            slot.procs.remove(proc)
            slot.wake()
        task = asyncio.create_task(kill_child(proc), name=f"sless-kill-{slot.key}")
        self._background[task] = slot
        task.add_done_callback(self._background_done)

    async def _reap_idle(self) -> None:
        """Stop processes without calls for ``idle_timeout_sec`` or their spec's ``idle_sec`` (scale to zero;
        a pooled key's beyond its demand: scale-in); start again the processes of a spec that keeps some warm
        once a crash's backoff is over."""
        interval = min(1.0, max(0.05, self.idle_timeout_sec / 4))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for slot in list(self._slots.values()):
                if slot.spec.pooled or len(slot.serving()) > 1:
                    self._scale_in(slot, now)
                    if slot.spec.warm and not (slot.failures and slot.retry_at > now):
                        self._warm(slot)
                    continue
                proc = slot.current
                if slot.spec.keep_warm:
                    if (proc is None or not proc.alive) and not (slot.failures and slot.retry_at > now):
                        self._warm(slot)
                    continue
                idle = slot.spec.idle_sec if slot.spec.idle_sec is not None else self.idle_timeout_sec
                if (
                    proc is not None
                    and proc.alive
                    and proc.inflight == 0
                    and not slot.lock.locked()
                    and now - slot.last_activity >= idle
                ):
                    slot.log.note(f"pid {proc.proc.pid} idle for {now - slot.last_activity:.1f}s, stopping")
                    self._retire(slot, proc)

    def _scale_in(self, slot: _Slot, now: float) -> None:
        """Retire the processes beyond what the demand of the last ``idle_sec`` needed (at least ``warm``, at
        most ``max``, and one while the key had a call within ``idle_sec``, which also covers a key no longer
        pooled): the least busy and the newest first; each finishes its calls before it stops."""
        if slot.lock.locked():
            return  # a redeploy is switching the processes
        spec = slot.spec
        scale = spec.scale or Scale()
        serving = slot.serving()
        slot.demand.note(scale.wanted(sum(proc.inflight for proc in serving)), now)
        idle = spec.idle_sec if spec.idle_sec is not None else self.idle_timeout_sec
        recent = 1 if now - slot.last_activity < idle else 0
        keep = min(scale.max, max(spec.warm, recent, slot.demand.needed_within(now - idle)))
        if len(serving) <= keep:
            return
        surplus = sorted(serving, key=lambda proc: (proc.inflight, -proc.started_at))[: len(serving) - keep]
        for proc in surplus:
            slot.log.note(f"pid {proc.proc.pid} not needed for {idle:g}s ({len(serving)} processes, "
                          f"{keep} needed), stopping")
            self._retire(slot, proc)

    def _router(self, key: str, stream: str) -> LineRouter | None:
        return LineRouter(self.call_logs, key, stream) if self.call_logs is not None else None

    def _log_path(self, key: str) -> Path:
        name = _UNSAFE_FILENAME.sub("_", key)
        if name.startswith("."):
            name = "_" + name
        return self.log_dir / f"{name}.log"




def _retrieve_exception(task: asyncio.Task[Any]) -> None:
    """Mark a background task's exception as seen (its waiters got it, or nobody was waiting)."""
    if not task.cancelled():
        task.exception()
