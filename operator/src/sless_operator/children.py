"""Create-or-adopt of child objects: the one idempotent write path every reconcile uses.

A child is created with its deterministic name; when that name is taken (409) the existing
object is adopted: our owner reference and labels are put on it and, when its
``sless.dev/spec-hash`` differs from what we would create, our spec replaces its spec.
That covers a restart after a crash between "create child" and "record it", and a child
someone edited by hand. A child controlled by a different owner is left alone and reported.

The spec is written as a merge patch, which keeps fields it does not name: what our builders set
and may later leave out (``manifests.OWNED_ANNOTATIONS``, a Deployment's topology spread) is named
as null to go. A Deployment without ``spec.replicas`` (a scaled Function's: KEDA owns them) is
created with the count ``ensure`` is given and never gets them written afterwards.
"""

from __future__ import annotations

from typing import Any

from sless_operator.kube import ApiError, Kube, api_path
from sless_operator.manifests import OWNED_ANNOTATIONS, PLURALS, SPEC_HASH

# Jobs' pod templates are immutable: adopting one takes it as it is (metadata only).
IMMUTABLE_SPEC = frozenset({"Job"})


class ChildConflict(Exception):
    """The child's name is held by an object we may not take over."""


def _paths(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    plural = PLURALS[obj["kind"]]
    collection = api_path(obj["apiVersion"], plural, meta.get("namespace"))
    return collection, f"{collection}/{meta['name']}"


def _refs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list(obj.get("metadata", {}).get("ownerReferences") or [])


def merged_owner_refs(want: dict[str, Any], live: dict[str, Any]) -> list[dict[str, Any]] | None:
    """LIVE's owner references with ours in place of any controller; None when another owner controls it.

    A controller reference of the same kind and name but another uid is a deleted predecessor
    (the resource was deleted and created again): the new one takes over.
    """
    ours = _refs(want)
    if not ours:
        return _refs(live)
    mine = ours[0]
    result = [mine]
    for ref in _refs(live):
        if ref.get("uid") == mine["uid"]:
            continue
        if ref.get("controller"):
            if ref.get("kind") == mine["kind"] and ref.get("name") == mine["name"]:
                continue
            return None
        result.append(ref)
    return result


def needs_update(want: dict[str, Any], live: dict[str, Any]) -> bool:
    meta_live = live.get("metadata", {})
    hash_live = (meta_live.get("annotations") or {}).get(SPEC_HASH)
    if want["kind"] not in IMMUTABLE_SPEC and hash_live != want["metadata"]["annotations"][SPEC_HASH]:
        return True
    live_uids = {r.get("uid") for r in _refs(live)}
    if any(r["uid"] not in live_uids for r in _refs(want)):
        return True
    labels = meta_live.get("labels") or {}
    if any(labels.get(k) != v for k, v in want["metadata"].get("labels", {}).items()):
        return True
    want_replicas = want.get("spec", {}).get("replicas")
    return want_replicas is not None and live.get("spec", {}).get("replicas") != want_replicas


def _cleared_spec(want: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    """WANT's spec, naming as null a Deployment's topology spread that the live one has and WANT has not."""
    spec: dict[str, Any] = want["spec"]
    if want["kind"] != "Deployment":
        return spec
    live_pod = ((live.get("spec") or {}).get("template") or {}).get("spec") or {}
    pod = spec.get("template", {}).get("spec", {})
    if live_pod.get("topologySpreadConstraints") and "topologySpreadConstraints" not in pod:
        template = spec["template"]
        return {**spec, "template": {**template, "spec": {**pod, "topologySpreadConstraints": None}}}
    return spec


async def converge(kube: Kube, want: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    """Bring LIVE (an existing object of WANT's name) to WANT; returns the object as it now is."""
    if not needs_update(want, live):
        return live
    refs = merged_owner_refs(want, live)
    name = f"{want['kind']} {want['metadata'].get('namespace', '')}/{want['metadata']['name']}"
    if refs is None:
        controller = next(r for r in _refs(live) if r.get("controller"))
        raise ChildConflict(f"{name} exists and belongs to {controller.get('kind')} {controller.get('name')}")
    meta = want["metadata"]
    annotations = dict(meta.get("annotations", {}))
    live_annotations = live.get("metadata", {}).get("annotations") or {}
    annotations.update({k: None for k in OWNED_ANNOTATIONS if k in live_annotations and k not in annotations})
    patch: dict[str, Any] = {"metadata": {"labels": meta.get("labels", {}), "annotations": annotations}}
    if refs:
        patch["metadata"]["ownerReferences"] = refs
    if want["kind"] not in IMMUTABLE_SPEC:
        patch["spec"] = _cleared_spec(want, live)
    else:
        # keep the live spec-hash: what runs is their template, not ours
        patch["metadata"]["annotations"] = {k: v for k, v in patch["metadata"]["annotations"].items()
                                            if k != SPEC_HASH}  # fmt: skip
    _, path = _paths(want)
    try:
        result = await kube.patch(path, patch)
    except ApiError as exc:
        if exc.status == 422:
            raise ChildConflict(f"{name} exists and cannot be adopted: {exc.message}") from exc
        raise
    if result is None:  # deleted meanwhile: create it next time round
        raise ApiError(503, "Gone", f"{name} disappeared while being adopted")
    return result


async def ensure(kube: Kube, want: dict[str, Any], exists: bool = False,
                 initial: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Create WANT, or converge the existing object; EXISTS (the caller saw it) skips the create try.

    INITIAL: spec fields only a create sets (a scaled Deployment's first replicas; from then on its
    autoscaler owns them).
    """
    collection, path = _paths(want)
    live = await kube.get(path) if exists else None
    if live is None:
        body = {**want, "spec": {**want["spec"], **initial}} if initial else want
        try:
            return await kube.create(collection, body)
        except ApiError as exc:
            if not exc.conflict:
                raise
        live = await kube.get(path)
        if live is None:
            raise ApiError(503, "Gone", f"{path} existed a moment ago and is gone; retrying")
    return await converge(kube, want, live)
