"""A scaled Function's KEDA ScaledObject, and the PodDisruptionBudget of a Deployment of 2 or more pods.

A Function with ``scale`` gets one ScaledObject (``manifests.scaled_object``) named like its Deployment:
KEDA (and the HPA it makes) own the Deployment's replicas from then on, and the operator never writes
them while the ScaledObject exists (the Deployment says so with ``sless.dev/autoscaled``, which also
tells a later reconcile, after a restart too, that there is a ScaledObject to delete once ``scale`` is
removed). Every http trigger disabled (``observe.switched_off``) pauses it at 0.

KEDA is optional: whether the cluster serves ScaledObjects is asked of the discovery API (which every
authenticated client may read: no RBAC), remembered for a while and asked again, so KEDA installed
later is found without a restart. Without it a scaled Function fails with ``KedaMissing``, which Kopf
retries; every other Function is served as before.
"""

from __future__ import annotations

import time

from sless_operator import children, manifests
from sless_operator.context import Context
from sless_operator.kube import ApiError, api_path
from sless_operator.manifests import FunctionRef

SCALED_OBJECTS = "scaledobjects"
#: how long an answer of the discovery API is trusted: KEDA missing is asked again soon (it may be
#: being installed), KEDA present now and then (a 404 on a ScaledObject write asks at once)
ABSENT_RECHECK_SEC = 10.0
PRESENT_RECHECK_SEC = 300.0


def _now() -> float:
    return time.monotonic()


class KedaMissing(Exception):
    """The cluster serves no KEDA ScaledObjects: a Function with ``scale`` cannot run."""


def missing_message(api_version: str) -> str:
    group = api_version.split("/", 1)[0]
    return f"scaling needs KEDA: {SCALED_OBJECTS}.{group} ({api_version}) is not installed"


async def serves(ctx: Context, api_version: str, plural: str) -> bool:
    """Does the apiserver serve PLURAL in API_VERSION (``<group>/<version>``)? Asked of the discovery API."""
    found = await ctx.kube.get(f"/apis/{api_version}")
    return any(r.get("name") == plural for r in (found or {}).get("resources") or [])


async def keda_installed(ctx: Context) -> bool:
    """Whether the cluster serves KEDA's ScaledObjects (the configured API version), as last discovered."""
    known = ctx.state.keda
    now = _now()
    if known is not None and now - known[1] < (PRESENT_RECHECK_SEC if known[0] else ABSENT_RECHECK_SEC):
        return known[0]
    async with ctx.state.locks.hold(("discovery", SCALED_OBJECTS)):
        known = ctx.state.keda
        if known is not None and known[1] >= now:  # another reconcile asked while this one waited
            return known[0]
        present = await serves(ctx, ctx.config.keda_api_version, SCALED_OBJECTS)
        ctx.state.keda = (present, _now())
        return present


async def require_keda(ctx: Context) -> None:
    if not await keda_installed(ctx):
        raise KedaMissing(missing_message(ctx.config.keda_api_version))


def _key(namespace: str, kind: str, name: str) -> tuple[str, str, str]:
    return (namespace, kind, name)


async def ensure_scaled_object(ctx: Context, ref: FunctionRef, paused: bool) -> None:
    """Create or update the Function's ScaledObject (skipped when this process applied exactly this)."""
    want = manifests.scaled_object(ctx.config, ref, paused)
    key = _key(ref.namespace, "ScaledObject", ref.name)
    stamp = f"{ref.owner.uid}/{want['metadata']['annotations'][manifests.SPEC_HASH]}"
    if ctx.state.applied.get(key) == stamp:
        return
    try:
        await children.ensure(ctx.kube, want)
    except ApiError as exc:
        if exc.status == 404:  # the resource is not served (any more): KEDA was removed
            ctx.state.keda = (False, _now())
            raise KedaMissing(missing_message(ctx.config.keda_api_version)) from exc
        raise
    ctx.state.applied[key] = stamp


async def delete_scaled_object(ctx: Context, namespace: str, name: str) -> None:
    """Remove the Function's ScaledObject (KEDA removes its HPA): the operator owns the replicas again."""
    ctx.state.applied.pop(_key(namespace, "ScaledObject", name), None)
    path = api_path(ctx.config.keda_api_version, SCALED_OBJECTS, namespace, name)
    try:
        await ctx.kube.delete(path)
    except ApiError as exc:
        if exc.status != 404:
            raise


async def ensure_disruption_budget(ctx: Context, ref: FunctionRef) -> None:
    want = manifests.pod_disruption_budget(ref)
    key = _key(ref.namespace, "PodDisruptionBudget", ref.name)
    stamp = f"{ref.owner.uid}/{want['metadata']['annotations'][manifests.SPEC_HASH]}"
    if ctx.state.applied.get(key) != stamp:
        await children.ensure(ctx.kube, want)
        ctx.state.applied[key] = stamp


async def delete_disruption_budget(ctx: Context, namespace: str, name: str) -> None:
    ctx.state.applied.pop(_key(namespace, "PodDisruptionBudget", name), None)
    await ctx.kube.delete(api_path("policy/v1", "poddisruptionbudgets", namespace, name))


def applied(ctx: Context, namespace: str, kind: str, name: str) -> bool:
    """Did this process create KIND NAME (and not delete it since)?"""
    return _key(namespace, kind, name) in ctx.state.applied
