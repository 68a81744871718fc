"""Whether the cluster has KEDA, the engine behind a function's ``scale`` on Kubernetes.

The operator turns a Function's ``spec.scale`` into a KEDA ``ScaledObject`` (keda.sh/v1alpha1). On a cluster
without KEDA nothing would ever scale the function, so the API refuses ``scale`` there (422, as for any
capability this installation lacks) instead of storing a setting that silently does nothing.

The answer comes from API discovery (``GET /apis/keda.sh/v1alpha1``, readable by every authenticated client:
no extra RBAC) and is kept for ``RECHECK_SEC``, so installing (or removing) KEDA is noticed within a minute
and a create costs no discovery request most of the time. A discovery request that fails (the API server
unreachable or erroring) is not remembered: that call answers 503, the next one asks again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from sless_api.backends.kube.client import KubeClient
from sless_api.domain.errors import Unavailable, Unsupported

log = logging.getLogger("sless.kube")

GROUP, VERSION, RESOURCE = "keda.sh", "v1alpha1", "scaledobjects"
RECHECK_SEC = 60.0
MISSING = ("scaling needs KEDA, which this cluster does not have (no keda.sh/v1alpha1 scaledobjects); "
           "install KEDA, or leave scale out (null) for fixed replicas")


def _serves_scaledobjects(answer: Any) -> bool:
    """Whether a discovery answer (``V1APIResourceList`` or its dict) lists ``scaledobjects``."""
    resources = answer.get("resources") if isinstance(answer, dict) else getattr(answer, "resources", None)
    for resource in resources or []:
        name = resource.get("name") if isinstance(resource, dict) else getattr(resource, "name", None)
        if name == RESOURCE:
            return True
    return False


class KedaCheck:
    """``await check.require()``: nothing when the cluster serves ScaledObjects, else :class:`Unsupported`."""

    def __init__(self, kube: KubeClient, recheck_sec: float = RECHECK_SEC,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.recheck_sec = recheck_sec
        self.clock = clock
        self._known: tuple[bool, float] | None = None  # (present, when asked)
        self._lock = asyncio.Lock()

    async def available(self) -> bool:
        async with self._lock:
            if self._known is not None and self.clock() - self._known[1] < self.recheck_sec:
                return self._known[0]
            present = await self._ask()
            self._known = (present, self.clock())
            return present

    async def require(self) -> None:
        if not await self.available():
            raise Unsupported(MISSING, field="scale")

    async def _ask(self) -> bool:
        try:
            answer = await self.kube.call_raw(self.kube.custom.get_api_resources, GROUP, VERSION)
        except ApiException as exc:
            if exc.status == 404:
                return False
            log.warning("API discovery of %s/%s failed: %s %s", GROUP, VERSION, exc.status, exc.reason)
            raise Unavailable("the Kubernetes API did not say whether KEDA is installed; try again") from exc
        return _serves_scaledobjects(answer)
