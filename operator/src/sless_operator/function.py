"""Function: Pending -> Building (kaniko Job) -> Ready (Deployment + Service), or Failed.

One level-triggered ``reconcile`` does everything and is safe to run any number of times:
Kopf runs it when a Function is created, changed or found at start-up, and the watch on our
Jobs and Deployments runs it when a build finishes or a rollout progresses. Each run reads the
Function fresh, looks at its children (Kopf indices), creates or adopts what is missing, and
writes the status only when it changed. A per-Function lock keeps two runs from interleaving.

Status fields beside ``phase``/``message``: ``image`` and ``codeHash`` of the last successful
build, ``buildJob`` (the Job for the current code), ``lastBuiltAt``, ``observedGeneration`` and
the conditions ``Built`` and ``Ready``. A failed build is remembered by ``buildJob`` + ``Built``
``False/BuildFailed``, so a restart does not build the same code again; new code (a new
``codeHash``) builds again. Environment, memory and timeout changes only update the Deployment.

A Function with ``scale`` (replicas on demand) needs KEDA: its ScaledObject owns the Deployment's
replicas (``autoscale``); it is Ready once its current template has rolled out, at 0 replicas too
("scaled to zero"). Without KEDA in the cluster it is Failed, and asked about again later.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from dataclasses import replace
from typing import Any

from sless_core import crd, tracing
from sless_core.crcodec import InvalidResource
from sless_core.models import Phase
from sless_operator import autoscale, capture, children, codeurl, history, manifests, split, tenancy, trigger
from sless_operator.autoscale import KedaMissing
from sless_operator.children import ChildConflict
from sless_operator.codeurl import NoSigningKey
from sless_operator.context import Context
from sless_operator.deploytrace import ENDED, DeployTrace, emit
from sless_operator.kube import api_path
from sless_operator.manifests import FunctionRef
from sless_operator.observe import (
    DeploymentSummary,
    JobSummary,
    deployment_summary,
    desired_replicas,
    job_summary,
    switched_off,
)
from sless_operator.status import StatusBuilder, condition_of, now, write

log = logging.getLogger(__name__)


def function_path(namespace: str, name: str) -> str:
    return api_path(crd.API_VERSION, crd.FUNCTION_PLURAL, namespace, name)


async def load(ctx: Context, namespace: str, name: str, body: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The Function as the watch last showed it (Kopf's body, else our index, else a read), with
    the status this process last wrote for it: fresher than any event that may still be on its way.
    """
    if body is None:
        body = ctx.function(namespace, name)
    if body is None:
        body = await ctx.kube.get(function_path(namespace, name))
    if body is None:
        return None
    written = ctx.state.statuses.get((namespace, name))
    if written is not None and written[0] == body["metadata"].get("uid"):
        # a status write is a merge patch: fields it did not name (versions, ...) are still there
        body = {**body, "status": {**(body.get("status") or {}), **written[1]}}
    return body


async def reconcile(ctx: Context, namespace: str, name: str, body: dict[str, Any] | None = None) -> None:
    """Bring the Function NAMESPACE/NAME one step closer to Ready (a no-op when it is there)."""
    async with ctx.state.locks.hold(("function", namespace, name)):
        body = await load(ctx, namespace, name, body)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return
        try:
            await _reconcile(ctx, body)
        except ChildConflict as exc:
            st = StatusBuilder(body.get("status"), int(body["metadata"].get("generation", 0)))
            st.set(phase=Phase.FAILED.value, message=str(exc)).condition("Ready", False, "ChildConflict", str(exc))
            await _write(ctx, body, st)
            raise


async def _write(ctx: Context, body: dict[str, Any], st: StatusBuilder, build: str = "", rolling_out: bool = False,
                 fetched: bool = False) -> None:  # fmt: skip
    """Write the status ST; a traced change that ends with it (Ready or Failed) gets its spans, once
    (``deploytrace``). BUILD, ROLLING_OUT and FETCHED: what this reconcile found (``DeployTrace.step``)."""
    meta = body["metadata"]
    ended: DeployTrace | None = None
    if tracing.enabled():
        at = tracing.now_ns()
        trace = DeployTrace.of(meta, body.get("status") or {}, at)
        if trace is not None and not trace.emitted:
            trace = trace.step(build, rolling_out, fetched, at)
            if st.fields.get("phase") in ENDED:
                ended, trace = trace, dataclasses.replace(trace, emitted=True)
            st.set(trace=trace.to_status())
    await write(ctx.kube, function_path(meta["namespace"], meta["name"]), st)
    ctx.state.statuses[(meta["namespace"], meta["name"])] = (str(meta.get("uid")), st.build())
    if ended is not None:
        emit(ended, meta["namespace"], meta["name"], tracing.now_ns(), str(st.fields.get("phase")),
             str(st.fields.get("message") or ""))


