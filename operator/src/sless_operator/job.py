"""FunctionJob: one-shot runs of a Function with an event.

``runId: 0`` records the job (phase Recorded) and runs nothing. ``runId: N > 0`` runs the
Function's image in runner mode as the Job ``<job>-run-<N>`` (owned by the FunctionJob;
``backoffLimit`` from the configuration); raising ``runId`` runs it again and deletes the Jobs
of earlier runs. When the run's Job finishes, the message becomes the runner's result (stdout)
or its error (stderr), truncated to about 2000 characters (``capture``); ``status.runId`` says
which run the status describes, so a result is captured once per run, and so is the run's invocation record
(``status.runRecord``, ``runreport``: what its pod printed, stored by the API). A run of a traced FunctionJob
(``sless.dev/traceparent``) gets that context as ``TRACEPARENT`` and its end is a span (``runtrace``).
"""

from __future__ import annotations

from typing import Any

from sless_core import crd, tracing
from sless_core.crcodec import InvalidResource, JobResource
from sless_core.models import JobPhase
from sless_operator import capture, children, manifests, runreport, runtrace, tenancy
from sless_operator.context import Context
from sless_operator.kube import api_path
from sless_operator.manifests import FunctionRef, Owner
from sless_operator.observe import JobSummary, job_summary
from sless_operator.status import StatusBuilder, now, write

FINISHED = (JobPhase.SUCCEEDED, JobPhase.FAILED)


def _reported(job: JobResource, run_id: int) -> bool:
    """Whether the status already tells how run RUN_ID ended (a later event about it changes nothing)."""
    return job.status.run_id == run_id and job.status.phase in FINISHED


class WaitingForFunction(Exception):
    """The Function to run is missing or not built yet; try again a little later."""


def job_path(namespace: str, name: str) -> str:
    return api_path(crd.API_VERSION, crd.JOB_PLURAL, namespace, name)


def run_selector(job: str, run_id: int) -> str:
    return f"{crd.LABEL_JOB}={job},{crd.LABEL_RUN}={run_id}"


