"""A traffic split's other version on Kubernetes: a second Deployment + Service beside the Function's own.

``spec.traffic`` (written by the API, ``sless_core.traffic``) shares http calls between the current
version and one other kept version. That other version runs as it was recorded in ``status.versions``:
its spec and code (hash, code key, dependency image or built image) pinned, so a Python or Node version
fetches its own archive at pod start (its own code-URL Secret) and needs no build. Its objects are named
``traffic.other_version_name`` (``<function>-split-<hash>``) and labelled
``sless.dev/split-of: <function>``; their pods keep the function component label (the tenant's
NetworkPolicy lets the platform reach them) under a function label of their own, so the Function's
Service never selects them. A split that is dropped, or names only the current
version, removes them.

The other version keeps fixed replicas (the Function's ``replicas``, 0 while it is switched off) even
when the Function scales with demand (``scale``): only the current version's Deployment has a KEDA
ScaledObject (``autoscale``); a split is a short phase of a release, not where the load is met.

``status.split`` says what runs: ``{"version": N, "ready": bool}`` (absent: nothing); the API's router
shares calls only once it is ready, so a call never goes to pods that are not there yet.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from sless_core.crcodec import FunctionResource, FunctionVersion
from sless_core.traffic import LABEL_SPLIT_OF, other_version_name
from sless_operator import children, codeurl, manifests
from sless_operator.context import Context
from sless_operator.kube import api_path
from sless_operator.manifests import FunctionRef
from sless_operator.observe import deployment_summary

#: what the last published code URL of each split was ({"key", "expires"}), to renew it at half its life
_URLS: dict[tuple[str, str], dict[str, Any]] = {}


def _labelled(obj: dict[str, Any], name: str) -> dict[str, Any]:
    obj["metadata"]["labels"][LABEL_SPLIT_OF] = name
    return obj


def other_ref(ref: FunctionRef, version: FunctionVersion) -> FunctionRef:
    """The Function's REF as VERSION ran it, under the name of the split's objects."""
    code = version.code
    return FunctionRef(namespace=ref.namespace, name=other_version_name(ref.name), spec=version.spec,
                       code_hash=version.code_hash, context_key=code.context_key, owner=ref.owner,
                       context_sha256=code.context_sha256, secrets_version=ref.secrets_version,
                       code_key=code.code_key, code_sha256=code.code_sha256, deps_hash=code.deps_hash,
                       replicas=ref.replicas)  # fmt: skip


def image_of(ctx: Context, function: str, other: FunctionRef) -> str:
    """The image the other version's pods run: the runtime's or its dependency image (fetched code), else the
    image built for its code (tagged by code hash, so it is still there)."""
    if other.fetched:
        if other.deps_hash:
            return manifests.deps_image_ref(ctx.config, other.namespace, other.deps_hash)
        return manifests.runtime_image(ctx.config, other.spec.runtime)
    return manifests.image_ref(ctx.config, other.namespace, function, other.code_hash)


def wanted_version(body: dict[str, Any]) -> FunctionVersion | None:
    """The kept version the split names beside the current one, if there is one to run."""
    fn = FunctionResource.from_cr(body)
    current = fn.current_version
    if fn.traffic is None or current is None or current not in fn.traffic.versions():
        return None
    other = fn.traffic.other_than(current)
    return fn.version(other.version) if other is not None else None


async def sync(ctx: Context, body: dict[str, Any], ref: FunctionRef, replicas: int) -> dict[str, Any] | None:
    """Run (or remove) the split's other version; returns ``status.split`` (None: no split runs)."""
    version = wanted_version(body)
    if version is None:
        await remove(ctx, ref.namespace, ref.name)
        return None
    other = other_ref(ref, version)
    image = image_of(ctx, ref.name, other)
    if other.compiled:  # a Go version runs the binary compiled for it, when it is still known
        binary = manifests.binary_key(replace(other, name=ref.name), image)
        sha256 = manifests.known_binaries(dict(body.get("status") or {})).get(binary)
        if sha256 is None:
            await remove(ctx, ref.namespace, ref.name)
            return None
        other, image = replace(other, binary_key=binary, binary_sha256=sha256), ctx.config.go_run_image
    if other.fetched:
        key = (ref.namespace, other.name)
        if codeurl.needs_renewal(ctx.config, other, _URLS.get(key, {}), time.time()):
            _URLS[key] = await codeurl.publish(ctx.kube, ctx.signer, ctx.config, other)
            secret_path = api_path("v1", "secrets", ref.namespace, manifests.code_secret_name(other.name))
            await ctx.kube.patch(secret_path, {"metadata": {"labels": {LABEL_SPLIT_OF: ref.name}}})
    deployment = _labelled(manifests.deployment(ctx.config, other, image, replicas), ref.name)
    live = ctx.deployment(ref.namespace, other.name)
    want_hash = deployment["metadata"]["annotations"][manifests.SPEC_HASH]
    if live is None or live.spec_hash != want_hash or live.replicas != replicas:
        live = deployment_summary(await children.ensure(ctx.kube, deployment, exists=live is not None))
    await children.ensure(ctx.kube, _labelled(manifests.service(other), ref.name))
    ready = live.rollout()[0] == "ready"
    return {"version": version.version, "ready": ready}


async def remove(ctx: Context, namespace: str, name: str) -> None:
    """Delete the split's objects of function NAME (only ones labelled as its split: never another's)."""
    other = other_version_name(name)
    paths = (api_path("apps/v1", "deployments", namespace, other), api_path("v1", "services", namespace, other),
             api_path("v1", "secrets", namespace, manifests.code_secret_name(other)))
    if ctx.deployment(namespace, other) is None and (namespace, other) not in _URLS:
        return
    _URLS.pop((namespace, other), None)
    for path in paths:
        live = await ctx.kube.get(path)
        if live is not None and (live["metadata"].get("labels") or {}).get(LABEL_SPLIT_OF) == name:
            await ctx.kube.delete(path)



def forget(namespace: str, name: str) -> None:
    """A deleted Function: its split's objects go with their owner reference; forget its code URL."""
    _URLS.pop((namespace, other_version_name(name)), None)