async def _reconcile(ctx: Context, body: dict[str, Any]) -> None:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    old = body.get("status") or {}
    st = StatusBuilder(old, int(meta.get("generation", 0)))
    refused = tenancy.refusal(namespace)
    if refused:
        st.set(phase=Phase.FAILED.value, message=refused)
        st.condition("Built", False, tenancy.NOT_A_TENANT, refused)
        st.condition("Ready", False, tenancy.NOT_A_TENANT, refused)
        await _write(ctx, body, st)
        return
    try:
        ref = FunctionRef.of(body)
        if ref.code_hash and not (ref.context_key or ref.code_key):
            raise InvalidResource("codeHash is set but neither contextKey (a build context) nor codeKey (a code "
                              "archive) is")  # fmt: skip
        if ref.deps_hash and not (ref.code_key and ref.context_key):
            raise InvalidResource("depsHash needs codeKey (the code) and contextKey (the dependency build context)")
    except InvalidResource as exc:
        message = f"invalid spec: {exc}"
        st.set(phase=Phase.FAILED.value, message=message)
        st.condition("Built", False, "InvalidSpec", message).condition("Ready", False, "InvalidSpec", message)
        await _write(ctx, body, st)
        raise

    await tenancy.ensure(ctx, namespace)
    if not ref.code_hash:
        st.set(phase=Phase.PENDING.value, message="waiting for code")
        st.condition("Built", False, "NoCode", "no code uploaded yet").condition("Ready", False, "NoCode")
        await _write(ctx, body, st)
        return

    if ref.spec.scale is not None:
        try:
            await autoscale.require_keda(ctx)
        except KedaMissing as exc:
            st.set(phase=Phase.FAILED.value, message=str(exc)).condition("Ready", False, "NoKEDA", str(exc))
            await _write(ctx, body, st)
            raise

    triggers = ctx.triggers_of(namespace, name)
    replicas = desired_replicas(ref.replicas, triggers)
    paused = switched_off(triggers)
    current: DeploymentSummary | None = None
    rollout: tuple[str, str] | None = None
    target = ""
    if ref.fetched:
        build, image = await _dependencies(ctx, ref, old, st)
        if build == "built" and ref.compiled:  # Go: the code compiles on the dependency image
            build, target, ref = await _compile(ctx, ref, image, old, st)
            image = ctx.config.go_run_image
        if build == "built":
            try:
                await _code_url(ctx, ref, old, st)
            except NoSigningKey as exc:
                st.set(phase=Phase.FAILED.value, message=str(exc)).condition("Ready", False, "NoSigningKey", str(exc))
                await _write(ctx, body, st)
                return
            current = await _deploy(ctx, ref, image, replicas, paused)
            rollout = current.rollout()
            st.set(image=image)
            if rollout[0] == "ready" and old.get("codeHash") != ref.code_hash:
                # codeHash: the code that serves (as after a build); lastBuiltAt: since when
                st.set(codeHash=ref.code_hash, lastBuiltAt=now())
        else:  # new dependencies are building: what runs keeps running as it is
            current = ctx.deployment(namespace, name)
            rollout = current.rollout() if current is not None else None
            image = str(old.get("image") or "")
        rollout = _fetch_failure(ctx, ref, rollout)
    else:
        build = await _build(ctx, ref, old, st)
        image = str(st.fields.get("image") or old.get("image") or "")
        if image:
            current = await _deploy(ctx, ref, image, replicas, paused)
            rollout = current.rollout()

    ready_state, ready_message = rollout or ("absent", "")
    if rollout is None:
        st.condition("Ready", False, "NotBuilt", "no image built yet")
    elif ready_state == "ready":
        st.condition("Ready", True, "Available", f"serving {image}")
    elif ready_state == "failed":
        st.condition("Ready", False, "RolloutFailed", ready_message)
    else:
        # no replica counts here: each change of the status is a write and a watch event for
        # everyone; the Deployment has the details, a stuck rollout ends in "failed" anyway
        st.condition("Ready", False, "RollingOut", f"rolling out {image}")

    if build == "failed":
        st.set(phase=Phase.FAILED.value)  # message: the build log's tail, set by _build
    elif build == "building":
        st.set(phase=Phase.BUILDING.value, message=target or f"building {_build_target(ctx, ref)}")
    elif ready_state == "ready":
        st.set(phase=Phase.READY.value, message=_ready_message(ref, current, paused))
        versions = history.recorded(old, dict(body.get("spec") or {}), ref.code_hash, now())
        if versions is not None:
            st.set(versions=versions)
    elif ready_state == "failed":
        st.set(phase=Phase.FAILED.value, message=ready_message)
    else:
        st.set(phase=Phase.BUILDING.value, message=f"rolling out {image}")
    if ready_state == "ready":  # a traffic split's other version beside this one (split.py)
        st.set(split=await split.sync(ctx, _with_versions(body, st), ref, replicas))
    await _write(ctx, body, st, build, current is not None, ref.fetched)
    if image:
        # the status just written: a Go function's cron runs fetch the binary it names
        await trigger.sync_for_function(ctx, {**body, "status": {**old, **st.fields}}, image)


