"""Builds of the standalone backend: an uploaded version's code to a Ready function, or a Failed one.

Dependencies go into a hash-keyed cache and Go is compiled (builder.py); Python and Node entrypoints are
then loaded once (a broken import fails the build, not the first call); traffic switches to the new
version before the function says Ready; older versions beyond the kept few are pruned.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from sless_api import tracing
from sless_api.backends.settings import SandboxSettings
from sless_api.backends.standalone.builder import BuildArtifact, Builder, BuildFailed, BuildRequest
from sless_api.backends.standalone.code import CodeFiles
from sless_api.backends.standalone.failures import check_failure, start_failure
from sless_api.backends.standalone.host.sandbox import Limits, Sandbox
from sless_api.backends.standalone.host.supervisor import StartFailed
from sless_api.backends.standalone.routing import StandaloneRouter
from sless_api.backends.standalone.runner import run_once
from sless_api.backends.standalone.state import StateStore, artifact_to_dict, require_function
from sless_api.domain.records import FunctionRecord
from sless_api.stores.secrets.store import SecretStore
from sless_api.stores.secrets.usage import deliver
from sless_core.models import Phase

# Runtimes whose entrypoint loads when the process starts: the build checks it (Go's build links it).
LOAD_CHECKED = ("python3.11", "nodejs20")
log = logging.getLogger("sless.standalone")


class Builds:
    def __init__(self, state: StateStore, builder: Builder, router: StandaloneRouter, secrets: SecretStore,
                 sandbox: Sandbox, host: SandboxSettings, code: CodeFiles) -> None:
        self.state = state
        self.builder = builder
        self.router = router
        self.secrets = secrets
        self.sandbox = sandbox
        self.host = host  # the host-wide limits of function processes
        self.code = code

    async def build(self, namespace: str, name: str) -> None:
        rec = require_function(self.state, namespace, name)
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

        request = BuildRequest(runtime=rec.spec.runtime, code_dir=self.code.code_dir(namespace, name, code_hash),
                               entrypoint=rec.spec.entrypoint, code_hash=code_hash, tenant=namespace)
        # Traced, the build and the rollout are spans under the deploy's (this task began in its request).
        with tracing.step("build", sless_runtime=rec.spec.runtime) as span:
            try:
                artifact = await asyncio.to_thread(self.builder.build, request, progress)
            except BuildFailed as exc:
                tracing.failed(span, "build failed")
                self._finish_build(namespace, name, code_hash, None, exc.log_tail)
                return
            except Exception as exc:  # a bug or a full disk must still end in a visible Failed phase
                log.exception("build of %s/%s crashed", namespace, name)
                tracing.failed(span, "build crashed")
                self._finish_build(namespace, name, code_hash, None,
                                   f"build crashed: {type(exc).__name__}: {exc}")
                return
            failure = await self._check_loads(namespace, rec, artifact)
            if failure:
                tracing.failed(span, failure)
                self._finish_build(namespace, name, code_hash, None, failure)
                return
        self.state.set_artifact(namespace, name, artifact_to_dict(artifact))
        with tracing.step("rollout") as span:
            try:
                # Switch traffic before saying Ready, so a client that sees Ready gets the new code.
                await self.router.sync(namespace, name)
            except StartFailed as exc:
                log.warning("new version of %s/%s failed to start: %s", namespace, name, exc)
                tracing.failed(span, "the new version failed to start")
                self._finish_build(namespace, name, code_hash, None,
                                   f"the new version {start_failure(str(exc))}")
                return
        self._finish_build(namespace, name, code_hash, artifact, "")
        await asyncio.to_thread(self.code.prune, namespace, name, code_hash)

    async def _check_loads(self, namespace: str, rec: FunctionRecord, artifact: BuildArtifact) -> str:
        """Empty when the entrypoint loads, else why not, in one line.

        Python and Node load the handler when their process starts (lazily, on the first call): without
        this check a broken import would show Ready until someone calls. A Go function that does not
        link has failed its build already.
        """
        if rec.spec.runtime not in LOAD_CHECKED:
            return ""
        limits = Limits.for_function(rec.spec.memory_mb, rec.spec.runtime, cpu_sec=int(rec.spec.timeout_sec) + 1,
                                     host=self.host)
        secrets = await deliver(self.secrets, namespace, rec.spec.name, rec.spec.secrets)
        jail = dataclasses.replace(artifact.jail(namespace, limits), files=secrets.files)
        result = await asyncio.to_thread(run_once, artifact, {}, float(rec.spec.timeout_sec),
                                         env={**rec.spec.env_vars, **secrets.env, "SLESS_CHECK_ONLY": "1"},
                                         sandbox=self.sandbox, jail=jail)
        if result.ok:
            return ""
        log.warning("%s/%s does not load (exit %s): %s", namespace, rec.spec.name, result.exit_code, result.output)
        reason = check_failure(result.output, result.exit_code, result.timed_out, rec.spec.timeout_sec)
        return f"the function does not load: {reason}"  # said once, not twice

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
