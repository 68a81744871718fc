#!/usr/bin/python
"""The tenants' namespaces, their Functions, Triggers and FunctionJobs with their status, and their secrets as
Kubernetes Secrets: into a backup folder, and back into a cluster while no operator runs."""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sless_backup_files import BackupError, read_json, write_json

DOCUMENTATION = r"""
---
module: sless_backup_resources
short_description: Copy the sless tenants' namespaces, custom resources (with status) and Secrets to a folder and back
description:
  - V(save) writes, below O(path), C(namespaces.json) (every namespace labelled C(sless.dev/tenant=true) whose name
    is a tenant's, with its labels and annotations), C(resources.json) (every Function, Trigger and FunctionJob in
    them, C(sless.dev/v1alpha1), with spec, labels, annotations, owner references and status, a Function's version
    history C(status.versions) included) and C(secrets.json) (the platform's Secrets in them, C(sless-secret-<name>):
    the tenants' secrets on the kubernetes secret store, and Vault's mirror of them), all 0600. Objects elsewhere or
    with names the platform never gives are skipped and named in C(skipped). The operator's own bookkeeping
    (its finalizer, its last-handled and progress annotations, C(status.kopf)) is left out.
  - V(restore) checks every namespace, name and kind first (anything else fails the task before the cluster is
    written), then creates or updates the namespaces, the Secrets, the Functions and then the Triggers and
    FunctionJobs (their owner references pointed at the restored Functions), and writes each resource's status
    through the status subresource right after it. Run it while no operator runs, so the operator later finds
    the history and the state there and records no new version nor starts a finished job again. Objects the
    cluster holds and the backup does not are left alone. Check mode checks and counts only.
options:
  mode:
    description: V(save) (cluster to folder) or V(restore) (folder to cluster).
    type: str
    choices: [save, restore]
    required: true
  path:
    description: The backup's Kubernetes folder.
    type: path
    required: true
  kubeconfig:
    description: The kubeconfig (empty, C($K8S_AUTH_KUBECONFIG), then C($KUBECONFIG), then the pod's service account).
    type: str
    default: ""
"""

RETURN = r"""
counts:
  description: How many namespaces, Functions, Triggers, FunctionJobs and Secrets the backup holds.
  returned: always
  type: dict
written:
  description: V(restore), how many objects of each kind were created or changed.
  returned: always
  type: dict
skipped:
  description: V(save), the objects left out (namespace/name and why).
  returned: always
  type: list
  elements: str
"""

GROUP, VERSION = "sless.dev", "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
#: The kinds in the order they are restored: Triggers and FunctionJobs name their Function as owner.
KINDS = {"Function": "functions", "Trigger": "triggers", "FunctionJob": "functionjobs"}
TENANT_SELECTOR = "sless.dev/tenant=true"
SECRET_SELECTOR = "app.kubernetes.io/managed-by=sless,sless.dev/secret"  # noqa: S105 (a label selector)
SECRET_LABEL = "sless.dev/secret"  # noqa: S105 (a label key)
#: The operator's (Kopf's) bookkeeping on a resource, under its prefix: not part of a backup.
OPERATOR_STATE = ("last-handled-configuration", "function-", "trigger-", "functionjob-")
#: Labels and annotations the API server or kubectl set themselves.
SYSTEM_KEYS = ("kubernetes.io/metadata.name", "kubectl.kubernetes.io/last-applied-configuration")
FILES = ("namespaces.json", "resources.json", "secrets.json")


def api_client(kubeconfig: str) -> Any:
    from kubernetes import client, config

    path = kubeconfig or os.environ.get("K8S_AUTH_KUBECONFIG") or os.environ.get("KUBECONFIG") or ""
    if path:
        return config.new_client_from_config(config_file=path)
    config.load_incluster_config()
    return client.ApiClient()


def _plain(mapping: Any, drop: tuple[str, ...] = ()) -> dict[str, str]:
    return {str(k): str(v) for k, v in (mapping or {}).items() if k not in SYSTEM_KEYS and not k.startswith(drop)}


def _annotations(meta: dict[str, Any]) -> dict[str, str]:
    return _plain(meta.get("annotations"), tuple(f"sless.dev/{s}" for s in OPERATOR_STATE))


def _kept(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    status = {k: v for k, v in (obj.get("status") or {}).items() if k != "kopf"}
    owners = [{k: r[k] for k in ("apiVersion", "kind", "name", "controller", "blockOwnerDeletion") if k in r}
              for r in meta.get("ownerReferences") or [] if r.get("kind") == "Function"]  # fmt: skip
    kept_meta: dict[str, Any] = {"name": meta.get("name"), "namespace": meta.get("namespace"),
                                 "labels": _plain(meta.get("labels")), "annotations": _annotations(meta)}  # fmt: skip
    if owners:
        kept_meta["ownerReferences"] = owners
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": kept_meta, "spec": obj.get("spec") or {},
            "status": status}