def _with_versions(body: dict[str, Any], st: StatusBuilder) -> dict[str, Any]:
    """BODY with the versions this reconcile records (the split is checked against the newest)."""
    versions = st.fields.get("versions")
    if versions is None:
        return body
    return {**body, "status": {**(body.get("status") or {}), "versions": versions}}


def _build_target(ctx: Context, ref: FunctionRef) -> str:
    if ref.fetched:
        return manifests.deps_image_ref(ctx.config, ref.namespace, ref.deps_hash)
    return manifests.image_ref(ctx.config, ref.namespace, ref.name, ref.code_hash)


async def _dependencies(ctx: Context, ref: FunctionRef, old: dict[str, Any], st: StatusBuilder) -> tuple[str, str]:
    """The image fetched code runs on: ("built" | "building" | "failed", image).

    No dependencies: the runtime's image, nothing to build. Else the tenant's dependency image of
    that key: one Job per tenant and key, whichever of its functions asks first; the others find the
    Job (or a function whose status already names the image) and build nothing.
    """
    config = ctx.config
    if not ref.deps_hash:
        image = manifests.runtime_image(config, ref.spec.runtime)
        st.set(buildJob="", depsImage="")
        st.condition("Built", True, "NoDependencies", f"runs on {image}")
        return "built", image
    want = manifests.deps_image_ref(config, ref.namespace, ref.deps_hash)
    job_name = manifests.deps_job_name(ref.namespace, ref.deps_hash)
    built = condition_of(old, "Built")
    st.set(buildJob=job_name)
    shared = [f for f in ctx.functions_in(ref.namespace) if (f.get("status") or {}).get("depsImage") == want]
    if old.get("depsImage") == want or shared:
        st.set(depsImage=want)
        st.condition("Built", True, "Built", want)
        return "built", want
    if old.get("buildJob") == job_name and built.get("reason") == "BuildFailed":
        if old.get("failedContext") == ref.context_key:
            st.condition("Built", False, "BuildFailed", str(built.get("message") or ""))
            st.set(message=str(old.get("message") or built.get("message") or "build failed"))
            return "failed", want
        # the same dependencies uploaded again after a failure: build them again (the failed Job goes first;
        # its deletion wakes this Function, which then finds no Job and creates one)
        await ctx.kube.delete(api_path("batch/v1", "jobs", config.build_namespace, job_name))
        st.set(failedContext="").condition("Built", None, "Building", "building the dependencies again")
        return "building", want
    job: JobSummary | None = ctx.job(config.build_namespace, job_name)
    if job is None:
        await tenancy.ensure_build_namespace(ctx)
        job = job_summary(await children.ensure(ctx.kube, manifests.build_job(config, ref)))
    if job.state == "complete":
        st.set(depsImage=want, lastBuiltAt=job.completion_time or now())
        st.condition("Built", True, "Built", want)
        return "built", want
    if job.state == "failed":
        selector = f"{crd.LABEL_NAMESPACE}={ref.namespace},{manifests.LABEL_DEPS}={ref.deps_hash[:32]}"
        output = await capture.pod_output(ctx.kube, config.build_namespace, selector, manifests.PUSH_CONTAINER,
                                          succeeded=False, init_containers=manifests.BUILD_STEPS)  # fmt: skip
        reason = f"{job.reason}: {job.message}".strip(": ")
        message = f"dependency build failed ({reason})" + (f":\n{output}" if output else "")
        st.condition("Built", False, "BuildFailed", message)
        st.set(message=message, failedContext=ref.context_key)
        return "failed", want
    st.condition("Built", None, "Building", f"dependency build Job {config.build_namespace}/{job_name}")
    return "building", want


