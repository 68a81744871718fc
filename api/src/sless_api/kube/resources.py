"""Custom resources <-> the API's records: the manifests the API writes and how it reads them back.

Pure functions, no client: the spec travels through ``sless_core.crd`` (the one mapping the
operator shares), and status is read defensively, because the operator may not have reported
yet and a person may have created the object with kubectl.

Status freshness: the operator writes ``status.observedGeneration`` (the spec generation its
status describes), ``status.codeHash`` (the code of the last successful build) and ``status.runId``
(the run a job's phase describes). When the spec has moved on, a stale phase is not shown as
current: new code the operator has not seen yet reads as Building, and a bumped job as Pending, so
a client waiting for Ready/Succeeded never accepts the previous version's result. Once the operator
has seen the new generation its phase is shown as is (a failed build of new code is Failed, while
``status.codeHash`` still names the older code that keeps serving).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sless_api.platform import FunctionRecord, JobRecord, TriggerRecord
from sless_api.versions import Version, function_config
from sless_core import contract, crd
from sless_core.models import DEFAULT_ENTRYPOINT, FunctionSpec, JobPhase, JobSpec, Phase, SecretRef, TriggerSpec

WAITING_FOR_CODE = "waiting for code: upload a zip"
WAITING_FOR_OPERATOR = "build queued: waiting for the operator"
NEW_CODE = "new code uploaded: waiting for its build"
RECORDED = contract.RECORDED_MESSAGE
_PHASES = {p.value for p in Phase}
_JOB_PHASES = {p.value for p in JobPhase}


def parse_time(value: object) -> float | None:
    """Seconds since the epoch of an RFC 3339 timestamp (``...Z``, fractions allowed); None if absent or bad."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _section(obj: dict[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _created(obj: dict[str, Any]) -> float:
    return parse_time(_meta(obj).get("creationTimestamp")) or 0.0


def labels(function: str | None = None) -> dict[str, str]:
    out = {crd.LABEL_MANAGED: crd.MANAGED_BY}
    if function:
        out[crd.LABEL_FUNCTION] = function
    return out


def owner_reference(function_obj: dict[str, Any]) -> dict[str, Any]:
    """A (non-controller) owner reference to a Function: the garbage collector removes the child with it."""
    meta = _meta(function_obj)
    return {"apiVersion": crd.API_VERSION, "kind": "Function", "name": meta["name"], "uid": meta["uid"]}


# functions

def function_manifest(namespace: str, spec: FunctionSpec) -> dict[str, Any]:
    return {
        "apiVersion": crd.API_VERSION,
        "kind": "Function",
        "metadata": {"name": spec.name, "namespace": namespace, "labels": labels()},
        "spec": crd.function_spec_to_cr(spec.to_dict()),
    }


def function_spec(name: str, cr_spec: dict[str, Any]) -> FunctionSpec:
    """The spec as stored; trusted (the CRD schema validated it), with defaults for omitted fields."""
    values = crd.function_spec_from_cr(name, cr_spec)
    runtime = str(values.get("runtime") or "")
    secrets = [SecretRef(str(s.get("name")), str(s.get("key")),
                         None if s.get("env") is None else str(s["env"]),
                         None if s.get("file") is None else str(s["file"]))
               for s in values.get("secrets") or [] if isinstance(s, dict)]
    return FunctionSpec(
        name=name,
        runtime=runtime,
        entrypoint=str(values.get("entrypoint") or DEFAULT_ENTRYPOINT.get(runtime, "handler.handle")),
        memory_mb=int(values.get("memory_mb", FunctionSpec.memory_mb)),
        timeout_sec=int(values.get("timeout_sec", FunctionSpec.timeout_sec)),
        env_vars={str(k): str(v) for k, v in sorted((values.get("env_vars") or {}).items())},
        secrets=secrets,
        max_concurrency=int(values.get("max_concurrency") or 0),
    )


def function_cr_spec(spec: FunctionSpec, cr_spec: dict[str, Any]) -> dict[str, Any]:
    """The CR spec for SPEC, keeping what the API does not model (code hash, context key, replicas)."""
    body = crd.function_spec_to_cr(spec.to_dict())
    for key, value in cr_spec.items():
        if key not in body:
            body[key] = value
    return body


def function_record(obj: dict[str, Any]) -> FunctionRecord:
    meta, cr_spec, status = _meta(obj), _section(obj, "spec"), _section(obj, "status")
    code_hash = cr_spec.get("codeHash") or None
    phase = status.get("phase") if status.get("phase") in _PHASES else None
    message = str(status.get("message") or "")
    observed, generation = status.get("observedGeneration"), meta.get("generation")
    stale = isinstance(observed, int) and isinstance(generation, int) and observed < generation
    if phase is not None and stale and code_hash and status.get("codeHash") != code_hash:
        phase, message = Phase.BUILDING, NEW_CODE
    if phase is None:  # the operator has not reported yet: code waits for its build, as on sless up
        phase = Phase.BUILDING if code_hash else Phase.PENDING
        message = message or (WAITING_FOR_OPERATOR if code_hash else WAITING_FOR_CODE)
    return FunctionRecord(
        namespace=str(meta.get("namespace", "")),
        spec=function_spec(str(meta.get("name", "")), cr_spec),
        phase=str(phase),
        message=message,
        code_hash=code_hash,
        image=status.get("image") or None,
        created_at=_created(obj),
        last_built_at=parse_time(status.get("lastBuiltAt")),
    )


