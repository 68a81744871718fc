"""Custom resource coordinates and the labels every component sets; the chart's CRDs, the operator and the
API all use these (the resources themselves are decoded and encoded by ``sless_core.crcodec``)."""

from __future__ import annotations

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
#: The W3C ``traceparent`` of the API request that made a Function's or FunctionJob's current change (a deploy, a
#: job's creation or re-run), written with that change while the API traces; the operator's spans continue it.
ANNOTATION_TRACEPARENT = "sless.dev/traceparent"
#: The function's version a run Job (a FunctionJob's run, a cron firing) runs: its invocation record names it.
ANNOTATION_VERSION = "sless.dev/version"

# Marks a tenant namespace: the API sets it when it creates one, the operator when it prepares one,
# and the chart's admission policy lets the operator write workloads only where it is "true".
LABEL_TENANT = "sless.dev/tenant"
# Pod Security admission's namespace labels (https://kubernetes.io/docs/concepts/security/pod-security-admission/)
POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"
POD_SECURITY_ENFORCE_VERSION = "pod-security.kubernetes.io/enforce-version"
POD_SECURITY_AUDIT = "pod-security.kubernetes.io/audit"
POD_SECURITY_WARN = "pod-security.kubernetes.io/warn"


def tenant_mark() -> dict[str, str]:
    """The labels that make a namespace a tenant's for the platform (the chart's admission policy, the API's
    namespace watch): the API puts them back on a namespace that lost them."""
    return {LABEL_TENANT: "true", LABEL_MANAGED: MANAGED_BY}


#: The label selector of the tenant namespaces.
TENANT_SELECTOR = f"{LABEL_TENANT}=true"


def tenant_namespace_labels() -> dict[str, str]:
    """Every tenant namespace's labels, whoever makes it (the API or the operator): the tenant mark and Pod
    Security ``restricted``, enforced, audited and warned (function pods run non-root, read-only, unprivileged)."""
    return {
        **tenant_mark(),
        POD_SECURITY_ENFORCE: "restricted",
        POD_SECURITY_ENFORCE_VERSION: "latest",
        POD_SECURITY_AUDIT: "restricted",
        POD_SECURITY_WARN: "restricted",
    }