async def _code_url(ctx: Context, ref: FunctionRef, old: dict[str, Any], st: StatusBuilder) -> None:
    """Make sure the Secret holds a live URL of the current code archive (renewed at half its life)."""
    current = old.get("codeUrl") if isinstance(old.get("codeUrl"), dict) else {}
    if codeurl.needs_renewal(ctx.config, ref, current or {}, time.time()):
        current = await codeurl.publish(ctx.kube, ctx.signer, ctx.config, ref)
    st.set(codeUrl=current)


def _fetch_failure(ctx: Context, ref: FunctionRef, rollout: tuple[str, str] | None) -> tuple[str, str] | None:
    """A rollout whose new pods cannot fetch their code is failed now, with the fetch's reason."""
    failure = ctx.state.fetch_failures.get((ref.namespace, ref.name))
    if failure is None or failure[0] != ref.fetch_key:
        return rollout
    if rollout is not None and rollout[0] == "ready":
        ctx.state.fetch_failures.pop((ref.namespace, ref.name), None)
        return rollout
    return "failed", f"the function's pods cannot start: {failure[1]}"


async def _compile(ctx: Context, ref: FunctionRef, builder: str, old: dict[str, Any],
                   st: StatusBuilder) -> tuple[str, str, FunctionRef]:  # fmt: skip
    """Make sure a Go function's fetched code has a binary: ("built" | "building" | "failed", message, REF
    naming the binary when built).

    The compile Job runs in the tenant namespace on BUILDER (the dependency image, else the runtime's);
    ``status.binary`` keeps the binary that serves (key, SHA-256, the code it came from), which run and
    cron pods fetch too; ``status.binaries`` the last ones compiled (key -> SHA-256), so a rollback or a
    traffic split's other version finds its binary without compiling again. A failed compile is
    remembered by ``compileJob`` + ``Built`` ``CompileFailed``; the same code uploaded again is another
    code archive, so it compiles again.
    """
    config = ctx.config
    key = manifests.binary_key(ref, builder)
    job_name = manifests.compile_job_name(ref, key)
    current = old.get("binary")
    if isinstance(current, dict) and current.get("key") == key and ref.binary_key == key:
        st.condition("Built", True, "Compiled", key)
        return "built", "", ref
    known = manifests.known_binaries(old)
    if key in known:  # compiled before (a rollback, a traffic split's version): nothing to compile
        st.set(binary={"key": key, "sha256": known[key], "codeKey": ref.code_key})
        st.condition("Built", True, "Compiled", key)
        return "built", "", replace(ref, binary_key=key, binary_sha256=known[key])
    st.set(compileJob=job_name)
    built = condition_of(old, "Built")
    if old.get("compileJob") == job_name and built.get("reason") == "CompileFailed":
        message = str(old.get("message") or built.get("message") or "compile failed")
        st.condition("Built", False, "CompileFailed", str(built.get("message") or ""))
        st.set(message=message)
        return "failed", message, ref
    job: JobSummary | None = ctx.job(ref.namespace, job_name)
    if job is None:
        ttl = config.build_deadline_sec + 600  # both URLs live as long as the Job may
        want = manifests.compile_job(config, ref, builder, key, ctx.signer.sign(ref.code_key, ttl),
                                     ctx.signer.sign_put(key, ttl))  # fmt: skip
        job = job_summary(await children.ensure(ctx.kube, want))
    selector = f"{manifests.JOB_NAME_LABEL}={job_name}"
    seen = ctx.state.compiled.pop((ref.namespace, job_name), None)  # the pod's upload ended: before the Job's status
    if seen is not None or job.state == "complete":
        output = seen if seen is not None else await capture.pod_output(
            ctx.kube, ref.namespace, selector, manifests.UPLOAD_CONTAINER, succeeded=True)
        sha256 = _uploaded_digest(output)
        if sha256:
            st.set(binary={"key": key, "sha256": sha256, "codeKey": ref.code_key},
                   binaries=manifests.remember_binary(known, key, sha256))
            st.condition("Built", True, "Compiled", key)
            return "built", "", replace(ref, binary_key=key, binary_sha256=sha256)
        message = f"compile Job {job_name} finished without naming its binary's SHA-256 (got {output[:200]!r})"
    elif job.state == "failed":
        output = await capture.pod_output(ctx.kube, ref.namespace, selector, manifests.UPLOAD_CONTAINER,
                                          succeeded=False, init_containers=(manifests.FETCH_CODE_CONTAINER,
                                                                            manifests.COMPILE_CONTAINER))  # fmt: skip
        reason = f"{job.reason}: {job.message}".strip(": ")
        message = f"compile failed ({reason})" + (f":\n{output}" if output else "")
    else:
        st.condition("Built", None, "Compiling", f"compile Job {ref.namespace}/{job_name}")
        return "building", f"compiling in Job {job_name}", ref
    st.condition("Built", False, "CompileFailed", message)
    st.set(message=message)
    return "failed", message, ref


