"""Trigger: how a Function is called.

- ``http``: the invoke proxy routes ``/fn/<ns>/<function>`` to the Function's Service. The
  Deployment runs ``spec.replicas`` of the Function while any of its http triggers is enabled;
  when every http trigger of a Function is disabled it is scaled to 0 and the proxy, which
  reads the Trigger, answers 404 (the function is switched off, not broken: 503 would invite
  retries). A Function without any http trigger keeps running (jobs, cron and events use it).
  A Function with ``scale`` is not scaled here: its KEDA ScaledObject is paused at 0 instead
  (``autoscale``), and the operator never writes that Deployment's replicas.
- ``cron``: a CronJob ``<trigger>-cron`` runs the Function's image in runner mode on the
  schedule (UTC), suspended while the trigger is disabled (see ``manifests.cron_job``). It
  needs the Function's image, so it appears once the Function has been built and follows
  every rebuild (``sync_for_function``). Each firing is recorded on the Trigger
  (``on_cron_job``): ``status.lastFiredAt`` when its Job starts, and a ``LastRun`` condition
  with the run's result or error when it ends, and ``status.runRecord`` (``runreport``), the firing's
  invocation record with what its pod printed, which the API stores; while the operator traces, the ended
  firing is a root span ``cron <namespace>/<trigger>`` (``runtrace``), sent once (``status.tracedRun``).
- ``event``: served by the event dispatcher (RabbitMQ); the operator only reports that.
"""

from __future__ import annotations

from typing import Any

from sless_core import crd, tracing
from sless_core.crcodec import InvalidResource, TriggerResource
from sless_core.models import TriggerSpec, TriggerType
from sless_operator import autoscale, capture, children, manifests, runreport, runtrace, tenancy
from sless_operator.context import Context
from sless_operator.kube import MERGE, api_path
from sless_operator.manifests import FunctionRef, Owner
from sless_operator.observe import JobSummary, TriggerSummary, desired_replicas, switched_off
from sless_operator.status import StatusBuilder, write

EVENT_MESSAGE = "event triggers are served by the event dispatcher"


def trigger_path(namespace: str, name: str) -> str:
    return api_path(crd.API_VERSION, crd.TRIGGER_PLURAL, namespace, name)


async def reconcile(ctx: Context, body: dict[str, Any]) -> None:
    meta = body["metadata"]
    async with ctx.state.locks.hold(("trigger", meta["namespace"], meta["name"])):
        await _reconcile(ctx, body)


async def _reconcile(ctx: Context, body: dict[str, Any]) -> None:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    st = StatusBuilder(body.get("status"), int(meta.get("generation", 0)))
    path = trigger_path(namespace, name)
    refused = tenancy.refusal(namespace)
    if refused:
        st.set(message=refused).condition("Ready", False, tenancy.NOT_A_TENANT, refused)
        await write(ctx.kube, path, st)
        return
    try:
        spec = TriggerResource.from_cr(body).spec
    except InvalidResource as exc:
        st.set(message=f"invalid spec: {exc}").condition("Ready", False, "InvalidSpec", str(exc))
        await write(ctx.kube, path, st)
        raise
    if spec.type == TriggerType.HTTP:
        await scale_for_http(ctx, namespace, spec.function)
        if spec.enabled:
            message = f"serving /fn/{namespace}/{spec.function}"
        else:
            message = f"disabled: {spec.function} is scaled to zero and /fn/{namespace}/{spec.function} answers 404"
        st.condition("Ready", True, "Enabled" if spec.enabled else "Disabled", message)
    elif spec.type == TriggerType.CRON:
        waiting = await _reconcile_cron(ctx, body, spec)
        if waiting:
            message = waiting
            st.condition("Ready", False, "Waiting", message)
        else:
            assert spec.schedule is not None
            message = _cron_ready(st, name, spec.schedule, spec.enabled)
    else:
        message = EVENT_MESSAGE
        st.condition("Ready", True, "Dispatcher", message)
    st.set(message=message)
    await write(ctx.kube, path, st)


