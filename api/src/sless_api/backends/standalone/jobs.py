"""Jobs of the standalone backend: one run of a function's runner with a given event, re-run on demand.

A job waits for its function to be Ready (a job created with the function's first upload), then runs
once (oneshot.py); a job with ``run_id`` 0 is only recorded. A restart fails the jobs it interrupted.
"""

from __future__ import annotations

import asyncio
import time

from sless_api.backends.standalone import limits
from sless_api.backends.standalone.oneshot import OneShot
from sless_api.backends.standalone.routing import current_version, process_key
from sless_api.backends.standalone.state import StateStore, require_function
from sless_api.backends.standalone.tasks import TaskSet
from sless_api.domain.contract import check_rerun
from sless_api.domain.errors import Conflict, NotFound, Unavailable
from sless_api.domain.records import FunctionRecord, JobRecord
from sless_core import contract
from sless_core.models import JobPhase, JobSpec, Phase


def job_task(namespace: str, name: str) -> str:
    return f"job:{process_key(namespace, name)}"


class Jobs:
    def __init__(self, state: StateStore, oneshot: OneShot, tasks: TaskSet, limit: int = 0) -> None:
        self.state = state
        self.oneshot = oneshot
        self.tasks = tasks
        self.limit = limit  # jobs one tenant may have (0: no limit)

    def fail_interrupted(self) -> None:
        """At start: jobs a stop interrupted will not finish; say so."""
        for job in self.state.list_jobs():
            if job.phase in (JobPhase.PENDING, JobPhase.RUNNING):
                job.phase, job.message, job.completed_at = JobPhase.FAILED, "interrupted by a restart", time.time()
                self.state.save_job(job)

    def _job(self, namespace: str, name: str) -> JobRecord:
        rec = self.state.get_job(namespace, name)
        if rec is None:
            raise NotFound(f"job {name!r} not found")
        return rec

    async def create_job(self, namespace: str, spec: JobSpec) -> JobRecord:
        require_function(self.state, namespace, spec.function)
        rec = JobRecord(namespace=namespace, spec=spec)
        if spec.run_id == 0:
            rec.phase, rec.message = JobPhase.RECORDED, contract.RECORDED_MESSAGE
        if not limits.insert_within("jobs", f"job {spec.name!r}", self.limit,
                                    lambda limit: self.state.insert_job(rec, limit)):
            existing = self._job(namespace, spec.name)
            raise Conflict(f"job {spec.name!r} already exists", existing=existing.to_api())
        if spec.run_id > 0:
            self.tasks.spawn(job_task(namespace, spec.name), self._run_job(namespace, spec.name))
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
        self.tasks.spawn(job_task(namespace, name), self._run_job(namespace, name))
        return rec

    async def delete_job(self, namespace: str, name: str) -> None:
        self._job(namespace, name)
        self.tasks.cancel(job_task(namespace, name))
        self.state.delete_job(namespace, name)

    async def _wait_ready(self, namespace: str, function: str, limit_sec: float = 900) -> FunctionRecord:
        deadline = time.monotonic() + limit_sec
        while True:
            fn = require_function(self.state, namespace, function)
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
                                started, current_version(self.state, fn))
        except (NotFound, Unavailable) as exc:
            rec.phase, rec.message = JobPhase.FAILED, exc.message
        rec.completed_at = time.time()
        if self.state.get_job(namespace, name) is not None:
            self.state.save_job(rec)