def _uploaded_digest(output: str) -> str:
    """The SHA-256 that ``binaryupload`` left as its termination message, or ""."""
    try:
        found = json.loads(output)
    except ValueError:
        return ""
    sha256 = found.get("sha256") if isinstance(found, dict) else None
    if isinstance(sha256, str) and len(sha256) == 64 and all(c in "0123456789abcdef" for c in sha256):
        return sha256
    return ""


async def _build(ctx: Context, ref: FunctionRef, old: dict[str, Any], st: StatusBuilder) -> str:
    """Make sure the current code has an image: "built", "building" or "failed"."""
    config = ctx.config
    want_image = manifests.image_ref(config, ref.namespace, ref.name, ref.code_hash)
    job_name = manifests.build_job_name(ref.namespace, ref.name, ref.code_hash, ref.context_key)
    built = condition_of(old, "Built")
    st.set(buildJob=job_name)
    if old.get("codeHash") == ref.code_hash and old.get("image") == want_image:
        st.condition("Built", True, "Built", want_image)
        return "built"
    if old.get("buildJob") == job_name and built.get("reason") == "BuildFailed":
        st.condition("Built", False, "BuildFailed", str(built.get("message") or ""))
        st.set(message=str(old.get("message") or built.get("message") or "build failed"))
        return "failed"

    job: JobSummary | None = ctx.job(config.build_namespace, job_name)
    if job is None:
        await tenancy.ensure_build_namespace(ctx)
        job = job_summary(await children.ensure(ctx.kube, manifests.build_job(config, ref)))
    if job.state == "complete":
        st.set(image=want_image, codeHash=ref.code_hash, lastBuiltAt=job.completion_time or now())
        st.condition("Built", True, "Built", want_image)
        return "built"
    if job.state == "failed":
        selector = build_pod_selector(ref)
        output = await capture.pod_output(ctx.kube, config.build_namespace, selector, manifests.PUSH_CONTAINER,
                                          succeeded=False, init_containers=manifests.BUILD_STEPS)  # fmt: skip
        reason = f"{job.reason}: {job.message}".strip(": ")
        message = f"build failed ({reason})" + (f":\n{output}" if output else "")
        st.condition("Built", False, "BuildFailed", message)
        st.set(message=message)
        return "failed"
    st.condition("Built", None, "Building", f"build Job {config.build_namespace}/{job_name}")
    return "building"


def build_pod_selector(ref: FunctionRef) -> str:
    return ",".join([f"{crd.LABEL_COMPONENT}={manifests.COMPONENT_BUILD}", f"{crd.LABEL_NAMESPACE}={ref.namespace}",
                     f"{crd.LABEL_FUNCTION}={ref.name}", f"{manifests.LABEL_CODE}={ref.code_hash[:16]}"])  # fmt: skip


def _ready_message(ref: FunctionRef, current: DeploymentSummary | None, paused: bool) -> str:
    """A Ready Function's message: empty, but for a scaled one at 0 replicas."""
    if ref.spec.scale is None or current is None or not current.autoscaled or current.replicas:
        return ""
    return "scaled to zero (every http trigger is disabled)" if paused else "scaled to zero"