def save(api: Any, folder: Path) -> tuple[dict[str, int], list[str]]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from sless_core.naming import is_function_name, is_tenant_namespace, secret_object_name

    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    skipped: list[str] = []
    namespaces = []
    for ns in core.list_namespace(label_selector=TENANT_SELECTOR).items:
        name = ns.metadata.name
        if not is_tenant_namespace(name):
            skipped.append(f"namespace {name} (not a tenant namespace's name)")
            continue
        if ns.metadata.deletion_timestamp:
            skipped.append(f"namespace {name} (being deleted)")
            continue
        namespaces.append({"name": name, "labels": _plain(ns.metadata.labels),
                           "annotations": _plain(ns.metadata.annotations)})  # fmt: skip
    names = {ns["name"] for ns in namespaces}
    resources: dict[str, list[dict[str, Any]]] = {}
    for kind, plural in KINDS.items():
        try:
            found = custom.list_cluster_custom_object(GROUP, VERSION, plural).get("items") or []
        except ApiException as exc:
            if exc.status != 404:
                raise
            found = []  # no CRD: the platform was never installed, or uninstalled with its CRDs
        resources[kind] = []
        for obj in sorted(found, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"])):
            where = f"{kind} {obj['metadata']['namespace']}/{obj['metadata']['name']}"
            if obj["metadata"]["namespace"] not in names:
                skipped.append(f"{where} (not in a tenant namespace)")
            elif not is_function_name(obj["metadata"]["name"]):
                skipped.append(f"{where} (a name the platform never gives)")
            elif obj["metadata"].get("deletionTimestamp"):
                skipped.append(f"{where} (being deleted)")
            else:
                resources[kind].append(_kept(obj, kind))
    secrets = []
    for namespace in sorted(names):
        for obj in core.list_namespaced_secret(namespace, label_selector=SECRET_SELECTOR).items:
            secret = (obj.metadata.labels or {}).get(SECRET_LABEL, "")
            if not is_function_name(secret) or obj.metadata.name != secret_object_name(secret):
                skipped.append(f"Secret {namespace}/{obj.metadata.name} (not named for the secret it holds)")
                continue
            secrets.append({"namespace": namespace, "name": obj.metadata.name, "type": obj.type or "Opaque",
                            "labels": _plain(obj.metadata.labels), "annotations": _plain(obj.metadata.annotations),
                            "data": dict(obj.data or {})})  # fmt: skip
    write_json(folder / "namespaces.json", {"namespaces": sorted(namespaces, key=lambda n: n["name"])})
    write_json(folder / "resources.json", resources)
    write_json(folder / "secrets.json", {"secrets": secrets})
    counts = {"namespaces": len(namespaces), "secrets": len(secrets)}
    counts.update({kind: len(objs) for kind, objs in resources.items()})
    return counts, skipped


def _strings(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BackupError(f"{what}: not a map of strings")
    return dict(value)


def checked(folder: Path) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """The three files' objects, every name checked, every object reduced to what is restored."""
    from sless_core.errors import ValidationError
    from sless_core.naming import secret_object_name, validate_name, validate_namespace

    def check(fn: Any, value: Any, what: str) -> str:
        try:
            return str(fn(value))
        except ValidationError as exc:
            raise BackupError(f"{what} {value!r}: {exc}") from None

    saved_ns = read_json(folder / "namespaces.json", "the tenant namespaces")
    saved_res = read_json(folder / "resources.json", "the custom resources")
    saved_sec = read_json(folder / "secrets.json", "the tenants' Secrets")
    if not (isinstance(saved_ns, dict) and isinstance(saved_ns.get("namespaces"), list)
            and isinstance(saved_res, dict) and isinstance(saved_sec, dict)
            and isinstance(saved_sec.get("secrets"), list)):  # fmt: skip
        raise BackupError(f"{folder}: the saved objects are not lists")
    namespaces = []
    for ns in saved_ns["namespaces"]:
        if not isinstance(ns, dict):
            raise BackupError("a saved namespace is not an object")
        namespaces.append({"name": check(validate_namespace, ns.get("name"), "namespace"),
                           "labels": _strings(ns.get("labels"), f"namespace {ns.get('name')} labels"),
                           "annotations": _strings(ns.get("annotations"), f"namespace {ns.get('name')} annotations")})
    names = {ns["name"] for ns in namespaces}
    unknown = sorted(set(saved_res) - set(KINDS))
    if unknown:
        raise BackupError(f"the custom resources hold kinds this version does not restore: {', '.join(unknown)}")
    resources: dict[str, list[dict[str, Any]]] = {}
    for kind in KINDS:
        resources[kind] = []
        for obj in saved_res.get(kind) or []:
            meta = obj.get("metadata") if isinstance(obj, dict) else None
            if not isinstance(meta, dict) or obj.get("kind") != kind or obj.get("apiVersion") != API_VERSION:
                raise BackupError(f"a saved {kind} is not a {API_VERSION} {kind}")
            namespace = check(validate_namespace, meta.get("namespace"), f"{kind}'s namespace")
            name = check(validate_name, meta.get("name"), f"{kind} name")
            if namespace not in names:
                raise BackupError(f"{kind} {namespace}/{name}: its namespace is not in the backup")
            if not isinstance(obj.get("spec"), dict) or not isinstance(obj.get("status") or {}, dict):
                raise BackupError(f"{kind} {namespace}/{name}: spec or status is not an object")
            owners = []
            for ref in meta.get("ownerReferences") or []:
                if not isinstance(ref, dict) or ref.get("kind") != "Function":
                    raise BackupError(f"{kind} {namespace}/{name}: an owner that is not a Function")
                owners.append({**ref, "name": check(validate_name, ref.get("name"), "owner Function")})
            resources[kind].append({"apiVersion": API_VERSION, "kind": kind, "metadata": {
                "name": name, "namespace": namespace, "labels": _strings(meta.get("labels"), f"{kind} {name} labels"),
                "annotations": _strings(meta.get("annotations"), f"{kind} {name} annotations")},
                "owners": owners, "spec": obj["spec"], "status": obj.get("status") or {}})  # fmt: skip
    secrets = []
    for obj in saved_sec["secrets"]:
        if not isinstance(obj, dict):
            raise BackupError("a saved Secret is not an object")
        namespace = check(validate_namespace, obj.get("namespace"), "Secret's namespace")
        labels = _strings(obj.get("labels"), f"Secret {obj.get('name')} labels")
        secret = check(validate_name, labels.get(SECRET_LABEL), "secret name")
        if obj.get("name") != secret_object_name(secret) or namespace not in names:
            raise BackupError(f"Secret {namespace}/{obj.get('name')!r}: not the platform's Secret of a saved tenant")
        data = _strings(obj.get("data"), f"Secret {namespace}/{obj['name']} data")
        try:
            for value in data.values():
                base64.b64decode(value, validate=True)
        except binascii.Error:
            raise BackupError(f"Secret {namespace}/{obj['name']}: data not base64") from None
        secrets.append({"namespace": namespace, "name": obj["name"], "type": str(obj.get("type") or "Opaque"),
                        "labels": labels, "annotations": _strings(obj.get("annotations"), "Secret annotations"),
                        "data": data})  # fmt: skip
    return namespaces, resources, secrets


def _restore_namespace(core: Any, ns: dict[str, Any]) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        there = core.read_namespace(ns["name"])
    except ApiException as exc:
        if exc.status != 404:
            raise
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": ns["name"], "labels": ns["labels"], "annotations": ns["annotations"]}})  # fmt: skip
        return True
    if there.metadata.deletion_timestamp:
        raise BackupError(f"namespace {ns['name']} is being deleted: wait until it is gone, then restore again")
    labels, notes = dict(there.metadata.labels or {}), dict(there.metadata.annotations or {})
    if all(labels.get(k) == v for k, v in ns["labels"].items()) and all(
            notes.get(k) == v for k, v in ns["annotations"].items()):  # fmt: skip
        return False
    core.patch_namespace(ns["name"], {"metadata": {"labels": ns["labels"], "annotations": ns["annotations"]}})
    return True


def _restore_secret(core: Any, obj: dict[str, Any]) -> bool:
    from kubernetes.client.exceptions import ApiException

    body = {"apiVersion": "v1", "kind": "Secret", "type": obj["type"], "data": obj["data"], "metadata": {
        "name": obj["name"], "namespace": obj["namespace"], "labels": obj["labels"],
        "annotations": obj["annotations"]}}  # fmt: skip
    try:
        there = core.read_namespaced_secret(obj["name"], obj["namespace"])
    except ApiException as exc:
        if exc.status != 404:
            raise
        core.create_namespaced_secret(obj["namespace"], body)
        return True
    if (dict(there.data or {}), dict(there.metadata.labels or {}), dict(there.metadata.annotations or {})) == (
            obj["data"], obj["labels"], obj["annotations"]):  # fmt: skip
        return False
    body["metadata"]["resourceVersion"] = there.metadata.resource_version
    core.replace_namespaced_secret(obj["name"], obj["namespace"], body)
    return True


def _restore_resource(custom: Any, obj: dict[str, Any], uids: dict[tuple[str, str], str]) -> tuple[bool, str]:
    """Create or update OBJ, then write its status; (changed, uid)."""
    from kubernetes.client.exceptions import ApiException

    meta, plural = obj["metadata"], KINDS[obj["kind"]]
    namespace, name = meta["namespace"], meta["name"]
    owners = [{"apiVersion": API_VERSION, "kind": "Function", "name": ref["name"],
               "uid": uids[(namespace, ref["name"])],
               **{k: ref[k] for k in ("controller", "blockOwnerDeletion") if isinstance(ref.get(k), bool)}}
              for ref in obj["owners"] if (namespace, ref["name"]) in uids]  # fmt: skip
    body: dict[str, Any] = {"apiVersion": API_VERSION, "kind": obj["kind"], "metadata": dict(meta), "spec": obj["spec"]}
    if owners:
        body["metadata"]["ownerReferences"] = owners
    try:
        there = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
    except ApiException as exc:
        if exc.status != 404:
            raise
        there = None
    changed = False
    if there is None:
        there = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
        changed = True
    else:
        if there["metadata"].get("deletionTimestamp"):
            raise BackupError(f"{obj['kind']} {namespace}/{name} is being deleted: restore again once it is gone")
        there_meta = there["metadata"]
        same = (there.get("spec") == obj["spec"] and (there_meta.get("labels") or {}) == meta["labels"]
                and _annotations(there_meta) == meta["annotations"]
                and [(r.get("name"), r.get("uid")) for r in there_meta.get("ownerReferences") or []
                     if r.get("kind") == "Function"] == [(r["name"], r["uid"]) for r in owners])  # fmt: skip
        if not same:
            body["metadata"]["resourceVersion"] = there_meta["resourceVersion"]
            body["metadata"]["annotations"] = {**{k: v for k, v in (there_meta.get("annotations") or {}).items()
                                                  if k not in _annotations(there_meta)}, **meta["annotations"]}
            body["metadata"]["finalizers"] = there_meta.get("finalizers") or []
            there = custom.replace_namespaced_custom_object(GROUP, VERSION, namespace, plural, name, body)
            changed = True
    if {k: v for k, v in (there.get("status") or {}).items() if k != "kopf"} != obj["status"]:
        custom.replace_namespaced_custom_object_status(GROUP, VERSION, namespace, plural, name,
                                                       {**there, "status": obj["status"]})  # fmt: skip
        changed = True
    return changed, str(there["metadata"]["uid"])


def restore(api: Any, namespaces: list[dict[str, Any]], resources: dict[str, list[dict[str, Any]]],
            secrets: list[dict[str, Any]]) -> dict[str, int]:
    from kubernetes import client

    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    written = {"namespaces": sum(_restore_namespace(core, ns) for ns in namespaces)}
    written["secrets"] = sum(_restore_secret(core, obj) for obj in secrets)
    uids: dict[tuple[str, str], str] = {}
    for kind in KINDS:  # Functions first: the others' owner references need their uids
        written[kind] = 0
        for obj in resources[kind]:
            changed, uid = _restore_resource(custom, obj, uids)
            written[kind] += changed
            if kind == "Function":
                uids[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = uid
    return written


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "mode": {"type": "str", "choices": ["save", "restore"], "required": True},
            "path": {"type": "path", "required": True},
            "kubeconfig": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    folder = Path(p["path"])
    try:
        if p["mode"] == "save":
            if module.check_mode:
                module.exit_json(changed=True, counts={}, written={}, skipped=[])
            counts, skipped = save(api_client(p["kubeconfig"]), folder)
            module.exit_json(changed=True, counts=counts, written={}, skipped=skipped)
        namespaces, resources, secrets = checked(folder)
        counts = {"namespaces": len(namespaces), "secrets": len(secrets)}
        counts.update({kind: len(objs) for kind, objs in resources.items()})
        if module.check_mode:
            module.exit_json(changed=True, counts=counts, written={}, skipped=[])
        written = restore(api_client(p["kubeconfig"]), namespaces, resources, secrets)
        module.exit_json(changed=any(written.values()), counts=counts, written=written, skipped=[])
    except BackupError as exc:
        module.fail_json(msg=f"sless backup, Kubernetes: {exc}")
    except Exception as exc:  # the client's ApiException: its reason and body (never a Secret's data: not echoed)
        reason = getattr(exc, "reason", None) or str(exc)
        module.fail_json(msg=f"sless backup, Kubernetes: {type(exc).__name__}: {str(reason)[:1500]}")


if __name__ == "__main__":
    main()