async def reconcile(ctx: Context, body: dict[str, Any]) -> None:
    """Start the requested run (if not started yet) and report on it."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    async with ctx.state.locks.hold(("functionjob", namespace, name)):
        await _reconcile(ctx, body)


async def _reconcile(ctx: Context, body: dict[str, Any]) -> None:
    meta, old = body["metadata"], body.get("status") or {}
    namespace, name = meta["namespace"], meta["name"]
    st = StatusBuilder(old, int(meta.get("generation", 0)))
    path = job_path(namespace, name)
    refused = tenancy.refusal(namespace)
    if refused:
        st.set(phase=JobPhase.FAILED.value, message=refused)
        st.condition("Complete", False, tenancy.NOT_A_TENANT, refused)
        await write(ctx.kube, path, st)
        return
    try:
        resource = JobResource.from_cr(body)
    except InvalidResource as exc:
        st.set(phase=JobPhase.FAILED.value, message=f"invalid spec: {exc}")
        await write(ctx.kube, path, st)
        raise
    spec = resource.spec
    if spec.run_id == 0:
        st.set(phase=JobPhase.RECORDED.value, runId=0, message="recorded; set runId above 0 to run it")
        await write(ctx.kube, path, st)
        return
    if _reported(resource, spec.run_id):
        return  # this run is over and reported

    fn = await ctx.kube.get(api_path(crd.API_VERSION, crd.FUNCTION_PLURAL, namespace, spec.function))
    image = str(((fn or {}).get("status") or {}).get("image") or "")
    if fn is None or not image:
        why = "not found" if fn is None else "not built yet"
        st.set(phase=JobPhase.PENDING.value, runId=spec.run_id, message=f"waiting for function {spec.function}: {why}")
        await write(ctx.kube, path, st)
        raise WaitingForFunction(f"function {spec.function} is {why}")
    try:
        ref = FunctionRef.of(fn)
    except InvalidResource as exc:
        st.set(phase=JobPhase.FAILED.value, runId=spec.run_id, message=f"function {spec.function} is invalid: {exc}")
        await write(ctx.kube, path, st)
        raise

    await tenancy.ensure(ctx, namespace)
    traceparent = runtrace.traceparent_of(meta) if tracing.enabled() else ""
    want = manifests.run_job(ctx.config, ref, image, Owner.of(body), spec.run_id, spec.event, traceparent)
    summary = ctx.job(namespace, want["metadata"]["name"])
    if summary is None:
        summary = job_summary(await children.ensure(ctx.kube, want))
    await _forget_other_runs(ctx, namespace, name, spec.run_id)
    await _report(ctx, body, st, spec.run_id, summary)


async def _forget_other_runs(ctx: Context, namespace: str, name: str, run_id: int) -> None:
    """Delete the Jobs (and pods) of earlier runs: a FunctionJob shows its latest run."""
    selector = f"{crd.LABEL_JOB}={name},{crd.LABEL_RUN}!={run_id}"
    await ctx.kube.delete_collection(api_path("batch/v1", "jobs", namespace), selector)


async def _report(ctx: Context, body: dict[str, Any], st: StatusBuilder, run_id: int, job: JobSummary) -> None:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    st.set(runId=run_id, startTime=job.start_time or None, completionTime=job.completion_time or None)
    selector = run_selector(name, run_id)
    # a finished run's pods, listed once for its result and for its record's lines
    pods = await capture.job_pods(ctx.kube, namespace, selector) if job.finished else None
    if job.state == "complete":
        output = await capture.pod_output(ctx.kube, namespace, selector, manifests.CONTAINER, True, pods=pods)
        st.set(phase=JobPhase.SUCCEEDED.value, message=output, completionTime=job.completion_time or now())
        st.condition("Complete", True, "Succeeded", f"run {run_id} succeeded")
    elif job.state == "failed":
        output = await capture.pod_output(ctx.kube, namespace, selector, manifests.CONTAINER, False, pods=pods)
        reason = f"{job.reason}: {job.message}".strip(": ")
        st.set(phase=JobPhase.FAILED.value, message=output or reason or "the run failed")
        st.condition("Complete", False, job.reason or "Failed", reason)
    else:
        st.set(phase=JobPhase.RUNNING.value if job.state == "active" else JobPhase.PENDING.value, message="")
        st.condition("Complete", None, "Running" if job.state == "active" else "Pending", f"run {run_id}")
    if pods is not None and job.uid:  # the run's invocation record, with what its pod printed, for the API to store
        error = str(st.fields.get("message") or "")
        st.set(**{runreport.STATUS_FIELD: await runreport.record(ctx, job, pods, "job", f"/jobs/{name}", error)})
    await write(ctx.kube, job_path(namespace, name), st)
    if job.finished and tracing.enabled():  # reported once: a finished run is not reported again (_reported)
        runtrace.emit(f"job {namespace}/{name}", job, str(st.fields.get("message") or ""),
                      runtrace.traceparent_of(meta), sless_namespace=namespace, sless_run_id=str(run_id))


async def on_run_job(ctx: Context, summary: JobSummary) -> None:
    """A run's Job changed: report it on its FunctionJob when it is the current run."""
    namespace = summary.namespace
    name = summary.labels.get(crd.LABEL_JOB, "")
    if tenancy.refusal(namespace):
        return  # not one of ours: the operator runs nothing outside tenant namespaces
    try:
        run_id = int(summary.labels.get(crd.LABEL_RUN, ""))
    except ValueError:
        return
    async with ctx.state.locks.hold(("functionjob", namespace, name)):
        body = await ctx.kube.get(job_path(namespace, name))
        if body is None or body["metadata"].get("deletionTimestamp"):
            return
        try:
            resource = JobResource.from_cr(body)
        except InvalidResource:
            return  # its own reconcile reports it
        if resource.spec.run_id != run_id:
            return  # an earlier run, being deleted
        if _reported(resource, run_id):
            return
        st = StatusBuilder(body.get("status") or {}, resource.meta.generation)
        await _report(ctx, body, st, run_id, summary)
