"""What Functions cost the cluster's control plane: API server requests, objects, storage (bench/operator_scale.py).

Read from the API server itself, so nothing is estimated: ``apiserver_request_total`` (every request any client
made: the operator, the controllers, the scheduler, kwok), the storage size the API server reports for etcd
(``apiserver_storage_size_bytes``, or the older ``apiserver_storage_db_total_size_in_bytes``), and the objects in
the tenant namespaces, counted by kind.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field

from sless_core import crd
from sless_operator.kube import ApiError, Kube, api_path

_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')
STORAGE_METRICS = ("apiserver_storage_size_bytes", "apiserver_storage_db_total_size_in_bytes")
#: (api version, plural) of what a tenant namespace may hold on the platform's behalf.
KINDS = (
    (crd.API_VERSION, crd.FUNCTION_PLURAL),
    (crd.API_VERSION, crd.TRIGGER_PLURAL),
    ("apps/v1", "deployments"),
    ("apps/v1", "replicasets"),
    ("v1", "pods"),
    ("v1", "services"),
    ("discovery.k8s.io/v1", "endpointslices"),
    ("v1", "secrets"),
    ("v1", "configmaps"),
    ("v1", "serviceaccounts"),
    ("networking.k8s.io/v1", "networkpolicies"),
    ("policy/v1", "poddisruptionbudgets"),
    ("v1", "resourcequotas"),
    ("v1", "limitranges"),
    ("keda.sh/v1alpha1", "scaledobjects"),
)


@dataclass
class Requests:
    """API server requests so far: in all, by resource and by verb."""

    total: float = 0.0
    by_resource: dict[str, float] = field(default_factory=dict)
    by_verb: dict[str, float] = field(default_factory=dict)

    def since(self, earlier: Requests) -> Requests:
        return Requests(self.total - earlier.total,
                        {k: v - earlier.by_resource.get(k, 0.0) for k, v in self.by_resource.items()},
                        {k: v - earlier.by_verb.get(k, 0.0) for k, v in self.by_verb.items()})  # fmt: skip


def parse_requests(exposition: str) -> tuple[Requests, float | None]:
    """The request counters and the storage size (bytes, None when not reported) of a ``/metrics`` answer."""
    requests = Requests()
    storage: float | None = None
    for line in exposition.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, value = match.group("name"), float(match.group("value"))
        if name in STORAGE_METRICS:
            storage = (storage or 0.0) + value
        if name != "apiserver_request_total":
            continue
        labels = {m.group("key"): m.group("value") for m in _LABEL.finditer(match.group("labels") or "")}
        requests.total += value
        resource = labels.get("resource") or "(none)"
        requests.by_resource[resource] = requests.by_resource.get(resource, 0.0) + value
        verb = labels.get("verb") or "(none)"
        requests.by_verb[verb] = requests.by_verb.get(verb, 0.0) + value
    return requests, storage


async def sample(kube: Kube) -> tuple[Requests, float | None]:
    return parse_requests(await kube.text("/metrics"))


async def objects(kube: Kube, tenants: list[str]) -> dict[str, int]:
    """Objects of each kind in the TENANTS' namespaces (a kind the cluster does not serve counts 0)."""

    async def count(api_version: str, plural: str) -> int:
        found = 0
        for ns in tenants:
            try:
                found += len(await kube.list(api_path(api_version, plural, ns)))
            except ApiError:  # e.g. KEDA's kind on a bed without KEDA
                return found
        return found

    counts = await asyncio.gather(*(count(v, p) for v, p in KINDS))
    return {plural: n for (_, plural), n in zip(KINDS, counts, strict=True)}
