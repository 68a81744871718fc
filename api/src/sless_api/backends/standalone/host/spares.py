"""Warm spares: pre-started, sandboxed runtime processes (Python, Node) that a cold start takes over.

Most of a Python or Node function's cold start is not its code: it is the interpreter, the runtime's imports
and the sandbox (bwrap, setpriv, cgroups). A spare has done all that ahead of time and waits, listening on its
port, for a claim on its stdin (``sless_server.wait_for_claim``, ``sless-spare.js``); a cold start then costs
the claim, the load of the handler and the runtime's readiness byte. A Go function has no spare: its server is
the function's own binary, built per function, so no process can be started before the claim names the
function, and a compiled binary has no interpreter start-up to save; what a Go cold start spends is the
sandbox's set-up. The rules, because tenants' code is hostile:

- a spare belongs to one tenant and one runtime (``SpareTemplate.runtime``): it runs in that tenant's sandbox
  exactly as the tenant's function processes do (its uid, PID namespace, limits), and its mount view holds
  the toolchain and that tenant's own code folder (``functions/<ns>``) and dependency folder, read-only;
  nothing of another tenant, nothing of the data dir;
- it is used once: a claimed spare is that function's process from then on and never goes back to the pool;
- the function's environment and its secrets reach it only in the claim, over a pipe only the supervisor
  holds; before the claim it has the platform's start-time variables and nothing else, and no tenant code
  has run in it. Secrets referenced as files are written by the runtime into a 0500 folder of its private
  /tmp (``SPARE_SECRETS_DIR``): readable by that process alone, as with a normal start, but owned by the
  tenant's uid, so unlike the read-only copies of a normal start the function could change them;
- the function's memory limit is set on the spare's own memory cgroup before the claim is sent; the other
  limits (pids, rlimits, the size of /tmp) must already be the function's, or the spare does not fit;
- variables read when an interpreter starts (``START_TIME_PREFIXES`` of its runtime: for Python ``PYTHON*``,
  for Node ``NODE_*`` (``NODE_OPTIONS``, ``NODE_PATH`` ...), ``UV_*``, ``OPENSSL_*``, ``SSL_CERT_*``; for both
  ``LD_*``, ``MALLOC_*``, ``GLIBC_*``, locale, ``TZ``) must be the same in the function's environment as in
  the spare's, or the spare does not fit: setting them at the claim would be too late. ``NODE_ENV`` is the one
  exception (``CLAIM_TIME``): node itself never reads it, only code loaded after the claim does. A function
  that does not fit gets a normal cold start. (The memory limit is no start-time setting for Node: in the
  sandbox node does not see its cgroup, so its heap limit is the same whatever the limit at its start.)

The pool keeps ``per_tenant`` spares for each tenant and runtime the supervisor asks it to (a tenant with a
deployed Python function and a Node function has ``per_tenant`` of each); a claim is followed by a new spare
in the background, once the first call on the claimed process has ended (supervisor.py: a start beside that
call slowed it down). A tenant's spares of a runtime stop when its last function that may use them is removed,
all of them when the supervisor closes; a spare's cgroups and port rule go with it.
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

#: A pool of spares: (tenant, runtime).
Kind = tuple[str, str]

#: Where a claimed spare's runtime writes the function's secret files (inside its private /tmp).
SPARE_SECRETS_DIR = "/tmp/.sless-secrets"  # noqa: S108 - the sandbox's own tmpfs
#: Prefixes of variables libc (the dynamic loader, malloc, locale, time zone) reads when any process starts.
LIBC_START_TIME = ("LD_", "MALLOC_", "GLIBC_", "LANG", "LC_", "TZ")
#: Prefixes of variables each runtime's interpreter reads at start: they must match between spare and function.
START_TIME_PREFIXES: dict[str, tuple[str, ...]] = {
    "python3.11": ("PYTHON", *LIBC_START_TIME),
    # NODE_OPTIONS, NODE_PATH, NODE_EXTRA_CA_CERTS ...; libuv's UV_THREADPOOL_SIZE; OpenSSL's configuration.
    "nodejs20": ("NODE_", "UV_", "OPENSSL_", "SSL_CERT_", *LIBC_START_TIME),
}
#: The runtimes that have warm spares (their servers implement SLESS_SPARE; Go's server is the function's binary).
SPARE_RUNTIMES = frozenset(START_TIME_PREFIXES)
#: Variables under those prefixes that no runtime reads at start, only the function's code (loaded after the
#: claim): they may differ, the claim sets them.
CLAIM_TIME = frozenset({"NODE_ENV"})
#: For a runtime not listed: every prefix above (the strictest fit).
_ANY_RUNTIME = tuple(dict.fromkeys(p for prefixes in START_TIME_PREFIXES.values() for p in prefixes))
#: How long a spare may take to be ready before it is given up.
SPARE_READY_SEC = 30.0
#: Waits before a failed spare start is tried again (then it is left until the tenant's next claim or deploy).
START_RETRY_DELAYS_SEC = (0.5, 2.0)


def start_time_env(env: Mapping[str, str], runtime: str = "python3.11") -> dict[str, str]:
    """The variables of ``env`` the interpreter of ``runtime`` reads when it starts."""
    prefixes = START_TIME_PREFIXES.get(runtime, _ANY_RUNTIME)
    return {k: v for k, v in env.items() if k.startswith(prefixes) and k not in CLAIM_TIME}


@dataclass(frozen=True)
class SpareTemplate:
    """How a tenant's spares start; what every function they may become shares.

    ``env`` comes from the platform alone (never a function's variables or secrets): PATH and the start-time
    variables. ``roots``: the read-only folders besides the toolchain, the tenant's code folder first (also
    the spare's working directory until the claim). ``runtime``: which start-time variables must match, and
    the pool a spare is counted in (a tenant keeps spares of each runtime it deploys).
    """

    tenant: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    roots: tuple[Path, ...]
    limits: Limits
    runtime: str = "python3.11"

    @property
    def kind(self) -> Kind:
        """The pool this template's spares belong to: its tenant and runtime."""
        return (self.tenant, self.runtime)


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
        if start_time_env(env, template.runtime) != start_time_env(dict(template.env), template.runtime):
            return "other start-time variables"
        return None


class SparePool:
    """The warm spares of every tenant and runtime; see the module docstring. Used from the supervisor's event loop.

    Everything is kept by :data:`Kind` (tenant, runtime): ``per_tenant`` spares of each kind that is wanted.
    """

    def __init__(self, per_tenant: int, ports: set[int]) -> None:
        """``ports``: the supervisor's set of handed-out ports, shared so spares and starts never collide."""
        self.per_tenant = per_tenant
        self._ports = ports
        self._spares: dict[Kind, list[Spare]] = {}
        self._starting: dict[Kind, int] = {}
        self._tasks: dict[asyncio.Task[None], Kind] = {}
        self._start_tasks: set[asyncio.Task[None]] = set()
        #: Spares started but not ready yet, by kind (a drop kills them).
        self._unready: dict[Kind, list[Spare]] = {}
        #: Bumped by drop(): a start that began before it must not add its spare.
        self._generation: dict[Kind, int] = {}
        self._closed = False

    def want(self, template: SpareTemplate, sandbox: Sandbox) -> None:
        """Make sure the template's kind has ``per_tenant`` spares (ready or starting); missing ones start in the
        background."""
        if self._closed or self.per_tenant <= 0 or not sandbox.enabled or sandbox.cgroups is None:
            return
        kind = template.kind
        for dead in [s for s in self._spares.get(kind, []) if not s.alive]:
            self._spares[kind].remove(dead)
            self._background(self._stop(dead), kind)
        have = len([s for s in self._spares.get(kind, []) if s.alive]) + self._starting.get(kind, 0)
        for _ in range(self.per_tenant - have):
            self._starting[kind] = self._starting.get(kind, 0) + 1
            self._background(self._start_retried(template, sandbox, self._generation.get(kind, 0)), kind,
                             starts=True)

    def _background(self, work: Coroutine[Any, Any, None], kind: Kind, starts: bool = False) -> None:
        task = asyncio.create_task(work, name=f"sless-spare-{kind[0]}-{kind[1]}")
        self._tasks[task] = kind
        if starts:
            self._start_tasks.add(task)
        task.add_done_callback(self._task_done)

    def take(self, argv: Sequence[str], env: Mapping[str, str], jail: JailSpec | None,
             sandbox: Sandbox | None) -> Spare | None:
        """A ready spare of the tenant that fits, taken out of the pool for good; None if there is none."""
        if jail is None or sandbox is None:
            return None
        for kind in self._kinds(jail.tenant):
            for spare in list(self._spares.get(kind, [])):
                if (spare.sandbox is sandbox and spare.is_ready and spare.alive
                        and spare.why_not(argv, env, jail) is None):
                    self._spares[kind].remove(spare)
                    spare.claimed = True
                    return spare
        return None

    def spares(self, tenant: str, runtime: str | None = None) -> list[Spare]:
        """The tenant's spares in the pool (ready or not yet noticed dead), of ``runtime`` or of every runtime."""
        return [spare for kind in self._kinds(tenant, runtime) for spare in self._spares.get(kind, [])]

    def count(self, tenant: str, runtime: str | None = None) -> int:
        """Ready spares of ``tenant`` (of ``runtime``, or of every runtime)."""
        return len([s for s in self.spares(tenant, runtime) if s.is_ready and s.alive])

    def starting(self, tenant: str, runtime: str | None = None) -> int:
        """Spares of ``tenant`` (of ``runtime``, or of every runtime) whose start is under way."""
        return sum(self._starting.get(kind, 0) for kind in self._kinds(tenant, runtime))

    def tenants(self) -> list[str]:
        return list(dict.fromkeys(tenant for (tenant, _), spares in self._spares.items() if spares))

    def _kinds(self, tenant: str, runtime: str | None = None) -> list[Kind]:
        """The kinds of ``tenant`` the pool knows (spares, starts), of ``runtime`` or all of them."""
        known = {*self._spares, *self._tasks.values(), *self._unready}
        return [kind for kind in known if kind[0] == tenant and runtime in (None, kind[1])]

    async def drop(self, tenant: str, runtime: str | None = None) -> None:
        """Stop the tenant's spares of ``runtime`` (None: of every runtime), including those still starting: its
        last function that may use them is gone."""
        await asyncio.gather(*(self._drop(kind) for kind in self._kinds(tenant, runtime)), return_exceptions=True)

    async def _drop(self, kind: Kind) -> None:
        self._generation[kind] = self._generation.get(kind, 0) + 1
        for spare in self._unready.get(kind, []):
            spare.jail.kill(spare.proc.pid)  # its start sees EOF at once and cleans up
        spares = self._spares.pop(kind, [])
        await asyncio.gather(*(self._stop(spare) for spare in spares), return_exceptions=True)
        # Never cancelled: a start interrupted inside the sandbox's set-up would leave its cgroups behind.
        pending = [task for task, owner in self._tasks.items() if owner == kind]
        await asyncio.gather(*pending, return_exceptions=True)

    async def close(self) -> None:
        """Stop every spare; nothing starts afterwards."""
        self._closed = True
        for kind in {*self._spares, *self._tasks.values()}:
            await self._drop(kind)

    # ------------------------------------------------------------------ internals

    def _task_done(self, task: asyncio.Task[None]) -> None:
        kind = self._tasks.pop(task, ("", ""))
        if task in self._start_tasks:
            self._start_tasks.discard(task)
            self._starting[kind] = max(0, self._starting.get(kind, 0) - 1)
        if not task.cancelled() and task.exception() is not None:
            log.warning("warm spare (%s) of %s failed to start: %s", kind[1], kind[0], task.exception())

    def _current(self, kind: Kind, generation: int) -> bool:
        """Whether a start that began at ``generation`` may still go on (no drop or close since)."""
        return not self._closed and self._generation.get(kind, 0) == generation

    async def _start_retried(self, template: SpareTemplate, sandbox: Sandbox, generation: int) -> None:
        """``_start``, tried again after a failure (a sandbox set-up that broke under load), so a tenant is not left
        without its spare until its next claim; the last failure is raised (``_task_done`` logs it)."""
        for delay in (*START_RETRY_DELAYS_SEC, None):
            try:
                await self._start(template, sandbox, generation)
                return
            except Exception as exc:
                if delay is None or not self._current(template.kind, generation):
                    raise
                log.info("warm spare (%s) of %s failed to start, trying again in %gs: %s", template.runtime,
                         template.tenant, delay, exc)
                await asyncio.sleep(delay)

    async def _start(self, template: SpareTemplate, sandbox: Sandbox, generation: int) -> None:
        kind = template.kind
        port = free_port(self._ports)
        self._ports.add(port)
        cwd = template.roots[0]
        jail_spec = JailSpec(tenant=template.tenant, limits=template.limits, ro_binds=template.roots)
        prepared: Prepared | None = None
        pipe = ReadyPipe()
        spare: Spare | None = None
        try:
            if not self._current(kind, generation):
                raise asyncio.CancelledError  # dropped before it began
            prepared = await asyncio.to_thread(sandbox.prepare, template.argv, cwd, jail_spec,
                                               f"spare-{template.tenant}-{port}", port=port)
            if not self._current(kind, generation):
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
            unready = self._unready.setdefault(kind, [])
            unready.append(spare)
            try:
                ready = await pipe.wait(SPARE_READY_SEC)
            finally:
                unready.remove(spare)
            if not self._current(kind, generation):
                await self._stop(spare)
                return
            if ready is not True:
                raise RuntimeError(f"the spare on port {port} was not ready within {SPARE_READY_SEC:g}s "
                                   f"(exit code {child.returncode})")
            spare.is_ready = True
            self._spares.setdefault(kind, []).append(spare)
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
