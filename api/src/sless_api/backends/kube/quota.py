"""A tenant's quota, as the API server enforces it, in the tenant's words.

The operator puts a ResourceQuota (``sless-quota``) in every tenant namespace: object counts of
functions, triggers, jobs and secrets, and pods, compute and storage. A create beyond it is refused by
the API server with a 403 whose message is meant for cluster administrators (``exceeded quota:
sless-quota, requested: count/functions.sless.dev=1, used: ..., limited: ...``). The tenant gets a 403
that says which of its limits it reached and what to do, with the limit as a field; never the 503 of
"the platform may not do this" that other 403s of the API server mean.
"""

from __future__ import annotations

import re

from sless_api.domain.errors import PlatformError, QuotaExceeded, Unavailable
from sless_core import crd

#: ResourceQuota resource names -> what the tenant calls them.
NAMES = {
    f"count/{crd.FUNCTION_PLURAL}.{crd.GROUP}": "functions",
    f"count/{crd.TRIGGER_PLURAL}.{crd.GROUP}": "triggers",
    f"count/{crd.JOB_PLURAL}.{crd.GROUP}": "jobs",
    "secrets": "secrets",
    "count/secrets": "secrets",
    "pods": "pods",
    "requests.storage": "storage",
}
_EXCEEDED = re.compile(r"exceeded quota: (?P<quota>[^,]+), requested: (?P<requested>.*?), used: (?P<used>.*?), "
                       r"limited: (?P<limited>.*)$")  # fmt: skip
_UNKNOWN = "status unknown for quota"


class QuotaBeingCounted(Unavailable):
    """The API server cannot check a create against a quota it has not counted yet: a quota just created or
    changed, or a resource its controller has not discovered yet (a CRD installed moments ago; the quota
    controller looks for new resources every 30 s). It passes by itself, so the client retries it (for at
    most :data:`COUNTING_WAIT_SEC`) before a tenant sees it."""


#: how long a create waits for the quota controller to count (its discovery of new resources runs every 30 s)
COUNTING_WAIT_SEC = 40.0


def _amounts(text: str) -> dict[str, int | str]:
    """``count/functions.sless.dev=2,requests.storage=1Gi`` -> counts as numbers, quantities as written."""
    found: dict[str, int | str] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if sep:
            found[key] = int(value) if value.isdigit() else value
    return found


def refusal(message: str, what: str) -> PlatformError | None:
    """The platform error for a quota refusal of the API server (MESSAGE of its 403) about WHAT; None when
    MESSAGE is about something else."""
    if _UNKNOWN in message:  # a quota just created or changed, not yet counted by the controller
        return QuotaBeingCounted(f"{what}: the tenant's quota is being counted; try again in a moment")
    match = _EXCEEDED.search(message)
    if not match:
        return None
    limited = _amounts(match["limited"])
    used = _amounts(match["used"])
    requested = _amounts(match["requested"])
    resource = next(iter(limited), "")
    name = NAMES.get(resource, resource)
    limit, in_use = limited.get(resource, "?"), used.get(resource, "?")
    return QuotaExceeded(
        f"{what}: this tenant's quota allows {limit} {name} and {in_use} are in use "
        f"(ResourceQuota {match['quota'].strip()}); delete some first, or ask the operator of this installation "
        "for a larger quota",
        quota=name, limit=limit, used=in_use, requested=requested.get(resource, "?"),
    )  # fmt: skip
