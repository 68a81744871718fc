"""Functions of the standalone backend: create, change, upload, roll back, delete.

A function's life here: created (Pending) -> zip uploaded and unpacked -> Building (builds.py) -> Ready
-> served by a runtime process that the supervisor starts on the first call and stops when idle
(routing.py). A change of configuration alone redeploys at once; one of runtime or entrypoint rebuilds.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from sless_api.backends.settings import PlatformSettings
from sless_api.backends.standalone import limits
from sless_api.backends.standalone.builds import Builds
from sless_api.backends.standalone.code import CodeFiles
from sless_api.backends.standalone.routing import StandaloneRouter, process_key
from sless_api.backends.standalone.state import StateStore, require_function
from sless_api.backends.standalone.tasks import TaskSet
from sless_api.domain.errors import Conflict, Unsupported
from sless_api.domain.records import FunctionRecord
from sless_api.domain.versions import Version, choose
from sless_api.stores.secrets.store import SecretStore
from sless_api.stores.secrets.usage import checked_version
from sless_core import contract
from sless_core.models import FunctionSpec, Phase


def refuse_sandbox(spec: FunctionSpec) -> None:
    """A function that requires a stronger sandbox (gVisor) cannot get it here: refused, never run with less."""
    if spec.sandbox:
        raise Unsupported(f"sandbox {spec.sandbox!r} needs the kubernetes backend (a RuntimeClass); "
                          "the standalone backend runs functions in its own process sandbox only")


def build_task(namespace: str, name: str) -> str:
    """The task key of a function's build: a new one replaces (cancels) the one in progress."""
    return f"build:{process_key(namespace, name)}"


class Functions:
    def __init__(self, config: PlatformSettings, state: StateStore, secrets: SecretStore, router: StandaloneRouter,
                 code: CodeFiles, builds: Builds, tasks: TaskSet) -> None:
        self.config = config
        self.state = state
        self.secrets = secrets
        self.router = router
        self.code = code
        self.builds = builds
        self.tasks = tasks

    def build(self, namespace: str, name: str) -> None:
        """Start (or restart) the build of the function's current code."""
        self.tasks.spawn(build_task(namespace, name), self.builds.build(namespace, name))

    async def drop_split(self, namespace: str, name: str) -> None:
        """A deploy (upload that builds, update, rollback) drops the function's traffic split."""
        if self.state.clear_traffic(namespace, name):
            await self.router.drop_split(namespace, name)

    async def list_functions(self, namespace: str) -> list[FunctionRecord]:
        return self.state.list_functions(namespace)

    async def get_function(self, namespace: str, name: str) -> FunctionRecord:
        return require_function(self.state, namespace, name)

    async def create_function(self, namespace: str, spec: FunctionSpec) -> FunctionRecord:
        refuse_sandbox(spec)
        await checked_version(self.secrets, namespace, spec.secrets)
        self.state.ensure_namespace(namespace, time.time())
        rec = FunctionRecord(namespace=namespace, spec=spec)
        if not limits.insert_within("functions", f"function {spec.name!r}", self.config.tenant_limits.functions,
                                    lambda limit: self.state.insert_function(rec, limit)):
            raise Conflict(f"function {spec.name!r} already exists",
                           existing=require_function(self.state, namespace, spec.name).to_api())
        return rec

    async def update_function(self, namespace: str, name: str, patch: dict[str, Any]) -> FunctionRecord:
        rec = require_function(self.state, namespace, name)
        new_spec = rec.spec.updated(patch, self.config.max_timeout_sec)
        refuse_sandbox(new_spec)
        await checked_version(self.secrets, namespace, new_spec.secrets)
        rebuild = contract.spec_change_rebuilds(rec.spec, new_spec)
        rec.spec = new_spec
        await self.drop_split(namespace, name)
        if rebuild and rec.code_hash:
            rec.phase, rec.message = Phase.BUILDING, "rebuild queued: runtime or entrypoint changed"
            self.state.save_function(rec)
            self.build(namespace, name)
        else:
            self.state.save_function(rec)
            await self.router.sync(namespace, name)
            if rec.phase == Phase.READY:  # a new configuration is deployed at once: a new version
                self.state.record_version(rec, time.time())
        return rec

    async def delete_function(self, namespace: str, name: str) -> None:
        require_function(self.state, namespace, name)
        self.tasks.cancel(build_task(namespace, name))
        self.state.delete_function(namespace, name)
        await self.router.forget(namespace, name)
        await asyncio.to_thread(self.code.delete, namespace, name)

    async def upload_code(self, namespace: str, name: str, zip_path: Path, code_hash: str) -> FunctionRecord:
        rec = require_function(self.state, namespace, name)
        if not contract.upload_builds(rec.code_hash, rec.phase, code_hash):
            rec.message = contract.identical_upload_message(rec.message)
            return rec
        await asyncio.to_thread(self.code.store_upload, rec, zip_path, code_hash)
        await self.drop_split(namespace, name)
        rec.code_hash, rec.phase, rec.message = code_hash, Phase.BUILDING, "build queued"
        self.state.save_function(rec)
        self.build(namespace, name)
        return rec

    async def list_versions(self, namespace: str, name: str) -> list[Version]:
        require_function(self.state, namespace, name)
        return self.state.list_versions(namespace, name)

    async def rollback(self, namespace: str, name: str, version: int | None) -> FunctionRecord:
        """Deploy an earlier version's code and configuration again (a build from the caches, then Ready)."""
        rec = require_function(self.state, namespace, name)
        target = choose(self.state.list_versions(namespace, name), version, name)
        spec = FunctionSpec.from_dict({**target.config, "name": name})
        # A secret or key the version read may have been deleted since (nothing used it then): 400, as for an update.
        await checked_version(self.secrets, namespace, spec.secrets)
        await asyncio.to_thread(self.code.ensure_unpacked, namespace, name, target)
        await self.drop_split(namespace, name)
        rec.spec = spec
        rec.code_hash, rec.phase = target.code_hash, Phase.BUILDING
        rec.message = f"rolling back to version {target.version}"
        self.state.save_function(rec)
        self.build(namespace, name)
        return rec

    async def get_source(self, namespace: str, name: str) -> list[dict[str, Any]]:
        rec = require_function(self.state, namespace, name)
        if not rec.code_hash:
            return []
        return await asyncio.to_thread(self.code.source, namespace, name, rec.code_hash)
