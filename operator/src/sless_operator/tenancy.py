"""Tenant namespaces: Pod Security ``restricted``, a quota, default limits and network isolation.

Functions run in the tenant namespace itself (``sless-<16 hex>``). The first time the operator
sees one of our resources there, it labels the namespace and creates the ResourceQuota, the
LimitRange and the NetworkPolicies (``manifests.tenant_objects``); later reconciles skip the
work. Each operator process does it once per namespace, so a new version's quota or policies
reach existing tenants when the upgraded operator starts. The RoleBinding that gives the API its
rights in the namespace is the API's own to make (``sless_api.backends.kube.access``): the operator may
bind no role, so a compromised operator cannot hand out RBAC rights.

A Function, Trigger or FunctionJob in any other namespace (``default``, ``kube-system``, the
platform's own) is refused: whoever may write our custom resources there must not get a
Deployment, a Job or a build out of the operator's privileges. ``refusal`` says why, the
reconcilers write it into the resource's status and create nothing. The chart's admission
policy enforces the same boundary on the apiserver side.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sless_core import crd
from sless_core.naming import is_tenant_namespace
from sless_operator import children, manifests
from sless_operator.context import Context
from sless_operator.kube import ApiError, api_path

NOT_A_TENANT = "NotATenantNamespace"


def refusal(namespace: str) -> str | None:
    """Why nothing is created for a resource in NAMESPACE, or None when it is a tenant namespace."""
    if is_tenant_namespace(namespace):
        return None
    return (f"namespace {namespace!r} is not a tenant namespace ('sless-' and 16 lower-case hex digits): "
            "the operator creates nothing for resources here")  # fmt: skip


class NamespaceMissing(Exception):
    """The namespace is gone (being deleted); nothing can be created there."""


class NotATenant(Exception):
    """A caller asked to prepare a namespace that is not a tenant's (the reconcilers check first)."""


async def ensure(ctx: Context, namespace: str) -> None:
    """Make NAMESPACE a proper tenant namespace, once per operator process (never another namespace)."""
    state = ctx.state
    if namespace in state.tenants_ready:
        return
    if not is_tenant_namespace(namespace):
        raise NotATenant(str(refusal(namespace)))
    async with state.locks.hold(("tenant", namespace)):
        if namespace in state.tenants_ready:
            return
        patched = await ctx.kube.patch(api_path("v1", "namespaces", name=namespace),
                                       {"metadata": {"labels": crd.tenant_namespace_labels()}})  # fmt: skip
        if patched is None:
            raise NamespaceMissing(f"namespace {namespace} does not exist")
        for obj in manifests.tenant_objects(ctx.config, namespace):
            await _ensure_after_marking(ctx, obj)
        state.tenants_ready.add(namespace)


MARK_SETTLE_SEC = (0.2, 0.5, 1.0, 2.0)


async def _ensure_after_marking(ctx: Context, obj: dict[str, Any]) -> None:
    """``children.ensure`` that waits out the admission policy's view of a namespace just marked.

    The chart's policy reads the namespace's labels from the apiserver's cache, which may lag the
    patch that put ``sless.dev/tenant`` on by a moment; only that denial is retried, briefly.
    """
    for delay in (*MARK_SETTLE_SEC, None):
        try:
            await children.ensure(ctx.kube, obj)
            return
        except ApiError as exc:
            if delay is None or exc.status != 403 or "ValidatingAdmissionPolicy" not in exc.message:
                raise
        await asyncio.sleep(delay)


async def ensure_build_namespace(ctx: Context) -> None:
    """Create the build namespace when missing; an existing one (the chart's) is left as it is."""
    if ctx.state.build_namespace_ready:
        return
    try:
        await ctx.kube.create(api_path("v1", "namespaces"), manifests.build_namespace(ctx.config))
    except ApiError as exc:
        # 403: the operator may not create namespaces; fine when the chart made this one
        exists = exc.status == 403 and await ctx.kube.get(api_path("v1", "namespaces", name=ctx.config.build_namespace))
        if not (exc.conflict or exists):
            raise
    ctx.state.build_namespace_ready = True
