"""Custom resources <-> the API's records: the manifests the API writes and how it reads them back.

Pure functions, no client: objects are decoded and encoded by ``sless_core.crcodec``, the codec
the operator and the event dispatcher share, so the API shows a spec exactly as the operator builds
it. An object that codec refuses (made or edited with kubectl, breaking a rule the CRD schema cannot
state) is not shown as if it were valid: a read of it answers 409 with the reason, a list leaves it
out (logged), and it can still be deleted.

Status freshness: the operator writes ``status.observedGeneration`` (the spec generation its
status describes), ``status.codeHash`` (the code of the last successful build) and ``status.runId``
(the run a job's phase describes). When the spec has moved on, a stale phase is not shown as
current: new code the operator has not seen yet reads as Building, and a bumped job as Pending, so
a client waiting for Ready/Succeeded never accepts the previous version's result. Once the operator
has seen the new generation its phase is shown as is (a failed build of new code is Failed, while
``status.codeHash`` still names the older code that keeps serving).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from sless_api.domain.errors import Conflict
from sless_api.domain.records import FunctionRecord, JobRecord, TriggerRecord
from sless_api.domain.versions import Version, function_config
from sless_core import contract, crd
from sless_core.crcodec import (
    FUNCTION_USER_FIELDS,
    FunctionCode,
    FunctionResource,
    InvalidResource,
    JobResource,
    Meta,
    TriggerResource,
    function_spec_to_cr,
    job_spec_to_cr,
    key_of,
    manifest,
    trigger_spec_to_cr,
)
from sless_core.models import FunctionSpec, JobPhase, JobSpec, Phase, TriggerSpec

log = logging.getLogger("sless.kube.resources")
WAITING_FOR_CODE = "waiting for code: upload a zip"
WAITING_FOR_OPERATOR = "build queued: waiting for the operator"
NEW_CODE = "new code uploaded: waiting for its build"
RECORDED = contract.RECORDED_MESSAGE
Decoded = TypeVar("Decoded")


def decoded(decode: Callable[[Any], Decoded], obj: dict[str, Any], what: str) -> Decoded:
    """OBJ decoded by the codec; one it refuses is a 409 naming the object and the reason."""
    try:
        return decode(obj)
    except InvalidResource as exc:
        key = key_of(obj)
        shown = repr(key[1]) if key else "(unnamed)"
        raise Conflict(f"{what} {shown} is invalid as stored in the cluster: {exc.message}; correct it with "
                       "kubectl or delete it", field=exc.field or "") from exc  # fmt: skip


def valid(decode: Callable[[Any], Decoded], objects: Iterable[dict[str, Any]], what: str) -> list[Decoded]:
    """The objects the codec accepts; the others are logged and left out (a list shows only valid ones)."""
    found = []
    for obj in objects:
        try:
            found.append(decode(obj))
        except InvalidResource as exc:
            log.warning("%s %s left out: invalid as stored: %s", what, key_of(obj), exc.message)
    return found


def labels(function: str | None = None) -> dict[str, str]:
    out = {crd.LABEL_MANAGED: crd.MANAGED_BY}
    if function:
        out[crd.LABEL_FUNCTION] = function
    return out


def owner_reference(function_obj: dict[str, Any]) -> dict[str, Any]:
    """A (non-controller) owner reference to a Function: the garbage collector removes the child with it."""
    meta = decoded(Meta.from_cr, function_obj, "function")
    return {"apiVersion": crd.API_VERSION, "kind": "Function", "name": meta.name, "uid": meta.uid}


def with_traceparent(obj: dict[str, Any], traceparent: str) -> dict[str, Any]:
    """OBJ (a manifest, an object read back, or a merge patch) carrying TRACEPARENT, the context of the request
    that changes it, as its ``sless.dev/traceparent`` annotation, for the operator to continue; OBJ as it was
    without one (tracing off)."""
    if traceparent:
        meta = obj.setdefault("metadata", {})
        meta["annotations"] = {**(meta.get("annotations") or {}), crd.ANNOTATION_TRACEPARENT: traceparent}
    return obj


# functions

def function_manifest(namespace: str, spec: FunctionSpec) -> dict[str, Any]:
    return manifest("Function", namespace, spec.name, function_spec_to_cr(spec), labels())


def function_cr_spec(spec: FunctionSpec, cr_spec: dict[str, Any]) -> dict[str, Any]:
    """The CR spec with SPEC's fields; the rest (code, replicas, secrets version) as stored in CR_SPEC."""
    kept = {k: v for k, v in cr_spec.items() if k not in FUNCTION_USER_FIELDS}
    return function_spec_to_cr(spec) | kept


def function_resource(obj: dict[str, Any]) -> FunctionResource:
    return decoded(FunctionResource.from_cr, obj, "function")


