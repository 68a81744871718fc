"""Warm spares: pre-started, sandboxed Python runtime processes that a cold start takes over.

Most of a Python function's cold start is not its code: it is the interpreter, the runtime's imports and
the sandbox (bwrap, setpriv, cgroups). A spare has done all that ahead of time and waits, listening on its
port, for a claim on its stdin (``sless_server.wait_for_claim``); a cold start then costs the claim, the
import of the handler and one health probe. The rules, because tenants' code is hostile:

- a spare belongs to one tenant and one runtime: it runs in that tenant's sandbox exactly as the tenant's
  function processes do (its uid, PID namespace, limits), and its mount view holds the toolchain and that
  tenant's own code folder (``functions/<ns>``) and dependency folder, read-only; nothing of another tenant,
  nothing of the data dir;
- it is used once: a claimed spare is that function's process from then on and never goes back to the pool;
- the function's environment and its secrets reach it only in the claim, over a pipe only the supervisor
  holds; before the claim it has the platform's start-time variables and nothing else, and no tenant code
  has run in it. Secrets referenced as files are written by the runtime into a 0500 folder of its private
  /tmp (``SPARE_SECRETS_DIR``): readable by that process alone, as with a normal start, but owned by the
  tenant's uid, so unlike the read-only copies of a normal start the function could change them;
- the function's memory limit is set on the spare's own memory cgroup before the claim is sent; the other
  limits (pids, rlimits, the size of /tmp) must already be the function's, or the spare does not fit;
- variables read when an interpreter starts (``PYTHON*``, ``LD_*``, ``MALLOC_*``, locale, ``TZ``) must be
  the same in the function's environment as in the spare's, or the spare does not fit: setting them at the
  claim would be too late. A function that does not fit gets a normal cold start.

The pool keeps ``per_tenant`` spares for each tenant the supervisor asks it to (one with a deployed Python
function); a claim is followed by a new spare in the background. Spares of a tenant stop when its last
Python function is removed, all of them when the supervisor closes; a spare's cgroups and port rule go with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sless_api.backends.standalone.host.process import free_port
from sless_api.backends.standalone.host.readiness import READY_FD_ENV, ReadyPipe
from sless_api.backends.standalone.host.sandbox import JailSpec, Limits, Prepared, Sandbox

log = logging.getLogger("sless.standalone")

#: Where a claimed spare's runtime writes the function's secret files (inside its private /tmp).
SPARE_SECRETS_DIR = "/tmp/.sless-secrets"  # noqa: S108 - the sandbox's own tmpfs
#: Prefixes of variables an interpreter (or libc) reads at start: they must match between spare and function.
START_TIME_PREFIXES = ("PYTHON", "LD_", "MALLOC_", "GLIBC_", "LANG", "LC_", "TZ")
#: How long a spare may take to be ready before it is given up.
SPARE_READY_SEC = 30.0


def start_time_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` an interpreter reads when it starts."""
    return {k: v for k, v in env.items() if k.startswith(START_TIME_PREFIXES)}


@dataclass(frozen=True)
class SpareTemplate:
    """How a tenant's spares start; what every function they may become shares.

    ``env`` comes from the platform alone (never a function's variables or secrets): PATH and the start-time
    variables. ``roots``: the read-only folders besides the toolchain, the tenant's code folder first (also
    the spare's working directory until the claim).
    """

    tenant: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    roots: tuple[Path, ...]
    limits: Limits


