"""Custom resource coordinates; the chart's CRDs, the operator and the API all use these."""

from __future__ import annotations

from typing import Any

GROUP = "sless.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
FUNCTION_PLURAL = "functions"
TRIGGER_PLURAL = "triggers"
JOB_PLURAL = "functionjobs"
# Labels our own children carry, so we find them without relying on built-ins that changed across versions.
LABEL_FUNCTION = "sless.dev/function"
LABEL_TRIGGER = "sless.dev/trigger"
LABEL_JOB = "sless.dev/job"
LABEL_RUN = "sless.dev/run-id"
LABEL_MANAGED = "app.kubernetes.io/managed-by"
MANAGED_BY = "sless"
# What a child object is for (build, function, run, cron), and the tenant namespace it serves when it
# lives elsewhere (build Jobs run in the platform's build namespace, out of the tenant's reach).
LABEL_COMPONENT = "sless.dev/component"
LABEL_NAMESPACE = "sless.dev/namespace"
#: Function ``spec`` field the API sets to a hash of the referenced secrets' revisions; the operator copies
#: it onto the pod template (``ANNOTATION_SECRETS``), so a written secret rolls the function's pods.
SECRETS_VERSION = "secretsVersion"
ANNOTATION_SECRETS = "sless.dev/secrets-version"


def function_spec_to_cr(spec: dict[str, Any], code_hash: str | None = None,
                        context_key: str | None = None) -> dict[str, Any]:
    """The API's snake_case function spec as the CR's camelCase ``spec`` (the name goes to metadata)."""
    body: dict[str, Any] = {
        "runtime": spec["runtime"],
        "entrypoint": spec["entrypoint"],
        "memoryMb": spec["memory_mb"],
        "timeoutSec": spec["timeout_sec"],
        "envVars": dict(sorted(spec.get("env_vars", {}).items())),
        "secrets": list(spec.get("secrets", [])),
    }
    if spec.get("max_concurrency"):
        body["maxConcurrency"] = spec["max_concurrency"]
    if code_hash:
        body["codeHash"] = code_hash
    if context_key:
        body["contextKey"] = context_key
    return body


def function_spec_from_cr(name: str, cr_spec: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`function_spec_to_cr`, for validation with ``FunctionSpec.from_user``."""
    body: dict[str, Any] = {"name": name, "runtime": cr_spec.get("runtime")}
    for cr_key, key in (("entrypoint", "entrypoint"), ("memoryMb", "memory_mb"), ("timeoutSec", "timeout_sec"),
                        ("envVars", "env_vars"), ("secrets", "secrets"), ("maxConcurrency", "max_concurrency")):
        if cr_spec.get(cr_key) is not None:
            body[key] = cr_spec[cr_key]
    return body


def trigger_spec_to_cr(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k != "name" and v is not None}


def job_spec_to_cr(spec: dict[str, Any]) -> dict[str, Any]:
    return {"function": spec["function"], "runId": spec["run_id"], "event": spec.get("event", {})}

# Marks a tenant namespace: the API sets it when it creates one, the operator when it prepares one,
# and the chart's admission policy lets the operator write workloads only where it is "true".
LABEL_TENANT = "sless.dev/tenant"
POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"


def tenant_namespace_labels() -> dict[str, str]:
    """Every tenant namespace's labels, whoever makes it (the API or the operator): the tenant mark and Pod
    Security ``restricted``, enforced, audited and warned (function pods run non-root, read-only, unprivileged)."""
    return {
        LABEL_TENANT: "true",
        POD_SECURITY_ENFORCE: "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
        "pod-security.kubernetes.io/audit": "restricted",
        "pod-security.kubernetes.io/warn": "restricted",
        LABEL_MANAGED: MANAGED_BY,
    }
