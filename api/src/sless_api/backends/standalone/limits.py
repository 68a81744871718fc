"""A tenant's count limits on ``sless up``: the 403 of a create beyond them, in the words Kubernetes' quota gets.

On Kubernetes the operator's ResourceQuota caps a tenant's functions, triggers and jobs and the API server
refuses a create beyond it (``kube.quota``); ``sless up`` has no API server to ask, so its store counts within the
insert's own transaction (``StateStore``, ``AtLimit``) and the tenant gets the same answer: 403, which limit, how
many are in use, what to do.
"""

from __future__ import annotations

from collections.abc import Callable

from sless_api.backends.settings import TenantLimits
from sless_api.backends.standalone.state import AtLimit
from sless_api.domain.errors import QuotaExceeded


def refused(kind: str, what: str, limit: int, used: int) -> QuotaExceeded:
    """The 403 of creating WHAT (``function 'x'``) when the tenant has USED of its LIMIT of KIND."""
    return QuotaExceeded(
        f"{what}: this tenant's quota allows {limit} {kind} and {used} are in use ({TenantLimits.ENV[kind]}); "
        "delete some first, or ask the operator of this installation for a larger quota",
        quota=kind, limit=limit, used=used, requested=1,
    )  # fmt: skip


def insert_within(kind: str, what: str, limit: int, insert: Callable[[int], bool]) -> bool:
    """INSERT(LIMIT) (a ``StateStore.insert_*``: False when the name is taken), its ``AtLimit`` as the 403."""
    try:
        return insert(limit)
    except AtLimit as exc:
        raise refused(kind, what, limit, exc.used) from None