# triggers

def trigger_manifest(namespace: str, spec: TriggerSpec, function_obj: dict[str, Any] | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": spec.name, "namespace": namespace, "labels": labels(spec.function)}
    if function_obj is not None:
        metadata["ownerReferences"] = [owner_reference(function_obj)]
    return {"apiVersion": crd.API_VERSION, "kind": "Trigger", "metadata": metadata,
            "spec": crd.trigger_spec_to_cr(spec.to_dict())}


def trigger_spec(name: str, cr_spec: dict[str, Any]) -> TriggerSpec:
    return TriggerSpec(
        name=name,
        type=str(cr_spec.get("type", "")),
        function=str(cr_spec.get("function", "")),
        enabled=bool(cr_spec.get("enabled", True)),
        schedule=cr_spec.get("schedule"),
        queue=cr_spec.get("queue"),
        auth=str(cr_spec.get("auth") or "public"),
    )


def trigger_record(obj: dict[str, Any]) -> TriggerRecord:
    meta, status = _meta(obj), _section(obj, "status")
    return TriggerRecord(
        namespace=str(meta.get("namespace", "")),
        spec=trigger_spec(str(meta.get("name", "")), _section(obj, "spec")),
        created_at=_created(obj),
        last_fired_at=parse_time(status.get("lastFiredAt")),
        message=str(status.get("message") or ""),
    )


# jobs

def job_manifest(namespace: str, spec: JobSpec, function_obj: dict[str, Any] | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": spec.name, "namespace": namespace, "labels": labels(spec.function)}
    if function_obj is not None:
        metadata["ownerReferences"] = [owner_reference(function_obj)]
    return {"apiVersion": crd.API_VERSION, "kind": "FunctionJob", "metadata": metadata,
            "spec": crd.job_spec_to_cr(spec.to_dict())}


def job_record(obj: dict[str, Any]) -> JobRecord:
    meta, cr_spec, status = _meta(obj), _section(obj, "spec"), _section(obj, "status")
    event = cr_spec.get("event")
    run_id = int(cr_spec.get("runId", 1))
    spec = JobSpec(name=str(meta.get("name", "")), function=str(cr_spec.get("function", "")),
                   event=event if isinstance(event, dict) else {}, run_id=run_id)
    reported_run = status.get("runId")
    current = reported_run is None or reported_run == run_id
    phase = status.get("phase") if current and status.get("phase") in _JOB_PHASES else None
    if phase is None:
        phase = JobPhase.RECORDED if run_id == 0 else JobPhase.PENDING
        message = RECORDED if run_id == 0 else ""
        started = completed = None
    else:
        message = str(status.get("message") or "")
        started, completed = parse_time(status.get("startTime")), parse_time(status.get("completionTime"))
    return JobRecord(namespace=str(meta.get("namespace", "")), spec=spec, phase=str(phase), message=message,
                     started_at=started, completed_at=completed, created_at=_created(obj))


# versions

CODE_FIELDS = ("codeKey", "codeSha256", "contextKey", "contextSha256", "depsHash")


def function_versions(obj: dict[str, Any]) -> list[Version]:
    """``status.versions`` (the operator records each deploy that became Ready), oldest first."""
    name = str(_meta(obj).get("name", ""))
    found = []
    for entry in _section(obj, "status").get("versions") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("version"), int):
            continue
        raw = entry.get("spec")
        cr_spec: dict[str, Any] = raw if isinstance(raw, dict) else {}
        config = function_config(function_spec(name, cr_spec))
        extra = {k: str(cr_spec.get(k) or "") for k in CODE_FIELDS}
        found.append(Version(entry["version"], str(entry.get("codeHash") or ""), config,
                             parse_time(entry.get("deployedAt")) or 0.0, extra))
    return sorted(found, key=lambda v: v.version)


def rollback_spec(obj: dict[str, Any], target: Version) -> dict[str, Any]:
    """The Function's spec with TARGET's configuration and code (replicas and the like kept)."""
    name = str(_meta(obj).get("name", ""))
    spec = function_cr_spec(FunctionSpec.from_dict({**target.config, "name": name}), _section(obj, "spec"))
    spec.update({"codeHash": target.code_hash, **{k: target.extra.get(k, "") for k in CODE_FIELDS}})
    return spec