async def _deploy(ctx: Context, ref: FunctionRef, image: str, replicas: int, paused: bool) -> DeploymentSummary:
    """Deployment + Service (+ ScaledObject, PodDisruptionBudget) as the spec says; returns what the
    Deployment looks like now.

    REPLICAS: the fixed count (``observe.desired_replicas``). A Function with ``scale`` has a ScaledObject
    instead (PAUSED: held at 0) and its Deployment's replicas are never written after its creation. What
    goes goes first: the ScaledObject before the operator writes replicas again, the disruption budget
    before the Deployment that no longer needs it.
    """
    scaled = ref.spec.scale is not None
    want = manifests.deployment(ctx.config, ref, image, None if scaled else replicas)
    live = ctx.deployment(ref.namespace, ref.name)
    want_hash = want["metadata"]["annotations"][manifests.SPEC_HASH]
    stale = live is None or live.spec_hash != want_hash or (not scaled and live.replicas != replicas)
    many = manifests.many_replicas(ref, scaled)
    svc = manifests.service(ref)
    key = (ref.namespace, "Service", ref.name)
    svc_hash = f"{ref.owner.uid}/{svc['metadata']['annotations'][manifests.SPEC_HASH]}"

    if not scaled and ((live is not None and live.autoscaled)
                       or autoscale.applied(ctx, ref.namespace, "ScaledObject", ref.name)):  # fmt: skip
        await autoscale.delete_scaled_object(ctx, ref.namespace, ref.name)
    if not many and ((live is not None and live.spread)
                     or autoscale.applied(ctx, ref.namespace, "PodDisruptionBudget", ref.name)):  # fmt: skip
        await autoscale.delete_disruption_budget(ctx, ref.namespace, ref.name)

    async def deploy() -> DeploymentSummary | None:
        if stale or (live is not None and ref.owner.uid not in live.owner_uids):
            initial = None
            if ref.spec.scale is not None:
                initial = {"replicas": manifests.initial_replicas(ref.spec.scale, paused)}
            applied = deployment_summary(await children.ensure(ctx.kube, want, exists=live is not None,
                                                               initial=initial))  # fmt: skip
            ctx.state.template_generations[(ref.namespace, ref.name)] = applied.generation
            return dataclasses.replace(applied, template_generation=applied.generation)
        if live is not None and live.autoscaled:
            written = ctx.state.template_generations.get((ref.namespace, ref.name), 0)
            return dataclasses.replace(live, template_generation=written)
        return live

    async def expose() -> None:
        if ctx.state.applied.get(key) != svc_hash:
            await children.ensure(ctx.kube, svc)
            ctx.state.applied[key] = svc_hash
        if many:
            await autoscale.ensure_disruption_budget(ctx, ref)
        if scaled:
            await autoscale.ensure_scaled_object(ctx, ref, paused)

    # independent objects: one round-trip of latency instead of two
    current, _ = await asyncio.gather(deploy(), expose())
    assert current is not None
    return current


async def cleanup(ctx: Context, namespace: str, name: str) -> None:
    """On deletion: what garbage collection cannot reach.

    The Deployment and Service go with their owner reference. Build Jobs live in the build
    namespace (no owner reference across namespaces) and the triggers' CronJobs belong to the
    Triggers, so both are deleted here by label.
    """
    if tenancy.refusal(namespace):
        ctx.state.statuses.pop((namespace, name), None)
        return  # nothing was ever created for it
    kube = ctx.kube
    build_selector = ",".join([f"{crd.LABEL_COMPONENT}={manifests.COMPONENT_BUILD}",
                               f"{crd.LABEL_NAMESPACE}={namespace}", f"{crd.LABEL_FUNCTION}={name}"])  # fmt: skip
    await kube.delete_collection(api_path("batch/v1", "jobs", ctx.config.build_namespace), build_selector)
    cron_selector = f"{crd.LABEL_COMPONENT}={manifests.COMPONENT_CRON},{crd.LABEL_FUNCTION}={name}"
    await kube.delete_collection(api_path("batch/v1", "cronjobs", namespace), cron_selector)
    ctx.state.statuses.pop((namespace, name), None)
    split.forget(namespace, name)  # its objects go with their owner reference
    names = (name, *_cron_names(ctx, namespace, name))
    for key in [k for k in ctx.state.applied if k[0] == namespace and k[2] in names]:
        del ctx.state.applied[key]


def _cron_names(ctx: Context, namespace: str, name: str) -> list[str]:
    return [manifests.cron_job_name(t.name) for t in ctx.triggers_of(namespace, name)]
