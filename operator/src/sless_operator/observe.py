"""Small summaries of observed children (Jobs, Deployments, Triggers), and what they mean.

The watch streams feed these into Kopf indices, so a reconcile reads the state of its children
from memory instead of asking the apiserver again; they are kept small on purpose (a thousand
Functions mean thousands of entries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sless_core import crd
from sless_core.crcodec import InvalidResource, TriggerResource
from sless_operator.manifests import (
    ANNOTATION_AUTOSCALED,
    CODE_KEY_ENV,
    CONTAINER,
    FETCH_CODE_CONTAINER,
    FETCH_EXIT_CODE,
    SPEC_HASH,
)


@dataclass(frozen=True)
class JobSummary:
    namespace: str
    name: str
    labels: dict[str, str]
    state: str  # pending | active | complete | failed
    reason: str
    message: str
    start_time: str
    completion_time: str
    uid: str = ""
    #: the function's version it runs (``sless.dev/version``), None when the Job does not say
    version: int | None = None

    @property
    def finished(self) -> bool:
        return self.state in ("complete", "failed")


@dataclass(frozen=True)
class DeploymentSummary:
    namespace: str
    name: str
    spec_hash: str
    owner_uids: tuple[str, ...]
    replicas: int
    generation: int
    observed_generation: int
    total: int
    updated: int
    available: int
    progress_failed: str  # the Progressing condition's message when its deadline was exceeded
    # its replicas belong to a KEDA ScaledObject (manifests.ANNOTATION_AUTOSCALED)
    autoscaled: bool = False
    # its pods spread over nodes (topologySpreadConstraints): it has a PodDisruptionBudget beside it
    spread: bool = False
    # the Deployment controller's word that the current template's rollout finished
    # (Progressing: NewReplicaSetAvailable), which scaling alone does not take back
    complete: bool = False
    # the generation at which the operator last wrote this template (0: not known, e.g. since a restart): a
    # scaled Deployment's later generations are its autoscaler's replicas, no rollout to wait for
    template_generation: int = 0

    def rollout(self) -> tuple[str, str]:
        """("ready" | "progressing" | "failed", message): ready = like ``kubectl rollout status``.

        A scaled Deployment is ready once its current template has rolled out, at whatever count
        its autoscaler sets: 0 (scaled to zero), or pods still starting after a scale-up (a call
        waits for them; the function is not being deployed).
        """
        if self.progress_failed:
            return "failed", self.progress_failed
        observed_needed = self.generation
        if self.autoscaled and 0 < self.template_generation <= self.generation:
            observed_needed = self.template_generation  # KEDA's replicas changes since are no rollout
        if self.observed_generation < observed_needed:
            return "progressing", "waiting for the Deployment controller"
        if self.autoscaled and self.complete and self.total == self.updated:
            return "ready", ""
        if self.updated < self.replicas:
            return "progressing", f"{self.updated} of {self.replicas} replicas updated"
        if self.total > self.updated:
            return "progressing", f"{self.total - self.updated} old replicas are terminating"
        if self.available < self.replicas:
            return "progressing", f"{self.available} of {self.replicas} replicas available"
        return "ready", ""


@dataclass(frozen=True)
class TriggerSummary:
    namespace: str
    name: str
    uid: str
    api_version: str
    type: str
    function: str
    enabled: bool
    schedule: str
    deleting: bool


def _conditions(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in (body.get("status") or {}).get("conditions") or []}


def job_summary(body: dict[str, Any]) -> JobSummary:
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    conds = _conditions(body)
    state, reason, message = "pending", "", ""
    if conds.get("Complete", {}).get("status") == "True":
        state = "complete"
    elif conds.get("Failed", {}).get("status") == "True":
        failed = conds["Failed"]
        state, reason, message = "failed", str(failed.get("reason") or ""), str(failed.get("message") or "")
    elif status.get("active"):
        state = "active"
    return JobSummary(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        labels=dict(meta.get("labels") or {}),
        state=state,
        reason=reason,
        message=message,
        start_time=str(status.get("startTime") or ""),
        completion_time=str(status.get("completionTime") or ""),
        uid=str(meta.get("uid") or ""),
        version=_version(meta.get("annotations")),
    )


def _version(annotations: object) -> int | None:
    value = annotations.get(crd.ANNOTATION_VERSION) if isinstance(annotations, dict) else None
    return int(value) if isinstance(value, str) and value.isdigit() and len(value) < 10 else None


def deployment_summary(body: dict[str, Any]) -> DeploymentSummary:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    progressing = _conditions(body).get("Progressing", {})
    failed = ""
    if progressing.get("status") == "False" and progressing.get("reason") == "ProgressDeadlineExceeded":
        failed = str(progressing.get("message") or "the rollout exceeded its progress deadline")
    return DeploymentSummary(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        spec_hash=str((meta.get("annotations") or {}).get(SPEC_HASH, "")),
        owner_uids=tuple(str(r.get("uid")) for r in meta.get("ownerReferences") or []),
        replicas=int(spec.get("replicas", 1)),
        generation=int(meta.get("generation", 0)),
        observed_generation=int(status.get("observedGeneration", 0)),
        total=int(status.get("replicas", 0)),
        updated=int(status.get("updatedReplicas", 0)),
        available=int(status.get("availableReplicas", 0)),
        progress_failed=failed,
        autoscaled=(meta.get("annotations") or {}).get(ANNOTATION_AUTOSCALED) == "true",
        spread=bool(((spec.get("template") or {}).get("spec") or {}).get("topologySpreadConstraints")),
        complete=progressing.get("status") == "True" and progressing.get("reason") == "NewReplicaSetAvailable",
    )


def trigger_summary(body: dict[str, Any]) -> TriggerSummary:
    """The index entry of a Trigger; one the codec refuses has no type nor function (it counts for nothing)."""
    meta = body.get("metadata") or {}
    try:
        spec = TriggerResource.from_cr(body).spec
        kind, function, enabled, schedule = spec.type, spec.function, spec.enabled, spec.schedule or ""
    except InvalidResource:
        kind, function, enabled, schedule = "", "", False, ""
    return TriggerSummary(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        api_version=body.get("apiVersion", crd.API_VERSION),
        type=kind,
        function=function,
        enabled=enabled,
        schedule=schedule,
        deleting=bool(meta.get("deletionTimestamp")),
    )


def slim_function(body: dict[str, Any]) -> dict[str, Any]:
    """What the operator reads of a Function, without managedFields, Kopf's state or annotations but the
    deploy's ``traceparent`` (``deploytrace``)."""
    meta = body.get("metadata") or {}
    status = {k: v for k, v in (body.get("status") or {}).items() if k != "kopf"}
    keep = ("name", "namespace", "uid", "generation", "deletionTimestamp", "resourceVersion")
    slim_meta = {k: meta[k] for k in keep if k in meta}
    traceparent = (meta.get("annotations") or {}).get(crd.ANNOTATION_TRACEPARENT)
    if traceparent:
        slim_meta["annotations"] = {crd.ANNOTATION_TRACEPARENT: traceparent}
    return {
        "apiVersion": body.get("apiVersion", crd.API_VERSION),
        "kind": body.get("kind", "Function"),
        "metadata": slim_meta,
        "spec": dict(body.get("spec") or {}),
        "status": status,
    }


