"""The standalone backend: the Platform interface over SQLite state, local builds and supervised processes.

A function's life here: created (Pending) -> zip uploaded and unpacked -> Building (dependencies into a
hash-keyed cache, Go compiled) -> Ready -> served by a runtime process that the supervisor starts on
the first call and stops when idle. Routes live in memory, so the proxy never touches SQLite per call.

Every function process (server, runner, dependency install) runs in a sandbox of its tenant (sandbox.py).
Without one the platform refuses to start unless told it serves a single tenant (SLESS_SANDBOX=off).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from sless_api.backendconfig import SandboxSettings
from sless_api.buildcontext import make_build_context
from sless_api.config import ApiConfig
from sless_api.contract import check_queue_free, check_rerun
from sless_api.cron import CronScheduler
from sless_api.events.inprocess import InProcessEvents
from sless_api.invocations import InvocationLog
from sless_api.platform import (
    Background,
    CallInvoker,
    CallRef,
    Conflict,
    FunctionRecord,
    JobRecord,
    NotFound,
    TriggerRecord,
    Unavailable,
    Unsupported,
)
from sless_api.secrets import SecretMeta, SecretValues
from sless_api.secrets.factory import secret_store
from sless_api.secrets.usage import (
    checked_version,
    deliver,
    refuse_dropping_keys,
    refuse_if_used,
)
from sless_api.standalone.builder import (
    BuildArtifact,
    Builder,
    BuildFailed,
    BuildRequest,
    precompile_python_runtime,
    toolchain_paths,
)
from sless_api.standalone.calllogs import CallLogStore
from sless_api.standalone.failures import NO_REASON, caller_reason
from sless_api.standalone.firing import TriggerFiring
from sless_api.standalone.oneshot import OneShot
from sless_api.standalone.retention import (
    QuotaExceeded,
    check_tenant_quota,
    prune_stored,
    prune_versions,
)
from sless_api.standalone.routing import StandaloneRouter, process_key
from sless_api.standalone.runner import run_once
from sless_api.standalone.sandbox import Limits, Sandbox, SandboxUnavailable
from sless_api.standalone.state import StateStore, artifact_to_dict
from sless_api.standalone.supervisor import StartFailed, Supervisor
from sless_api.storage import CodeStore, context_key, function_prefixes, zip_key
from sless_api.storage.versions import newest_archive, stamp, unpack_archive
from sless_api.versions import Version, choose
from sless_api.zipsafe import ZipLimits, extract_zip, read_source_files
from sless_core import contract
from sless_core.models import FunctionSpec, JobPhase, JobSpec, Phase, TriggerSpec, TriggerType

# Runtimes whose entrypoint loads when the process starts: the build checks it (Go's build links it).
LOAD_CHECKED = ("python3.11", "nodejs20")
log = logging.getLogger("sless.standalone")
BASE_IMAGES = {"python3.11": "sless/python3.11", "nodejs20": "sless/nodejs20", "go1.23": "sless/go1.23"}


_key = process_key


def make_sandbox(settings: SandboxSettings) -> Sandbox:
    """The sandbox of this platform; refuses (SandboxUnavailable) to run tenants unconfined unless told to."""
    sandbox = Sandbox.detect(settings.mode, toolchain=toolchain_paths())
    if not sandbox.enabled and sandbox.reason != Sandbox.off().reason:
        raise SandboxUnavailable(
            f"no sandbox for function processes: {sandbox.reason}. Without one every tenant's code runs as "
            "this platform's user and can read the JWT secret, other tenants' code and environment, and "
            "signal the platform. Install bubblewrap (apt-get install bubblewrap), or, for a single "
            "trusted tenant, start with `sless up --single-tenant` (SLESS_SANDBOX=off)."
        )
    return sandbox


class StandalonePlatform:
    def __init__(self, config: ApiConfig, store: CodeStore, invocations: InvocationLog | None) -> None:
        self.config = config
        self.store = store
        self.invocations = invocations
        data = config.data_dir
        self.code_root = data / "functions"
        self.sandbox = make_sandbox(config.sandbox)
        log.info("function sandbox: %s", self.sandbox.reason)
        self.state = StateStore(data / "state.db")
        self.secrets = secret_store(config.secrets, "standalone", data)
        self.builder = Builder(data / "cache", sandbox=self.sandbox)
        self.call_logs_store = CallLogStore()
        self.supervisor = Supervisor(idle_timeout_sec=config.idle_timeout_sec, log_dir=data / "logs",
                                     call_logs=self.call_logs_store)
        self.zip_limits = ZipLimits()
        self.retention = config.retention
        self.router = StandaloneRouter(config, self.state, self.supervisor, self.secrets, self.sandbox)
        self.oneshot = OneShot(self.secrets, self.sandbox, invocations, config.sandbox)
        self.firing = TriggerFiring(self.state, self.router, self.oneshot)
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def background_services(self, invoker: CallInvoker) -> list[Background]:
        """Cron always; the event dispatcher when a broker is configured (SLESS_RABBITMQ_URL)."""
        services: list[Background] = [CronScheduler(self.firing)]
        if self.config.rabbitmq_url:
            services.append(InProcessEvents(self.firing, self.router, invoker, self.config))
        return services

    # lifecycle
    async def start(self) -> None:
        """Bring the previous run's functions back: Ready ones serve again, interrupted builds resume.

        First the Python runtime's bytecode is compiled (see ``precompile_python_runtime``).
        """
        failure = await asyncio.to_thread(precompile_python_runtime)
        if failure:
            log.warning("python runtime not precompiled, each cold start compiles it: %s", failure)
        for rec in self.state.list_functions():
            if rec.phase == Phase.BUILDING and rec.code_hash:
                self._spawn(f"build:{_key(rec.namespace, rec.spec.name)}", self._build(rec.namespace, rec.spec.name))
            elif rec.phase == Phase.READY:
                await self.router.sync(rec.namespace, rec.spec.name)
        for job in self.state.list_jobs():
            if job.phase in (JobPhase.PENDING, JobPhase.RUNNING):
                job.phase, job.message, job.completed_at = JobPhase.FAILED, "interrupted by a restart", time.time()
                self.state.save_job(job)

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        await self.supervisor.close()
        self.sandbox.close()
        self.state.close()
        self.secrets.close()

    def _spawn(self, key: str, coro: Any) -> None:
        old = self._tasks.get(key)
        if old is not None and not old.done():
            old.cancel()
        task: asyncio.Task[None] = asyncio.create_task(coro)
        self._tasks[key] = task
        task.add_done_callback(lambda t: self._tasks.pop(key, None) if self._tasks.get(key) is t else None)

    # namespaces
    async def ensure_namespace(self, namespace: str) -> bool:
        return self.state.ensure_namespace(namespace, time.time())

    # functions
    def _function(self, namespace: str, name: str) -> FunctionRecord:
        rec = self.state.get_function(namespace, name)
        if rec is None:
            raise NotFound(f"function {name!r} not found")
        return rec

    async def list_functions(self, namespace: str) -> list[FunctionRecord]:
        return self.state.list_functions(namespace)

    async def get_function(self, namespace: str, name: str) -> FunctionRecord:
        return self._function(namespace, name)

    async def create_function(self, namespace: str, spec: FunctionSpec) -> FunctionRecord:
        await checked_version(self.secrets, namespace, spec.secrets)
        self.state.ensure_namespace(namespace, time.time())
        rec = FunctionRecord(namespace=namespace, spec=spec)
        if not self.state.insert_function(rec):
            raise Conflict(f"function {spec.name!r} already exists",
                           existing=self._function(namespace, spec.name).to_api())
        return rec

    async def update_function(self, namespace: str, name: str, patch: dict[str, Any]) -> FunctionRecord:
        rec = self._function(namespace, name)
        new_spec = rec.spec.updated(patch, self.config.max_timeout_sec)
        await checked_version(self.secrets, namespace, new_spec.secrets)
        rebuild = contract.spec_change_rebuilds(rec.spec, new_spec)
        rec.spec = new_spec
        if rebuild and rec.code_hash:
            rec.phase, rec.message = Phase.BUILDING, "rebuild queued: runtime or entrypoint changed"
            self.state.save_function(rec)
            self._spawn(f"build:{_key(namespace, name)}", self._build(namespace, name))
        else:
            self.state.save_function(rec)
            await self.router.sync(namespace, name)
            if rec.phase == Phase.READY:  # a new configuration is deployed at once: a new version
                self.state.record_version(rec, time.time())
        return rec

    async def delete_function(self, namespace: str, name: str) -> None:
        self._function(namespace, name)
        task = self._tasks.get(f"build:{_key(namespace, name)}")
        if task is not None:
            task.cancel()
        self.state.delete_function(namespace, name)
        await self.router.forget(namespace, name)
        await asyncio.to_thread(self._delete_files, namespace, name)

    def _delete_files(self, namespace: str, name: str) -> None:
        shutil.rmtree(self.code_root / namespace / name, ignore_errors=True)
        for prefix in function_prefixes(namespace, name):
            self.store.delete_prefix(prefix)

    async def upload_code(self, namespace: str, name: str, zip_path: Path, code_hash: str) -> FunctionRecord:
        rec = self._function(namespace, name)
        if not contract.upload_builds(rec.code_hash, rec.phase, code_hash):
            rec.message = contract.identical_upload_message(rec.message)
            return rec
        code_dir = self.code_root / namespace / name / code_hash
        await asyncio.to_thread(self._store_code, rec, zip_path, code_dir, code_hash)
        rec.code_hash, rec.phase, rec.message = code_hash, Phase.BUILDING, "build queued"
        self.state.save_function(rec)
        self._spawn(f"build:{_key(namespace, name)}", self._build(namespace, name))
        return rec

    def _store_code(self, rec: FunctionRecord, zip_path: Path, code_dir: Path, code_hash: str) -> None:
        if not code_dir.exists():
            code_dir.parent.mkdir(parents=True, exist_ok=True)
            extract_zip(zip_path, code_dir, self.zip_limits)
            try:
                check_tenant_quota(self.code_root, rec.namespace, self.retention)
            except QuotaExceeded:
                shutil.rmtree(code_dir, ignore_errors=True)
                raise
        version = stamp(code_hash)
        self.store.put_file(zip_key(rec.namespace, rec.spec.name, version), zip_path)
        context = make_build_context(code_dir, rec.spec.runtime, rec.spec.entrypoint,
                                     BASE_IMAGES[rec.spec.runtime])
        self.store.put_bytes(context_key(rec.namespace, rec.spec.name, version), context)

    async def list_versions(self, namespace: str, name: str) -> list[Version]:
        self._function(namespace, name)
        return self.state.list_versions(namespace, name)

    async def rollback(self, namespace: str, name: str, version: int | None) -> FunctionRecord:
        """Deploy an earlier version's code and configuration again (a build from the caches, then Ready)."""
        rec = self._function(namespace, name)
        target = choose(self.state.list_versions(namespace, name), version, name)
        code_dir = self.code_root / namespace / name / target.code_hash
        if not code_dir.is_dir():
            await asyncio.to_thread(self._restore_code, namespace, name, target, code_dir)
        rec.spec = FunctionSpec.from_dict({**target.config, "name": name})
        rec.code_hash, rec.phase = target.code_hash, Phase.BUILDING
        rec.message = f"rolling back to version {target.version}"
        self.state.save_function(rec)
        self._spawn(f"build:{_key(namespace, name)}", self._build(namespace, name))
        return rec

    def _restore_code(self, namespace: str, name: str, target: Version, code_dir: Path) -> None:
        """Unpack a version's stored zip again when its folder was pruned from the disk."""
        key = newest_archive(self.store, namespace, name, target.code_hash)
        if key is None:
            raise NotFound(f"the code of version {target.version} of function {name!r} is no longer stored")
        work = self.config.data_dir / "tmp"
        work.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="restore-", dir=work) as tmp:
            unpacked = unpack_archive(self.store, key, Path(tmp), self.zip_limits)
            code_dir.parent.mkdir(parents=True, exist_ok=True)
            unpacked.rename(code_dir)

    async def get_source(self, namespace: str, name: str) -> list[dict[str, Any]]:
        rec = self._function(namespace, name)
        if not rec.code_hash:
            return []
        return await asyncio.to_thread(self._source, namespace, name, rec.code_hash)

    def _source(self, namespace: str, name: str, code_hash: str) -> list[dict[str, Any]]:
        """The uploaded archive's files (what the function wrote into its folder at run time is not source)."""
        key = newest_archive(self.store, namespace, name, code_hash)
        if key is None:
            raise NotFound(f"the code of function {name!r} is no longer stored; upload it again")
        work = self.config.data_dir / "tmp"
        work.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="source-", dir=work) as tmp:
            return read_source_files(unpack_archive(self.store, key, Path(tmp), self.zip_limits))

    async def _build(self, namespace: str, name: str) -> None:
        rec = self._function(namespace, name)
        code_hash = rec.code_hash
        assert code_hash is not None
        rec.phase, rec.message = Phase.BUILDING, "building"
        self.state.save_function(rec)
        last_progress = 0.0

        def progress(line: str) -> None:
            nonlocal last_progress
            log.info("build %s/%s: %s", namespace, name, line)
            now = time.monotonic()
            if now - last_progress > 0.5:
                last_progress = now
                current = self.state.get_function(namespace, name)
                if current is not None and current.code_hash == code_hash and current.phase == Phase.BUILDING:
                    current.message = f"building: {line}"[:500]
                    self.state.save_function(current)

        request = BuildRequest(runtime=rec.spec.runtime, code_dir=self.code_root / namespace / name / code_hash,
                               entrypoint=rec.spec.entrypoint, code_hash=code_hash, tenant=namespace)
        try:
            artifact = await asyncio.to_thread(self.builder.build, request, progress)
        except BuildFailed as exc:
            self._finish_build(namespace, name, code_hash, None, exc.log_tail)
            return
        except Exception as exc:  # a bug or a full disk must still end in a visible Failed phase
            log.exception("build of %s/%s crashed", namespace, name)
            self._finish_build(namespace, name, code_hash, None, f"build crashed: {type(exc).__name__}: {exc}")
            return
        failure = await self._check_loads(namespace, rec, artifact)
        if failure:
            self._finish_build(namespace, name, code_hash, None, failure)
            return
        self.state.set_artifact(namespace, name, artifact_to_dict(artifact))
        try:
            # Switch traffic before saying Ready, so a client that sees Ready gets the new code.
            await self.router.sync(namespace, name)
        except StartFailed as exc:
            log.warning("new version of %s/%s failed to start: %s", namespace, name, exc)
            self._finish_build(namespace, name, code_hash, None,
                               f"the new version failed to start: {caller_reason(str(exc))}")
            return
        self._finish_build(namespace, name, code_hash, artifact, "")
        await asyncio.to_thread(self._prune, namespace, name, code_hash)

    def _prune(self, namespace: str, name: str, current: str) -> None:
        """After a good build: older versions beyond the kept few leave the disk and the code store."""
        removed = prune_versions(self.code_root / namespace / name, current, self.retention)
        stored = prune_stored(self.store, namespace, name, self.retention)
        if removed or stored:
            log.info("%s/%s: removed %d old code versions and %d stored objects", namespace, name, len(removed),
                     stored)

    async def _check_loads(self, namespace: str, rec: FunctionRecord, artifact: BuildArtifact) -> str:
        """Empty when the entrypoint loads, else why not, in one line.

        Python and Node load the handler when their process starts (lazily, on the first call): without
        this check a broken import would show Ready until someone calls. A Go function that does not
        link has failed its build already.
        """
        if rec.spec.runtime not in LOAD_CHECKED:
            return ""
        limits = Limits.for_function(rec.spec.memory_mb, rec.spec.runtime, cpu_sec=int(rec.spec.timeout_sec) + 1,
                                     host=self.config.sandbox)
        secrets = await deliver(self.secrets, namespace, rec.spec.name, rec.spec.secrets)
        jail = dataclasses.replace(artifact.jail(namespace, limits), files=secrets.files)
        result = await asyncio.to_thread(run_once, artifact, {}, float(rec.spec.timeout_sec),
                                         env={**rec.spec.env_vars, **secrets.env, "SLESS_CHECK_ONLY": "1"},
                                         sandbox=self.sandbox, jail=jail)
        if result.ok:
            return ""
        log.warning("%s/%s does not load: %s", namespace, rec.spec.name, result.output)
        reason = caller_reason(result.output)
        if reason == NO_REASON and result.timed_out:
            reason = f"loading it took longer than its timeout of {rec.spec.timeout_sec}s"
        return f"the function does not load: {reason}"

    def _finish_build(self, namespace: str, name: str, code_hash: str, artifact: BuildArtifact | None,
                      failure: str) -> None:
        current = self.state.get_function(namespace, name)
        if current is None or current.code_hash != code_hash:
            return  # deleted or superseded by a newer upload while building
        if artifact is None:
            current.phase, current.message = Phase.FAILED, f"build failed:\n{failure}"[-4000:]
        else:
            current.phase, current.message = Phase.READY, "ready"
            current.last_built_at = time.time()
            current.image = f"local:{current.spec.runtime}:{code_hash[:12]}"
        self.state.save_function(current)
        if artifact is not None:
            self.state.record_version(current, current.last_built_at or time.time())

    # secrets
    async def list_secrets(self, namespace: str) -> list[SecretMeta]:
        return await asyncio.to_thread(self.secrets.list, namespace)

    async def get_secret(self, namespace: str, name: str) -> SecretMeta:
        return await asyncio.to_thread(self.secrets.get, namespace, name)

    async def create_secret(self, namespace: str, name: str, data: SecretValues) -> SecretMeta:
        self.state.ensure_namespace(namespace, time.time())
        meta = await asyncio.to_thread(self.secrets.create, namespace, name, data)
        await self._secret_changed(namespace, name)
        return meta

    async def replace_secret(self, namespace: str, name: str, data: SecretValues) -> SecretMeta:
        refuse_dropping_keys(name, data, [rec.spec for rec in self.state.list_functions(namespace)])
        meta = await asyncio.to_thread(self.secrets.replace, namespace, name, data)
        await self._secret_changed(namespace, name)
        return meta

    async def delete_secret(self, namespace: str, name: str) -> None:
        await asyncio.to_thread(self.secrets.get, namespace, name)
        refuse_if_used(name, [rec.spec for rec in self.state.list_functions(namespace)])
        await asyncio.to_thread(self.secrets.delete, namespace, name)

    async def _secret_changed(self, namespace: str, name: str) -> None:
        """Every function using secret NAME gets a process of the new version (it reads values at start)."""
        for rec in self.state.list_functions(namespace):
            if any(ref.name == name for ref in rec.spec.secrets):
                log.info("%s/%s: secret %r changed: restarting", namespace, rec.spec.name, name)
                await self.router.sync(namespace, rec.spec.name)

    async def call_logs(self, namespace: str, name: str, call: CallRef) -> dict[str, Any]:
        """Kept in memory as the function's processes wrote them (see calllogs.py)."""
        found = self.call_logs_store.get(_key(namespace, name), call.request_id)
        return found if found is not None else {"lines": [], "truncated": False}

    # triggers
    def _trigger(self, namespace: str, name: str) -> TriggerRecord:
        rec = self.state.get_trigger(namespace, name)
        if rec is None:
            raise NotFound(f"trigger {name!r} not found")
        return rec

    async def list_triggers(self, namespace: str) -> list[TriggerRecord]:
        return self.state.list_triggers(namespace)

    async def get_trigger(self, namespace: str, name: str) -> TriggerRecord:
        return self._trigger(namespace, name)

    def _check_trigger(self, namespace: str, spec: TriggerSpec) -> None:
        if spec.type == TriggerType.EVENT:
            if not self.config.rabbitmq_url:
                raise Unsupported("event triggers need RabbitMQ: set SLESS_RABBITMQ_URL (not supported by this "
                                  "installation yet)")
            check_queue_free(spec, self.state.list_triggers(namespace))
        self._function(namespace, spec.function)

    async def create_trigger(self, namespace: str, spec: TriggerSpec) -> TriggerRecord:
        self._check_trigger(namespace, spec)
        rec = TriggerRecord(namespace=namespace, spec=spec)
        if not self.state.insert_trigger(rec):
            raise Conflict(f"trigger {spec.name!r} already exists",
                           existing=self._trigger(namespace, spec.name).to_api())
        await self._trigger_changed(namespace, spec.function)
        return rec

    async def patch_trigger(self, namespace: str, name: str, patch: dict[str, Any]) -> TriggerRecord:
        rec = self._trigger(namespace, name)
        old_function = rec.spec.function
        rec.spec = rec.spec.patched(patch)
        self._check_trigger(namespace, rec.spec)
        self.state.save_trigger(rec)
        await self._trigger_changed(namespace, rec.spec.function)
        if old_function != rec.spec.function:
            await self._trigger_changed(namespace, old_function)
        return rec

    async def delete_trigger(self, namespace: str, name: str) -> None:
        rec = self._trigger(namespace, name)
        self.state.delete_trigger(namespace, name)
        await self._trigger_changed(namespace, rec.spec.function)

    async def _trigger_changed(self, namespace: str, function: str) -> None:
        await self.router.sync(namespace, function)
        self.router.changed()

    # jobs
    def _job(self, namespace: str, name: str) -> JobRecord:
        rec = self.state.get_job(namespace, name)
        if rec is None:
            raise NotFound(f"job {name!r} not found")
        return rec

    async def create_job(self, namespace: str, spec: JobSpec) -> JobRecord:
        self._function(namespace, spec.function)
        rec = JobRecord(namespace=namespace, spec=spec)
        if spec.run_id == 0:
            rec.phase, rec.message = JobPhase.RECORDED, contract.RECORDED_MESSAGE
        if not self.state.insert_job(rec):
            existing = self._job(namespace, spec.name)
            raise Conflict(f"job {spec.name!r} already exists", existing=existing.to_api())
        if spec.run_id > 0:
            self._spawn(f"job:{_key(namespace, spec.name)}", self._run_job(namespace, spec.name))
        return rec

    async def list_jobs(self, namespace: str) -> list[JobRecord]:
        return self.state.list_jobs(namespace)

    async def get_job(self, namespace: str, name: str) -> JobRecord:
        return self._job(namespace, name)

    async def rerun_job(self, namespace: str, name: str, run_id: int) -> JobRecord:
        rec = self._job(namespace, name)
        if check_rerun(rec, run_id) is contract.Rerun.NOTHING:
            return rec
        rec.spec.run_id = run_id
        rec.phase, rec.message, rec.started_at, rec.completed_at = JobPhase.PENDING, "", None, None
        self.state.save_job(rec)
        self._spawn(f"job:{_key(namespace, name)}", self._run_job(namespace, name))
        return rec

    async def delete_job(self, namespace: str, name: str) -> None:
        self._job(namespace, name)
        task = self._tasks.get(f"job:{_key(namespace, name)}")
        if task is not None:
            task.cancel()
        self.state.delete_job(namespace, name)

    async def _wait_ready(self, namespace: str, function: str, limit_sec: float = 900) -> FunctionRecord:
        deadline = time.monotonic() + limit_sec
        while True:
            fn = self._function(namespace, function)
            if fn.phase in (Phase.READY, Phase.FAILED) or time.monotonic() > deadline:
                return fn
            if fn.phase == Phase.PENDING and not fn.code_hash:
                return fn
            await asyncio.sleep(0.2)

    async def _run_job(self, namespace: str, name: str) -> None:
        rec = self._job(namespace, name)
        try:
            fn = await self._wait_ready(namespace, rec.spec.function)
            artifact = self.state.get_artifact(namespace, rec.spec.function)
            if fn.phase != Phase.READY or artifact is None:
                raise Unavailable(f"function {fn.spec.name!r} is not ready (phase {fn.phase}): {fn.message}")
            rec.phase, rec.started_at = JobPhase.RUNNING, time.time()
            self.state.save_job(rec)
            started = time.monotonic()
            result = await self.oneshot.run(namespace, fn, artifact, rec.spec.event)
            rec.phase = JobPhase.SUCCEEDED if result.ok else JobPhase.FAILED
            rec.message = result.output
            self.oneshot.record(namespace, fn.spec.name, f"/jobs/{rec.spec.name}", "job", rec.spec.event, result,
                             started)
        except (NotFound, Unavailable) as exc:
            rec.phase, rec.message = JobPhase.FAILED, exc.message
        rec.completed_at = time.time()
        if self.state.get_job(namespace, name) is not None:
            self.state.save_job(rec)
