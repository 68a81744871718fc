"""One run of a function's runner (a job, a cron firing), in its sandbox, recorded as an invocation.

On Kubernetes the same runs are a runner pod each; here a process per run, with the limits and the
secrets of the function's own server process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

from sless_api import metrics, tracing
from sless_api.backends.settings import SandboxSettings
from sless_api.backends.standalone.host.calllogs import CallLogStore
from sless_api.backends.standalone.host.sandbox import Limits, Sandbox
from sless_api.backends.standalone.routing import process_key
from sless_api.backends.standalone.runner import KILL_MARGIN_SEC, RunResult, run_once
from sless_api.backends.standalone.state import artifact_from_dict
from sless_api.domain import calloutput
from sless_api.domain.records import FunctionRecord
from sless_api.gateway.requestid import new_request_id
from sless_api.stores.invocations import Invocation, InvocationLog
from sless_api.stores.secrets.store import SecretStore
from sless_api.stores.secrets.usage import deliver


class OneShot:
    def __init__(self, secrets: SecretStore, sandbox: Sandbox, invocations: InvocationLog | None,
                 host: SandboxSettings, call_logs: CallLogStore | None = None) -> None:
        self.secrets = secrets
        self.sandbox = sandbox
        self.invocations = invocations
        self.host = host  # the host-wide limits of function processes
        #: where a run's printed lines are kept under its request id, as a call's are (``sless logs --id``)
        self.call_logs = call_logs

    async def run(self, namespace: str, fn: FunctionRecord, artifact: dict[str, Any],
                  event: dict[str, Any], trigger: str = "job") -> RunResult:
        """One run of FN's runner with EVENT, in the function's sandbox (jobs and cron firings). Traced, the run is
        a span ``<trigger> <namespace>/<function>`` whose context the runner gets as ``TRACEPARENT`` (the
        OpenTelemetry convention for a process's environment)."""
        built = artifact_from_dict(artifact)
        cpu = int(fn.spec.timeout_sec + KILL_MARGIN_SEC) + 1
        limits = Limits.for_function(fn.spec.memory_mb, fn.spec.runtime, cpu_sec=cpu, host=self.host)
        secrets = await deliver(self.secrets, namespace, fn.spec.name, fn.spec.secrets)
        jail = dataclasses.replace(built.jail(namespace, limits), files=secrets.files)
        env = {**fn.spec.env_vars, **secrets.env}
        if not tracing.enabled():
            return await asyncio.to_thread(run_once, built, event, float(fn.spec.timeout_sec), env=env,
                                           sandbox=self.sandbox, jail=jail)
        with tracing.span(f"{trigger} {namespace}/{fn.spec.name}", "internal", sless_trigger=trigger) as current:
            env.update({name.upper(): value for name, value in tracing.with_context([])})
            result = await asyncio.to_thread(run_once, built, event, float(fn.spec.timeout_sec), env=env,
                                             sandbox=self.sandbox, jail=jail)
            tracing.record_status(current, 200 if result.ok else 500)
            return result

    def record(self, namespace: str, function: str, path: str, trigger: str, event: dict[str, Any],
               result: RunResult, started: float, version: int | None = None) -> None:
        """A run (job, cron firing) in the metrics and the invocation log, as the proxy records a call."""
        status, duration = (200 if result.ok else 500), time.monotonic() - started
        metrics.observe_invocation(namespace, function, trigger, status, duration)
        if self.invocations is None:
            return
        request_id = new_request_id()
        ended = time.time()
        if self.call_logs is not None:
            for stream, line in result.printed:
                self.call_logs.add(process_key(namespace, function), request_id, stream, line, ended)
        # kept with the record too, as a call's own output is, so a restart of `sless up` does not lose it
        output = calloutput.encode((stream, line, ended) for stream, line in result.printed) \
            if result.printed else None
        self.invocations.record(Invocation(
            namespace=namespace, function=function, method="RUN", path=path, status=status,
            duration_ms=duration * 1000, request_bytes=len(json.dumps(event)), response_bytes=len(result.output),
            trigger=trigger, error=None if result.ok else result.output[-500:], started_at=time.time(),
            request_id=request_id, version=version, output=output))
