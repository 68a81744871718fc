"""The standalone backend: the Platform interface over SQLite state, local builds and supervised processes.

This module only composes; each part has a module of its own:

- ``functions.py`` (create, change, upload, roll back, delete), ``builds.py`` (code to Ready), ``code.py``
  (unpacked versions and the code store);
- ``triggers.py`` (trigger CRUD), ``jobs.py`` (jobs and their runs), ``tenantsecrets.py`` (secrets);
- ``routing.py`` (the router: routes in memory and the supervised processes behind them), ``firing.py``
  (what cron and the event dispatcher call), ``oneshot.py`` (one run of a runner), ``state.py`` (SQLite).

Every function process (server, runner, dependency install) runs in a sandbox of its tenant (sandbox.py).
Without one the platform refuses to start unless told it serves a single tenant (SLESS_SANDBOX=off).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from sless_api.backends.settings import PlatformSettings, SandboxSettings
from sless_api.backends.standalone.builder import Builder, precompile_python_runtime, toolchain_paths
from sless_api.backends.standalone.builds import Builds
from sless_api.backends.standalone.code import CodeFiles
from sless_api.backends.standalone.firing import TriggerFiring
from sless_api.backends.standalone.functions import Functions
from sless_api.backends.standalone.host.calllogs import CallLogStore
from sless_api.backends.standalone.host.sandbox import Sandbox, SandboxUnavailable
from sless_api.backends.standalone.host.supervisor import Supervisor
from sless_api.backends.standalone.jobs import Jobs
from sless_api.backends.standalone.oneshot import OneShot
from sless_api.backends.standalone.routing import StandaloneRouter, process_key
from sless_api.backends.standalone.state import StateStore
from sless_api.backends.standalone.tasks import TaskSet
from sless_api.backends.standalone.tenantsecrets import TenantSecrets
from sless_api.backends.standalone.traffic import Traffic
from sless_api.backends.standalone.triggers import Triggers
from sless_api.domain.ports import Background, CallInvoker
from sless_api.domain.records import FunctionRecord, JobRecord, TriggerRecord
from sless_api.domain.routing import CallRef
from sless_api.domain.versions import Version
from sless_api.domain.zipsafe import ZipLimits
from sless_api.services.cron import CronScheduler
from sless_api.services.events.inprocess import InProcessEvents
from sless_api.stores.code import CodeStore
from sless_api.stores.invocations import InvocationLog
from sless_api.stores.secrets import SecretMeta, SecretValues
from sless_api.stores.secrets.factory import secret_store
from sless_core.models import FunctionSpec, JobSpec, Phase, TriggerSpec
from sless_core.traffic import TrafficSplit

log = logging.getLogger("sless.standalone")


def make_sandbox(settings: SandboxSettings) -> Sandbox:
    """The sandbox of this platform; refuses (SandboxUnavailable) to run tenants unconfined unless told to."""
    sandbox = Sandbox.detect(settings.mode, toolchain=toolchain_paths(), network=settings.network,
                             host_ports=settings.host_ports)
    if not sandbox.enabled and sandbox.reason != Sandbox.off().reason:
        raise SandboxUnavailable(
            f"no sandbox for function processes: {sandbox.reason}. Without one every tenant's code runs as "
            "this platform's user and can read the JWT secret, other tenants' code and environment, and "
            "signal the platform. Install bubblewrap (apt-get install bubblewrap), or, for a single "
            "trusted tenant, start with `sless up --single-tenant` (SLESS_SANDBOX=off)."
        )
    return sandbox


class StandalonePlatform:
    def __init__(self, config: PlatformSettings, store: CodeStore, invocations: InvocationLog | None) -> None:
        self.config = config
        data = config.data_dir
        self.sandbox = make_sandbox(config.sandbox)
        log.info("function sandbox: %s", self.sandbox.reason)
        self.state = StateStore(data / "state.db")
        self.secrets = secret_store(config.secrets, data)
        self.call_logs_store = CallLogStore()
        self.supervisor = Supervisor(idle_timeout_sec=config.idle_timeout_sec, log_dir=data / "logs",
                                     call_logs=self.call_logs_store, warm_spares=config.warm_spares)
        self.tasks = TaskSet()
        self.router = StandaloneRouter(config, self.state, self.supervisor, self.secrets, self.sandbox)
        code = CodeFiles(data / "functions", data / "tmp", store, ZipLimits(), config.retention)
        builder = Builder(data / "cache", sandbox=self.sandbox)
        builds = Builds(self.state, builder, self.router, self.secrets, self.sandbox, config.sandbox, code)
        self.traffic = Traffic(self.state, self.router, code, builder)
        self.functions = Functions(config, self.state, self.secrets, self.router, code, builds, self.tasks)
        self.triggers = Triggers(config, self.state, self.router)
        oneshot = OneShot(self.secrets, self.sandbox, invocations, config.sandbox, self.call_logs_store)
        self.jobs = Jobs(self.state, oneshot, self.tasks, config.tenant_limits.jobs)
        self.tenant_secrets = TenantSecrets(self.state, self.secrets, self.router)
        self.firing = TriggerFiring(self.state, self.router, oneshot)

    def background_services(self, invoker: CallInvoker) -> list[Background]:
        """Cron always; the event dispatcher when a broker is configured (SLESS_RABBITMQ_URL)."""
        services: list[Background] = [CronScheduler(self.firing)]
        if self.config.rabbitmq_url:
            assert self.config.events is not None  # with SLESS_RABBITMQ_URL, the config has the dispatcher's
            services.append(InProcessEvents(self.firing, self.router, invoker, self.config.events,
                                            self.config.data_dir / "state.db", self.config.max_body_bytes))
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
                self.functions.build(rec.namespace, rec.spec.name)
            elif rec.phase == Phase.READY:
                await self.router.sync(rec.namespace, rec.spec.name)
        self.jobs.fail_interrupted()

    async def close(self) -> None:
        await self.tasks.close()
        await self.supervisor.close()
        self.sandbox.close()
        self.state.close()
        self.secrets.close()

    async def ensure_namespace(self, namespace: str) -> bool:
        return self.state.ensure_namespace(namespace, time.time())

    async def call_logs(self, namespace: str, name: str, call: CallRef) -> dict[str, Any]:
        """Kept in memory as the function's processes wrote them (see calllogs.py)."""
        found = self.call_logs_store.get(process_key(namespace, name), call.request_id)
        other = self.router.split_process(namespace, name)
        if found is None and other is not None:  # a call the split's other version answered
            found = self.call_logs_store.get(other, call.request_id)
        return found if found is not None else {"lines": [], "truncated": False}

    # functions (functions.py)
    async def list_functions(self, namespace: str) -> list[FunctionRecord]:
        return await self.functions.list_functions(namespace)

    async def get_function(self, namespace: str, name: str) -> FunctionRecord:
        return await self.functions.get_function(namespace, name)

    async def create_function(self, namespace: str, spec: FunctionSpec) -> FunctionRecord:
        return await self.functions.create_function(namespace, spec)

    async def update_function(self, namespace: str, name: str, patch: dict[str, Any]) -> FunctionRecord:
        return await self.functions.update_function(namespace, name, patch)

    async def delete_function(self, namespace: str, name: str) -> None:
        await self.functions.delete_function(namespace, name)

    async def upload_code(self, namespace: str, name: str, zip_path: Path, code_hash: str) -> FunctionRecord:
        return await self.functions.upload_code(namespace, name, zip_path, code_hash)

    async def get_source(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return await self.functions.get_source(namespace, name)

    async def list_versions(self, namespace: str, name: str) -> list[Version]:
        return await self.functions.list_versions(namespace, name)

    async def rollback(self, namespace: str, name: str, version: int | None) -> FunctionRecord:
        return await self.functions.rollback(namespace, name, version)

    # traffic splits (traffic.py)
    async def get_traffic(self, namespace: str, name: str) -> TrafficSplit | None:
        return await self.traffic.get_traffic(namespace, name)

    async def set_traffic(self, namespace: str, name: str, split: TrafficSplit) -> TrafficSplit:
        return await self.traffic.set_traffic(namespace, name, split)

    async def clear_traffic(self, namespace: str, name: str) -> bool:
        return await self.traffic.clear_traffic(namespace, name)

    # triggers (triggers.py)
    async def list_triggers(self, namespace: str) -> list[TriggerRecord]:
        return await self.triggers.list_triggers(namespace)

    async def get_trigger(self, namespace: str, name: str) -> TriggerRecord:
        return await self.triggers.get_trigger(namespace, name)

    async def create_trigger(self, namespace: str, spec: TriggerSpec) -> TriggerRecord:
        return await self.triggers.create_trigger(namespace, spec)

    async def patch_trigger(self, namespace: str, name: str, patch: dict[str, Any]) -> TriggerRecord:
        return await self.triggers.patch_trigger(namespace, name, patch)

    async def delete_trigger(self, namespace: str, name: str) -> None:
        await self.triggers.delete_trigger(namespace, name)

    # jobs (jobs.py)
    async def list_jobs(self, namespace: str) -> list[JobRecord]:
        return await self.jobs.list_jobs(namespace)

    async def create_job(self, namespace: str, spec: JobSpec) -> JobRecord:
        return await self.jobs.create_job(namespace, spec)

    async def get_job(self, namespace: str, name: str) -> JobRecord:
        return await self.jobs.get_job(namespace, name)

    async def rerun_job(self, namespace: str, name: str, run_id: int) -> JobRecord:
        return await self.jobs.rerun_job(namespace, name, run_id)

    async def delete_job(self, namespace: str, name: str) -> None:
        await self.jobs.delete_job(namespace, name)

    # secrets (tenantsecrets.py)
    async def list_secrets(self, namespace: str) -> list[SecretMeta]:
        return await self.tenant_secrets.list_secrets(namespace)

    async def get_secret(self, namespace: str, name: str) -> SecretMeta:
        return await self.tenant_secrets.get_secret(namespace, name)

    async def create_secret(self, namespace: str, name: str, data: SecretValues) -> SecretMeta:
        return await self.tenant_secrets.create_secret(namespace, name, data)

    async def replace_secret(self, namespace: str, name: str, data: SecretValues) -> SecretMeta:
        return await self.tenant_secrets.replace_secret(namespace, name, data)

    async def delete_secret(self, namespace: str, name: str) -> None:
        await self.tenant_secrets.delete_secret(namespace, name)