def function_resources(objects: Iterable[dict[str, Any]]) -> list[FunctionResource]:
    return valid(FunctionResource.from_cr, objects, "function")


def function_record(obj: dict[str, Any]) -> FunctionRecord:
    return function_record_of(function_resource(obj))


def function_records(objects: Iterable[dict[str, Any]]) -> list[FunctionRecord]:
    return [function_record_of(fn) for fn in function_resources(objects)]


def function_record_of(fn: FunctionResource) -> FunctionRecord:
    status, code_hash = fn.status, fn.code.code_hash or None
    phase: str | None = status.phase
    message = status.message
    observed = status.observed_generation
    stale = observed is not None and observed < fn.meta.generation
    if phase is not None and stale and code_hash and status.code_hash != code_hash:
        phase, message = Phase.BUILDING, NEW_CODE
    if phase is None:  # the operator has not reported yet: code waits for its build, as on sless up
        phase = Phase.BUILDING if code_hash else Phase.PENDING
        message = message or (WAITING_FOR_OPERATOR if code_hash else WAITING_FOR_CODE)
    return FunctionRecord(namespace=fn.meta.namespace, spec=fn.spec, phase=str(phase), message=message,
                          code_hash=code_hash, image=status.image or None, created_at=fn.meta.created_at or 0.0,
                          last_built_at=status.last_built_at)  # fmt: skip


# triggers

def trigger_manifest(namespace: str, spec: TriggerSpec, function_obj: dict[str, Any] | None) -> dict[str, Any]:
    owners = [owner_reference(function_obj)] if function_obj is not None else None
    return manifest("Trigger", namespace, spec.name, trigger_spec_to_cr(spec), labels(spec.function), owners)


def trigger_record_of(trigger: TriggerResource) -> TriggerRecord:
    return TriggerRecord(namespace=trigger.meta.namespace, spec=trigger.spec, created_at=trigger.meta.created_at or 0.0,
                         last_fired_at=trigger.status.last_fired_at, message=trigger.status.message)  # fmt: skip


def trigger_record(obj: dict[str, Any]) -> TriggerRecord:
    return trigger_record_of(decoded(TriggerResource.from_cr, obj, "trigger"))


def trigger_records(objects: Iterable[dict[str, Any]]) -> list[TriggerRecord]:
    return [trigger_record_of(t) for t in valid(TriggerResource.from_cr, objects, "trigger")]


# jobs

def job_manifest(namespace: str, spec: JobSpec, function_obj: dict[str, Any] | None) -> dict[str, Any]:
    owners = [owner_reference(function_obj)] if function_obj is not None else None
    return manifest("FunctionJob", namespace, spec.name, job_spec_to_cr(spec), labels(spec.function), owners)


def job_record_of(job: JobResource) -> JobRecord:
    run_id, status = job.spec.run_id, job.status
    current = status.run_id is None or status.run_id == run_id
    phase: str | None = status.phase if current else None
    if phase is None:
        phase = JobPhase.RECORDED if run_id == 0 else JobPhase.PENDING
        message = RECORDED if run_id == 0 else ""
        started = completed = None
    else:
        message, started, completed = status.message, status.started_at, status.completed_at
    return JobRecord(namespace=job.meta.namespace, spec=job.spec, phase=str(phase), message=message,
                     started_at=started, completed_at=completed, created_at=job.meta.created_at or 0.0)


def job_record(obj: dict[str, Any]) -> JobRecord:
    return job_record_of(decoded(JobResource.from_cr, obj, "job"))


def job_records(objects: Iterable[dict[str, Any]]) -> list[JobRecord]:
    return [job_record_of(j) for j in valid(JobResource.from_cr, objects, "job")]


# versions

CODE_FIELDS = ("codeKey", "codeSha256", "contextKey", "contextSha256", "depsHash")


def function_versions(obj: dict[str, Any]) -> list[Version]:
    """``status.versions`` (the operator records each deploy that became Ready), oldest first."""
    return [Version(v.version, v.code_hash, function_config(v.spec), v.deployed_at or 0.0, _code_fields(v.code))
            for v in function_resource(obj).status.versions]


def _code_fields(code: FunctionCode) -> dict[str, str]:
    return {key: getattr(code, FunctionCode.CR_KEYS[key]) for key in CODE_FIELDS}


def rollback_spec(obj: dict[str, Any], target: Version) -> dict[str, Any]:
    """The Function's spec with TARGET's configuration and code (replicas and the like kept)."""
    fn = function_resource(obj)
    spec = function_cr_spec(FunctionSpec.from_dict({**target.config, "name": fn.meta.name}), fn.spec_to_cr())
    spec.update({"codeHash": target.code_hash, **{k: target.extra.get(k, "") for k in CODE_FIELDS}})
    return spec