@dataclass(eq=False)
class Spare:
    """One started spare, ready once its runtime said so on the readiness pipe."""

    template: SpareTemplate
    sandbox: Sandbox
    proc: asyncio.subprocess.Process
    port: int
    jail: Prepared
    ready: ReadyPipe
    started_at: float = field(default_factory=time.monotonic)
    is_ready: bool = False
    claimed: bool = False

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    def why_not(self, argv: Sequence[str], env: Mapping[str, str], jail: JailSpec | None) -> str | None:
        """None when this spare can become the process of (``argv``, ``env``, ``jail``), else why not."""
        template = self.template
        if jail is None or jail.tenant != template.tenant:
            return "another tenant"
        if tuple(argv) != template.argv:
            return "another command"
        if jail.rw_binds or jail.reaper_only:
            return "writable folders"
        if not all(any(path == root or path.is_relative_to(root) for root in template.roots)
                   for path in jail.ro_binds):
            return "folders outside its mount view"
        if self.jail.cgroup is None or (dataclasses.replace(jail.limits, memory_mb=None)
                                        != dataclasses.replace(template.limits, memory_mb=None)):
            return "other limits"
        if start_time_env(env) != start_time_env(dict(template.env)):
            return "other start-time variables"
        return None


class SparePool:
    """The warm spares of every tenant; see the module docstring. Used from the supervisor's event loop."""

    def __init__(self, per_tenant: int, ports: set[int]) -> None:
        """``ports``: the supervisor's set of handed-out ports, shared so spares and starts never collide."""
        self.per_tenant = per_tenant
        self._ports = ports
        self._spares: dict[str, list[Spare]] = {}
        self._starting: dict[str, int] = {}
        self._tasks: dict[asyncio.Task[None], str] = {}
        self._start_tasks: set[asyncio.Task[None]] = set()
        #: Spares started but not ready yet, by tenant (a drop kills them).
        self._unready: dict[str, list[Spare]] = {}
        #: Bumped by drop(): a start that began before it must not add its spare.
        self._generation: dict[str, int] = {}
        self._closed = False

    def want(self, template: SpareTemplate, sandbox: Sandbox) -> None:
        """Make sure the tenant has ``per_tenant`` spares (ready or starting); missing ones start in the background."""
        if self._closed or self.per_tenant <= 0 or not sandbox.enabled or sandbox.cgroups is None:
            return
        tenant = template.tenant
        for dead in [s for s in self._spares.get(tenant, []) if not s.alive]:
            self._spares[tenant].remove(dead)
            self._background(self._stop(dead), tenant)
        have = len([s for s in self._spares.get(tenant, []) if s.alive]) + self._starting.get(tenant, 0)
        for _ in range(self.per_tenant - have):
            self._starting[tenant] = self._starting.get(tenant, 0) + 1
            self._background(self._start(template, sandbox, self._generation.get(tenant, 0)), tenant, starts=True)

    def _background(self, work: Coroutine[Any, Any, None], tenant: str, starts: bool = False) -> None:
        task = asyncio.create_task(work, name=f"sless-spare-{tenant}")
        self._tasks[task] = tenant
        if starts:
            self._start_tasks.add(task)
        task.add_done_callback(self._task_done)

    def take(self, argv: Sequence[str], env: Mapping[str, str], jail: JailSpec | None,
             sandbox: Sandbox | None) -> Spare | None:
        """A ready spare of the tenant that fits, taken out of the pool for good; None if there is none."""
        if jail is None or sandbox is None:
            return None
        for spare in list(self._spares.get(jail.tenant, [])):
            if spare.sandbox is sandbox and spare.is_ready and spare.alive and spare.why_not(argv, env, jail) is None:
                self._spares[jail.tenant].remove(spare)
                spare.claimed = True
                return spare
        return None

    def count(self, tenant: str) -> int:
        """Ready spares of ``tenant``."""
        return len([s for s in self._spares.get(tenant, []) if s.is_ready and s.alive])

    def tenants(self) -> list[str]:
        return [tenant for tenant, spares in self._spares.items() if spares]

    async def drop(self, tenant: str) -> None:
        """Stop the tenant's spares (its last Python function is gone), including those still starting."""
        self._generation[tenant] = self._generation.get(tenant, 0) + 1
        for spare in self._unready.get(tenant, []):
            spare.jail.kill(spare.proc.pid)  # its start sees EOF at once and cleans up
        spares = self._spares.pop(tenant, [])
        await asyncio.gather(*(self._stop(spare) for spare in spares), return_exceptions=True)
        # Never cancelled: a start interrupted inside the sandbox's set-up would leave its cgroups behind.
        pending = [task for task, owner in self._tasks.items() if owner == tenant]
        await asyncio.gather(*pending, return_exceptions=True)

    async def close(self) -> None:
        """Stop every spare; nothing starts afterwards."""
        self._closed = True
        for tenant in {*self._spares, *self._tasks.values()}:
            await self.drop(tenant)

    # ------------------------------------------------------------------ internals

    def _task_done(self, task: asyncio.Task[None]) -> None:
        tenant = self._tasks.pop(task, "")
        if task in self._start_tasks:
            self._start_tasks.discard(task)
            self._starting[tenant] = max(0, self._starting.get(tenant, 0) - 1)
        if not task.cancelled() and task.exception() is not None:
            log.warning("warm spare of %s failed to start: %s", tenant, task.exception())

    async def _start(self, template: SpareTemplate, sandbox: Sandbox, generation: int) -> None:
        port = free_port(self._ports)
        self._ports.add(port)
        cwd = template.roots[0]
        jail_spec = JailSpec(tenant=template.tenant, limits=template.limits, ro_binds=template.roots)
        prepared: Prepared | None = None
        pipe = ReadyPipe()
        spare: Spare | None = None
        try:
            if self._closed or self._generation.get(template.tenant, 0) != generation:
                raise asyncio.CancelledError  # dropped before it began
            prepared = await asyncio.to_thread(sandbox.prepare, template.argv, cwd, jail_spec,
                                               f"spare-{template.tenant}-{port}", port=port)
            if self._closed or self._generation.get(template.tenant, 0) != generation:
                raise asyncio.CancelledError  # dropped while its sandbox was being set up: no process
            env = {**dict(template.env), **prepared.env, "PORT": str(port), "SLESS_HOST": "127.0.0.1",
                   "SLESS_SPARE": "1", READY_FD_ENV: str(pipe.write_fd)}
            child = await asyncio.create_subprocess_exec(
                *prepared.argv, cwd=cwd, env=env, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
                preexec_fn=prepared.preexec, pass_fds=(*prepared.pass_fds, pipe.write_fd))
            prepared.release_fds()
            pipe.release_write()
            spare = Spare(template, sandbox, child, port, prepared, pipe)
            await asyncio.to_thread(prepared.attach)  # its own network, then the runtime starts
            unready = self._unready.setdefault(template.tenant, [])
            unready.append(spare)
            try:
                ready = await pipe.wait(SPARE_READY_SEC)
            finally:
                unready.remove(spare)
            if self._closed or self._generation.get(template.tenant, 0) != generation:
                await self._stop(spare)
                return
            if ready is not True:
                raise RuntimeError(f"the spare on port {port} was not ready within {SPARE_READY_SEC:g}s "
                                   f"(exit code {child.returncode})")
            spare.is_ready = True
            self._spares.setdefault(template.tenant, []).append(spare)
        except BaseException:
            if spare is not None:
                await self._stop(spare)
            else:
                pipe.close()
                if prepared is not None:
                    await asyncio.to_thread(prepared.cleanup)
                self._ports.discard(port)
            raise

    async def discard(self, spare: Spare) -> None:
        """Stop a taken spare that could not be claimed (it never runs the function)."""
        spare.claimed = False
        await self._stop(spare)

    async def _stop(self, spare: Spare) -> None:
        """Kill an unclaimed spare's sandbox and remove its cgroups, port rule and port."""
        if spare.claimed:
            return
        if spare.proc.returncode is None:
            spare.jail.kill(spare.proc.pid)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(spare.proc.wait(), 5.0)
        if spare.proc.stdin is not None:
            spare.proc.stdin.close()
        spare.ready.close()
        await asyncio.to_thread(spare.jail.cleanup)
        self._ports.discard(spare.port)
