"""Custom resource coordinates; the chart's CRDs, the operator and the API all use these."""

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
