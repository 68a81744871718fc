"""The Kubernetes backend: the Platform interface over Function, Trigger and FunctionJob custom resources.

The API writes desired state (the CRs' ``spec``) and reads what the operator reports (``status``);
it never writes status and never imports the operator. Code goes to object storage and reaches the
operator as ``spec.codeHash`` + ``spec.contextKey``. Functions live in the tenant namespace itself
(``sless-<hash>``), which the API creates with the tenant label and its own RoleBinding there
(``kube.access``: the API's Secret and pod-log rights exist in tenant namespaces only).

Writes that depend on what was read (update, upload, trigger patch, job re-run) carry the object's
resourceVersion, so a concurrent change makes the API server answer 409 and the write is retried
on fresh state instead of silently overwriting it.

The invoke proxy resolves routes from an in-memory table kept by watches (``kube.router``,
``kube.routes``, ``kube.watch``): no API server request per invocation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from sless_api import tracing
from sless_api.backends.kube import resources, runrecords
from sless_api.backends.kube.client import KubeClient, KubeConflict, KubeNotFound
from sless_api.backends.kube.code import CodeArchive
from sless_api.backends.kube.keda import KedaCheck
from sless_api.backends.kube.podlogs import read_call_logs
from sless_api.backends.kube.router import KubeRouter
from sless_api.backends.kube.routes import FUNCTIONS, TRIGGERS
from sless_api.backends.kube.secrets import kube_secret_store
from sless_api.backends.settings import KubeSettings, PlatformSettings
from sless_api.domain.contract import check_queue_free, check_rerun
from sless_api.domain.errors import Conflict, NotFound, Unavailable, Unsupported
from sless_api.domain.ports import Background, CallInvoker
from sless_api.domain.records import FunctionRecord, JobRecord, TriggerRecord
from sless_api.domain.routing import CallRef
from sless_api.domain.versions import Version, choose
from sless_api.stores.code import CodeStore
from sless_api.stores.invocations import InvocationLog
from sless_api.stores.secrets import SecretMeta, SecretValues
from sless_api.stores.secrets.usage import checked_version, current_version, refuse_dropping_keys, refuse_if_used
from sless_core import contract, crd
from sless_core.crcodec import TRAFFIC
from sless_core.models import FunctionSpec, JobSpec, Phase, TriggerSpec, TriggerType
from sless_core.traffic import TrafficSplit, check_versions

log = logging.getLogger("sless.kube")
JOBS = crd.JOB_PLURAL
KINDS = {FUNCTIONS: "function", TRIGGERS: "trigger", JOBS: "job"}
SECRETS_VERSION = crd.SECRETS_VERSION
WRITE_ATTEMPTS = 4
DELETE_WAIT_SEC = 10.0
NAMESPACE_LABELS = crd.tenant_namespace_labels()  # the same as the operator's


def _deleting(obj: dict[str, Any]) -> bool:
    meta = obj.get("metadata")
    return isinstance(meta, dict) and bool(meta.get("deletionTimestamp"))


class KubernetesPlatform:
    def __init__(self, config: PlatformSettings, store: CodeStore, invocations: InvocationLog | None,
                 settings: KubeSettings | None = None, kube: KubeClient | None = None) -> None:
        self.config = config
        self.invocations = invocations
        self.settings = settings or config.kube
        self.kube = kube or KubeClient(self.settings)
        self.archive = CodeArchive(store, self.settings, config.data_dir / "tmp")
        self.router = KubeRouter(self.kube, self.settings)
        self.secrets = kube_secret_store(config.secrets, config.data_dir, self.kube)
        self.keda = KedaCheck(self.kube)  # a function's ``scale`` needs KEDA in the cluster
        # jobs' runs and cron firings into the invocation log, from what the operator leaves in their status
        self.run_records = runrecords.RunRecorder(invocations) if invocations is not None else None
        self.run_watch = runrecords.watch(self.kube, self.run_records) if self.run_records is not None else None

    def background_services(self, invoker: CallInvoker) -> list[Background]:
        """None in the API: CronJobs fire cron triggers, ``sless-events`` (a process of its own) event ones."""
        return []

    # lifecycle
    async def start(self) -> None:
        self.router.start()
        if self.run_records is not None:
            self.run_records.start()
        if self.run_watch is not None:
            self.run_watch.start()

    async def close(self) -> None:
        if self.run_watch is not None:
            await asyncio.to_thread(self.run_watch.stop)
        if self.run_records is not None:
            await asyncio.to_thread(self.run_records.stop)
        await self.router.close()
        self.secrets.close()
        self.kube.close()

    # custom object plumbing
    def _what(self, plural: str, name: str) -> str:
        return f"{KINDS[plural]} {name!r}"

    async def _get(self, plural: str, namespace: str, name: str) -> dict[str, Any]:
        """The object; one being deleted (its finalizer still running) is already gone for the API's callers,
        as after a DELETE on the standalone backend."""
        what = self._what(plural, name)
        obj: dict[str, Any] = await self.kube.call(
            what, self.kube.custom.get_namespaced_custom_object, crd.GROUP, crd.VERSION, namespace, plural, name)
        if _deleting(obj):
            raise NotFound(f"{what} not found")
        return obj

    async def _list(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        result = await self.kube.call(f"{plural} of {namespace}", self.kube.custom.list_namespaced_custom_object,
                                      crd.GROUP, crd.VERSION, namespace, plural)
        items = [i for i in result.get("items") or [] if isinstance(i, dict) and not _deleting(i)]
        return sorted(items, key=lambda i: str(i.get("metadata", {}).get("name", "")))

    async def _create(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create BODY; a missing tenant namespace is created first (as the standalone backend does)."""
        name = body["metadata"]["name"]
        for attempt in range(2):
            try:
                obj: dict[str, Any] = await self.kube.call(
                    self._what(plural, name), self.kube.custom.create_namespaced_custom_object,
                    crd.GROUP, crd.VERSION, namespace, plural, body)
                return obj
            except KubeNotFound as exc:
                if exc.kind != "namespaces" or attempt:
                    raise Unavailable(f"the {plural}.{crd.GROUP} resource is not installed in this cluster "
                                      "(apply the chart's CRDs)") from exc
                await self.ensure_namespace(namespace)
        raise AssertionError("unreachable")

    async def _replace(self, plural: str, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT OBJ back; it carries the resourceVersion it was read at, so a lost race is a 409."""
        name = obj["metadata"]["name"]
        new: dict[str, Any] = await self.kube.call(
            self._what(plural, name), self.kube.custom.replace_namespaced_custom_object,
            crd.GROUP, crd.VERSION, namespace, plural, name, obj)
        return new

    async def _patch(self, plural: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        obj: dict[str, Any] = await self.kube.call(
            self._what(plural, name), self.kube.custom.patch_namespaced_custom_object,
            crd.GROUP, crd.VERSION, namespace, plural, name, patch)
        return obj

    async def _delete(self, plural: str, namespace: str, name: str) -> None:
        await self.kube.call(self._what(plural, name), self.kube.custom.delete_namespaced_custom_object,
                             crd.GROUP, crd.VERSION, namespace, plural, name, propagation_policy="Background")

    async def _wait_gone(self, plural: str, namespace: str, name: str) -> None:
        """Wait (at most DELETE_WAIT_SEC) until the operator's finalizer has let the object go, so the name
        can be used again as soon as DELETE has answered; the object is hidden from reads meanwhile anyway."""
        what = self._what(plural, name)
        deadline = time.monotonic() + DELETE_WAIT_SEC
        while time.monotonic() < deadline:
            try:
                await self.kube.call(what, self.kube.custom.get_namespaced_custom_object,
                                     crd.GROUP, crd.VERSION, namespace, plural, name)
            except NotFound:
                return
            await asyncio.sleep(0.1)

    async def _name_taken(self, plural: str, namespace: str, name: str, exc: Exception) -> Conflict:
        """The 409 of a create whose name is taken: by a live object (shown as ``existing``), or by one
        still being deleted."""
        try:
            obj = await self._get(plural, namespace, name)
        except NotFound:
            return Conflict(f"{self._what(plural, name)} is still being deleted; try again in a moment")
        record: FunctionRecord | TriggerRecord | JobRecord
        if plural == FUNCTIONS:
            record = resources.function_record(obj)
        elif plural == TRIGGERS:
            record = resources.trigger_record(obj)
        else:
            record = resources.job_record(obj)
        return Conflict(f"{self._what(plural, name)} already exists", existing=record.to_api())

    # namespaces
    async def ensure_namespace(self, namespace: str) -> bool:
        self.router.add_namespace(namespace)
        body = k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace, labels=dict(NAMESPACE_LABELS)))
        what = f"namespace {namespace!r}"
        try:
            await self.kube.call(what, self.kube.core.create_namespace, body)
            await asyncio.to_thread(self.kube.access.grant, namespace)
            return True
        except KubeConflict:
            pass
        current = await self.kube.call(what, self.kube.core.read_namespace, namespace)
        if current.metadata.deletion_timestamp is not None:
            raise Unavailable(f"namespace {namespace} is being deleted; try again when it is gone")
        have = current.metadata.labels or {}
        mark = crd.tenant_mark()
        if any(have.get(k) != v for k, v in mark.items()):
            patch = {"metadata": {"labels": mark}}
            await self.kube.call(what, self.kube.core.patch_namespace, namespace, patch)
        await asyncio.to_thread(self.kube.access.grant, namespace)
        return False

    # functions
    async def list_functions(self, namespace: str) -> list[FunctionRecord]:
        return resources.function_records(await self._list(FUNCTIONS, namespace))

    async def get_function(self, namespace: str, name: str) -> FunctionRecord:
        return resources.function_record(await self._get(FUNCTIONS, namespace, name))

    async def create_function(self, namespace: str, spec: FunctionSpec) -> FunctionRecord:
        if spec.scale is not None:
            await self.keda.require()
        manifest = resources.with_traceparent(resources.function_manifest(namespace, spec),
                                              tracing.current_traceparent())
        version = await checked_version(self.secrets, namespace, spec.secrets)
        if version:
            manifest["spec"][SECRETS_VERSION] = version
        try:
            obj = await self._create(FUNCTIONS, namespace, manifest)
        except KubeConflict as exc:
            raise await self._name_taken(FUNCTIONS, namespace, spec.name, exc) from exc
        return resources.function_record(obj)

    async def update_function(self, namespace: str, name: str, patch: dict[str, Any]) -> FunctionRecord:
        for attempt in range(WRITE_ATTEMPTS):
            obj = await self._get(FUNCTIONS, namespace, name)
            old = resources.function_record(obj)
            new_spec = old.spec.updated(patch, self.config.max_timeout_sec)
            if new_spec.scale is not None and new_spec.scale != old.spec.scale:
                await self.keda.require()  # a scale set before KEDA went away does not block other changes
            cr_spec = resources.function_cr_spec(new_spec, obj.get("spec") or {})
            cr_spec.pop(SECRETS_VERSION, None)
            cr_spec.pop(TRAFFIC, None)  # a deploy drops the traffic split
            version = await checked_version(self.secrets, namespace, new_spec.secrets)
            if version:
                cr_spec[SECRETS_VERSION] = version
            if old.code_hash and contract.spec_change_rebuilds(old.spec, new_spec):
                stored = await asyncio.to_thread(self.archive.rebuild_context, namespace, new_spec, old.code_hash)
                cr_spec.update(stored.cr_fields())
            obj["spec"] = cr_spec
            resources.with_traceparent(obj, tracing.current_traceparent())
            try:
                return resources.function_record(await self._replace(FUNCTIONS, namespace, obj))
            except KubeConflict:
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    async def delete_function(self, namespace: str, name: str) -> None:
        await self._get(FUNCTIONS, namespace, name)
        await self._delete(FUNCTIONS, namespace, name)
        # Triggers and jobs the API created carry an owner reference (the garbage collector removes
        # them); ones made with kubectl may not, so remove every one that names this function.
        for plural in (TRIGGERS, JOBS):
            for obj in await self._list(plural, namespace):
                if (obj.get("spec") or {}).get("function") == name:
                    with contextlib.suppress(NotFound):
                        await self._delete(plural, namespace, obj["metadata"]["name"])
        try:
            await asyncio.to_thread(self.archive.delete, namespace, name)
        except Exception:
            log.warning("the stored code of %s/%s could not be deleted", namespace, name, exc_info=True)
        await self._wait_gone(FUNCTIONS, namespace, name)

    async def upload_code(self, namespace: str, name: str, zip_path: Path, code_hash: str) -> FunctionRecord:
        for attempt in range(WRITE_ATTEMPTS):
            obj = await self._get(FUNCTIONS, namespace, name)
            current = resources.function_record(obj)
            if not contract.upload_builds(current.code_hash, current.phase, code_hash):
                current.message = contract.identical_upload_message(current.message)
                return current
            stored = await asyncio.to_thread(self.archive.store_upload, namespace, current.spec, zip_path, code_hash)
            patch = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                     "spec": {"codeHash": code_hash, **stored.cr_fields(), TRAFFIC: None}}  # drops the split
            resources.with_traceparent(patch, tracing.current_traceparent())
            try:
                updated = await self._patch(FUNCTIONS, namespace, name, patch)
            except (KubeConflict, NotFound):
                await asyncio.to_thread(self.archive.discard, stored.keys)
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
                continue  # changed (or deleted) meanwhile: read again
            await asyncio.to_thread(self.archive.prune, namespace, name)
            return resources.function_record(updated)
        raise AssertionError("unreachable")

    async def list_versions(self, namespace: str, name: str) -> list[Version]:
        return resources.function_versions(await self._get(FUNCTIONS, namespace, name))

    async def rollback(self, namespace: str, name: str, version: int | None) -> FunctionRecord:
        """Write an earlier version's configuration and code back into the spec; the operator deploys it
        (a rollout, or a build only when its dependency image is gone) and records it as a new version."""
        for attempt in range(WRITE_ATTEMPTS):
            obj = await self._get(FUNCTIONS, namespace, name)
            target = choose(resources.function_versions(obj), version, name)
            # A secret or key the version read may have been deleted since (nothing used it then): 400, as for an
            # update; else the version of the secrets it reads now, so a later change of them rolls its pods.
            refs = FunctionSpec.from_dict({**target.config, "name": name}).secrets
            secrets_version = await checked_version(self.secrets, namespace, refs)
            keys = [target.extra.get(k, "") for k in ("codeKey", "contextKey")]
            await asyncio.to_thread(self.archive.require, [k for k in keys if k], target.version, name)
            obj["spec"] = resources.rollback_spec(obj, target)
            obj["spec"].pop(TRAFFIC, None)  # a deploy drops the traffic split
            obj["spec"].pop(SECRETS_VERSION, None)
            if secrets_version:
                obj["spec"][SECRETS_VERSION] = secrets_version
            resources.with_traceparent(obj, tracing.current_traceparent())
            try:
                record = resources.function_record(await self._replace(FUNCTIONS, namespace, obj))
            except KubeConflict:
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
                continue
            record.message = f"rolling back to version {target.version}"
            return record
        raise AssertionError("unreachable")

    async def get_traffic(self, namespace: str, name: str) -> TrafficSplit | None:
        return resources.function_resource(await self._get(FUNCTIONS, namespace, name)).traffic

    async def set_traffic(self, namespace: str, name: str, split: TrafficSplit) -> TrafficSplit:
        """Write ``spec.traffic``: the operator runs the other version beside the current one, the router shares
        calls once its Service has ready endpoints' worth of pods (see ``kube.routes``)."""
        for attempt in range(WRITE_ATTEMPTS):
            obj = await self._get(FUNCTIONS, namespace, name)
            fn = resources.function_resource(obj)
            check_versions(split, [v.version for v in fn.status.versions], name)
            record = resources.function_record_of(fn)
            if record.phase != Phase.READY:
                raise Conflict(f"function {name!r} is {record.phase}: a split can be set while it is Ready")
            patch = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                     "spec": {TRAFFIC: split.to_list()}}
            try:
                await self._patch(FUNCTIONS, namespace, name, patch)
            except KubeConflict:
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
                continue
            return split
        raise AssertionError("unreachable")

    async def clear_traffic(self, namespace: str, name: str) -> bool:
        fn = resources.function_resource(await self._get(FUNCTIONS, namespace, name))
        if fn.traffic is None:
            return False
        await self._patch(FUNCTIONS, namespace, name, {"spec": {TRAFFIC: None}})
        return True

    async def get_source(self, namespace: str, name: str) -> list[dict[str, Any]]:
        record = await self.get_function(namespace, name)
        if not record.code_hash:
            return []
        return await asyncio.to_thread(self.archive.source, namespace, name, record.code_hash)

    # triggers
    async def list_triggers(self, namespace: str) -> list[TriggerRecord]:
        return resources.trigger_records(await self._list(TRIGGERS, namespace))

    async def get_trigger(self, namespace: str, name: str) -> TriggerRecord:
        return resources.trigger_record(await self._get(TRIGGERS, namespace, name))

    async def _check_trigger(self, namespace: str, spec: TriggerSpec) -> None:
        if spec.type != TriggerType.EVENT:
            return
        if not self.config.rabbitmq_url:
            raise Unsupported("event triggers need RabbitMQ: set SLESS_RABBITMQ_URL (not configured in this "
                              "installation)")
        check_queue_free(spec, await self.list_triggers(namespace))

    async def create_trigger(self, namespace: str, spec: TriggerSpec) -> TriggerRecord:
        await self._check_trigger(namespace, spec)
        function = await self._get(FUNCTIONS, namespace, spec.function)
        try:
            obj = await self._create(TRIGGERS, namespace, resources.trigger_manifest(namespace, spec, function))
        except KubeConflict as exc:
            raise await self._name_taken(TRIGGERS, namespace, spec.name, exc) from exc
        return resources.trigger_record(obj)

    async def patch_trigger(self, namespace: str, name: str, patch: dict[str, Any]) -> TriggerRecord:
        for attempt in range(WRITE_ATTEMPTS):
            obj = await self._get(TRIGGERS, namespace, name)
            spec = resources.trigger_record(obj).spec.patched(patch)
            await self._check_trigger(namespace, spec)
            fresh = resources.trigger_manifest(namespace, spec, await self._get(FUNCTIONS, namespace, spec.function))
            meta = obj["metadata"]
            meta.setdefault("labels", {}).update(fresh["metadata"]["labels"])
            others = [r for r in meta.get("ownerReferences") or [] if r.get("kind") != "Function"]
            meta["ownerReferences"] = others + fresh["metadata"]["ownerReferences"]
            obj["spec"] = fresh["spec"]
            try:
                return resources.trigger_record(await self._replace(TRIGGERS, namespace, obj))
            except KubeConflict:
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    async def delete_trigger(self, namespace: str, name: str) -> None:
        await self._get(TRIGGERS, namespace, name)
        await self._delete(TRIGGERS, namespace, name)
        await self._wait_gone(TRIGGERS, namespace, name)

    # jobs
    async def create_job(self, namespace: str, spec: JobSpec) -> JobRecord:
        function = await self._get(FUNCTIONS, namespace, spec.function)
        try:
            manifest = resources.with_traceparent(resources.job_manifest(namespace, spec, function),
                                                  tracing.current_traceparent())
            obj = await self._create(JOBS, namespace, manifest)
        except KubeConflict as exc:
            raise await self._name_taken(JOBS, namespace, spec.name, exc) from exc
        return resources.job_record(obj)

    async def list_jobs(self, namespace: str) -> list[JobRecord]:
        return resources.job_records(await self._list(JOBS, namespace))

    async def get_job(self, namespace: str, name: str) -> JobRecord:
        return resources.job_record(await self._get(JOBS, namespace, name))

    async def rerun_job(self, namespace: str, name: str, run_id: int) -> JobRecord:
        for attempt in range(WRITE_ATTEMPTS):
            obj = await self._get(JOBS, namespace, name)
            record = resources.job_record(obj)
            if check_rerun(record, run_id) is contract.Rerun.NOTHING:
                return record
            patch = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "spec": {"runId": run_id}}
            resources.with_traceparent(patch, tracing.current_traceparent())
            try:
                return resources.job_record(await self._patch(JOBS, namespace, name, patch))
            except KubeConflict:
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    async def delete_job(self, namespace: str, name: str) -> None:
        await self._get(JOBS, namespace, name)
        await self._delete(JOBS, namespace, name)
        await self._wait_gone(JOBS, namespace, name)

    # secrets
    async def list_secrets(self, namespace: str) -> list[SecretMeta]:
        return await asyncio.to_thread(self.secrets.list, namespace)

    async def get_secret(self, namespace: str, name: str) -> SecretMeta:
        return await asyncio.to_thread(self.secrets.get, namespace, name)

    async def create_secret(self, namespace: str, name: str, data: SecretValues) -> SecretMeta:
        await self.ensure_namespace(namespace)
        meta = await asyncio.to_thread(self.secrets.create, namespace, name, data)
        await self._secret_changed(namespace, name)
        return meta

    async def replace_secret(self, namespace: str, name: str, data: SecretValues) -> SecretMeta:
        refuse_dropping_keys(name, data, [r.spec for r in await self.list_functions(namespace)])
        meta = await asyncio.to_thread(self.secrets.replace, namespace, name, data)
        await self._secret_changed(namespace, name)
        return meta

    async def delete_secret(self, namespace: str, name: str) -> None:
        await asyncio.to_thread(self.secrets.get, namespace, name)
        refuse_if_used(name, [r.spec for r in await self.list_functions(namespace)])
        await asyncio.to_thread(self.secrets.delete, namespace, name)

    async def _secret_changed(self, namespace: str, name: str) -> None:
        """Functions using secret NAME get its new revision in ``spec.secretsVersion``: the operator puts it
        on their pod template, so their pods are replaced and read the new values."""
        for fn in resources.function_resources(await self._list(FUNCTIONS, namespace)):
            if not any(ref.name == name for ref in fn.spec.secrets):
                continue
            version = await current_version(self.secrets, namespace, fn.spec.secrets)
            if fn.secrets_version == version:
                continue
            log.info("%s/%s: secret %r changed: new secretsVersion", namespace, fn.spec.name, name)
            with contextlib.suppress(NotFound):
                await self._patch(FUNCTIONS, namespace, fn.spec.name, {"spec": {SECRETS_VERSION: version}})

    async def call_logs(self, namespace: str, name: str, call: CallRef) -> dict[str, Any]:
        """From the function's pods' logs, where the cluster lets the API read them (see podlogs.py)."""
        return await read_call_logs(self.kube, namespace, name, call)