def switched_off(triggers: list[TriggerSummary]) -> bool:
    """The function has http triggers and every one is disabled: the tenant said "switch it off".

    No http trigger at all keeps the function running (jobs, cron and the event dispatcher use it too).
    """
    http = [t for t in triggers if t.type == "http" and not t.deleting]
    return bool(http) and not any(t.enabled for t in http)


def desired_replicas(base: int, triggers: list[TriggerSummary]) -> int:
    """The function's fixed replicas, or 0 when it is switched off (``switched_off``); a scaled function's
    ScaledObject is paused at 0 instead (``autoscale``)."""
    return 0 if switched_off(triggers) else base


def _terminated_failure(status: dict[str, Any], exit_codes: tuple[int, ...] | None) -> str | None:
    """The termination message of a container STATUS that exited non-zero (one of EXIT_CODES when given), in
    its current state or its last one (the kubelet restarts a failed container with backoff), or None."""
    for state in (status.get("state") or {}, status.get("lastState") or {}):
        terminated = state.get("terminated") or {}
        code = terminated.get("exitCode")
        if terminated and code not in (0, None) and (exit_codes is None or code in exit_codes):
            message = str(terminated.get("message") or "").strip()
            return message or f"{status.get('name')} exited with code {code}"
    return None


def fetch_failure(pod: dict[str, Any]) -> str | None:
    """Why a function pod could not fetch its code (the fetching container's termination message), or None.

    Go and dependency-image pods fetch in the ``fetch-code`` init container; Python and Node pods on the
    runtime's image in the runtime container itself, which exits ``FETCH_EXIT_CODE`` then (any other exit is
    the function's own failure, which the rollout reports as it always has).
    """
    status = pod.get("status") or {}
    for init in status.get("initContainerStatuses") or []:
        if init.get("name") == FETCH_CODE_CONTAINER:
            return _terminated_failure(init, None)
    if not _fetches_itself(pod):
        return None
    for container in status.get("containerStatuses") or []:
        if container.get("name") == CONTAINER and "running" not in (container.get("state") or {}):
            return _terminated_failure(container, (FETCH_EXIT_CODE,))  # running: fetched since, or trying again
    return None


def _runtime_env(pod: dict[str, Any]) -> dict[str, str]:
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == CONTAINER:
            return {str(e.get("name")): str(e.get("value") or "") for e in container.get("env") or []}
    return {}


def _fetches_itself(pod: dict[str, Any]) -> bool:
    return bool(_runtime_env(pod).get(CODE_KEY_ENV))


def fetched_key(pod: dict[str, Any]) -> str:
    """The code archive (or binary) key a function pod fetches ("" when it has none): ``fetch-code``'s
    ``--key``, or the runtime container's ``SLESS_CODE_KEY``."""
    for container in (pod.get("spec") or {}).get("initContainers") or []:
        if container.get("name") == FETCH_CODE_CONTAINER:
            for arg in container.get("args") or []:
                if isinstance(arg, str) and arg.startswith("--key="):
                    return arg.removeprefix("--key=")
    return _runtime_env(pod).get(CODE_KEY_ENV, "")