def _cron_ready(st: StatusBuilder, name: str, schedule: str, enabled: bool) -> str:
    state = "scheduled" if enabled else "suspended"
    message = f"{state}: {schedule} (UTC) as CronJob {manifests.cron_job_name(name)}"
    st.condition("Ready", True, "Scheduled" if enabled else "Suspended", message)
    return message


async def scale_for_http(ctx: Context, namespace: str, function: str) -> None:
    """Apply the http rule (``observe.desired_replicas``) to the Function's Deployment, if any; a scaled
    Function's to its ScaledObject (paused at 0 or not), never to the replicas its autoscaler owns."""
    async with ctx.state.locks.hold(("function", namespace, function)):
        live = ctx.deployment(namespace, function)
        if live is None:
            return  # not deployed yet: the Function's reconcile applies the same rule
        fn = ctx.function(namespace, function)
        if fn is None:
            return
        try:
            ref = FunctionRef.of(fn)
        except InvalidResource:
            return  # its own reconcile reports it; nothing is scaled by a spec that cannot work
        if ref.spec.scale is not None or live.autoscaled:
            # a change between fixed and scaled replicas is the Function's reconcile (which comes with it)
            if ref.spec.scale is not None and live.autoscaled and await autoscale.keda_installed(ctx):
                await autoscale.ensure_scaled_object(ctx, ref, switched_off(ctx.triggers_of(namespace, function)))
            return
        replicas = desired_replicas(ref.replicas, ctx.triggers_of(namespace, function))
        if live.replicas != replicas:
            await ctx.kube.patch(api_path("apps/v1", "deployments", namespace, function),
                                 {"spec": {"replicas": replicas}}, MERGE)  # fmt: skip


async def _reconcile_cron(ctx: Context, body: dict[str, Any], spec: TriggerSpec) -> str:
    """Ensure the CronJob; "" when it is in place, else why it cannot be yet."""
    namespace = body["metadata"]["namespace"]
    fn = await ctx.kube.get(api_path(crd.API_VERSION, crd.FUNCTION_PLURAL, namespace, spec.function))
    if fn is None or fn["metadata"].get("deletionTimestamp"):
        return f"waiting for function {spec.function}: not found"
    image = str((fn.get("status") or {}).get("image") or "")
    if not image:
        return f"waiting for function {spec.function} to be built"
    try:
        ref = FunctionRef.of(fn)
    except InvalidResource as exc:
        return f"function {spec.function} is invalid: {exc}"
    assert spec.schedule is not None
    await ensure_cron(ctx, ref, image, Owner.of(body), spec.schedule, spec.enabled)
    return ""


async def ensure_cron(ctx: Context, ref: FunctionRef, image: str, owner: Owner, schedule: str, enabled: bool) -> bool:
    """Create or update the CronJob; False when this process already applied exactly this."""
    want = manifests.cron_job(ctx.config, ref, image, owner, schedule, enabled)
    key = (ref.namespace, "CronJob", want["metadata"]["name"])
    stamp = f"{owner.uid}/{want['metadata']['annotations'][manifests.SPEC_HASH]}"
    if ctx.state.applied.get(key) == stamp:
        return False
    await children.ensure(ctx.kube, want)
    ctx.state.applied[key] = stamp
    return True


async def sync_for_function(ctx: Context, fn: dict[str, Any], image: str) -> None:
    """Keep the Function's cron triggers' CronJobs on its current image and spec.

    Called after the Function's status has been written, so a trigger reconcile that starts
    later sees the image; the trigger lock orders this status write after an earlier one.
    """
    meta = fn["metadata"]
    namespace = meta["namespace"]
    crons = [t for t in ctx.triggers_of(namespace, meta["name"]) if t.type == "cron" and not t.deleting]
    if not crons:
        return
    ref = FunctionRef.of(fn)
    for summary in crons:
        if not summary.schedule:
            continue
        async with ctx.state.locks.hold(("trigger", namespace, summary.name)):
            if not await ensure_cron(ctx, ref, image, _owner(summary), summary.schedule, summary.enabled):
                continue
            body = await ctx.kube.get(trigger_path(namespace, summary.name))
            if body is None or body["metadata"].get("deletionTimestamp"):
                continue
            try:
                current = TriggerResource.from_cr(body).spec
            except InvalidResource:
                continue  # its own reconcile reports it
            if current.function != meta["name"] or current.schedule != summary.schedule:
                continue  # changed meanwhile: its own reconcile reports it
            st = StatusBuilder(body.get("status"), int(body["metadata"].get("generation", 0)))
            st.set(message=_cron_ready(st, summary.name, summary.schedule, summary.enabled))
            await write(ctx.kube, trigger_path(namespace, summary.name), st)


def _owner(summary: TriggerSummary) -> Owner:
    return Owner(summary.api_version, "Trigger", summary.name, summary.uid)


async def cleanup(ctx: Context, body: dict[str, Any]) -> None:
    """On deletion: give the Function its replicas back (the CronJob goes by garbage collection)."""
    meta = body["metadata"]
    if tenancy.refusal(meta["namespace"]):
        return  # nothing was ever created for it
    try:
        spec = TriggerResource.from_cr(body).spec
    except InvalidResource:
        spec = None  # it never counted for its function's replicas
    if spec is not None and spec.type == TriggerType.HTTP:
        await scale_for_http(ctx, meta["namespace"], spec.function)
    ctx.state.applied.pop((meta["namespace"], "CronJob", manifests.cron_job_name(meta["name"])), None)


async def on_cron_job(ctx: Context, summary: JobSummary) -> None:
    """A cron trigger's Job started or ended: record the firing on its Trigger.

    ``lastFiredAt`` is the Job's start (the API shows it as ``last_fired_at``); the ``LastRun``
    condition says whether that run succeeded, with the runner's result or the error's tail.
    An older Job's news never overwrites a later firing.
    """
    namespace, name = summary.namespace, summary.labels.get(crd.LABEL_TRIGGER, "")
    if not name or not summary.start_time or tenancy.refusal(namespace):
        return
    async with ctx.state.locks.hold(("trigger", namespace, name)):
        body = await ctx.kube.get(trigger_path(namespace, name))
        if body is None or body["metadata"].get("deletionTimestamp"):
            return
        if (body.get("spec") or {}).get("type") != TriggerType.CRON:
            return
        old = body.get("status") or {}
        if str(old.get("lastFiredAt") or "") > summary.start_time:
            return
        st = StatusBuilder(old, int(body["metadata"].get("generation", 0))).set(lastFiredAt=summary.start_time)
        # a firing's span once: status.tracedRun names the last Job whose span was sent
        traced = summary.finished and tracing.enabled() and old.get("tracedRun") != summary.name
        output = ""
        if summary.finished:
            succeeded = summary.state == "complete"
            selector = f"{crd.LABEL_TRIGGER}={name},{crd.LABEL_COMPONENT}={manifests.COMPONENT_CRON}"
            pods = await capture.job_pods(ctx.kube, namespace, selector)  # once, for the result and the record
            output = await capture.pod_output(ctx.kube, namespace, selector, manifests.CONTAINER, succeeded,
                                              pods=pods)
            reason = "Succeeded" if succeeded else (summary.reason or "Failed")
            st.condition("LastRun", succeeded, reason, f"{summary.name}: {output or summary.message}".strip(": "))
            recorded = old.get(runreport.STATUS_FIELD)
            if summary.uid and not (isinstance(recorded, dict) and recorded.get("uid") == summary.uid):
                # the firing's invocation record, with what its pod printed, for the API to store (once per Job)
                st.set(**{runreport.STATUS_FIELD: await runreport.record(
                    ctx, summary, pods, "cron", f"/triggers/{name}", output or summary.message)})
        else:
            st.condition("LastRun", None, "Running", f"{summary.name} started at {summary.start_time}")
        if traced:
            st.set(tracedRun=summary.name)
        await write(ctx.kube, trigger_path(namespace, name), st)
        if traced:
            runtrace.emit(f"cron {namespace}/{name}", summary, output or summary.message, sless_namespace=namespace,
                          sless_trigger=name)
