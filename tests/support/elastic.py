"""The elastic platform on the real-node test bed: everything a Function with ``scale`` needs, started together.

A real KEDA (operator and metrics adapter, host processes of the bed), ``sless-scaler`` on loopback, S3 on the
node's bridge, the API process (kubernetes backend, ``SLESS_KUBE_ROUTING=endpoints``) telling the scaler its
calls in flight, one tenant and an operator for its namespace that gives each scaled Function a ScaledObject
naming the scaler. The setup of tests/realnode/test_realnode_scaling.py's fixture, shared as a context manager so
that the benchmarks (bench/scale_from_zero.py) start exactly what the test starts.

    with elastic_platform(real_node, work) as e:
        e.deploy("fn", "python3.11", {"handler.py": ...}, scale={"min": 0, "max": 3, "target": 2, "idle_sec": 5})
        e.replicas("fn"), e.pods("fn", ready_only=True)
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sless_operator import manifests
from tests.support import scaler
from tests.support.keda import Keda, start_keda
from tests.support.kube_operator import Operator, strip_finalizers
from tests.support.platform import Tenant
from tests.support.realnode import RealNode
from tests.support.realnode_operator import api_server, apply_crds, build_logs, build_namespace, operator_env, s3_server


@dataclass
class ElasticPlatform:
    """The running pieces: the bed, KEDA, the scaler, the API's URL, the tenant and its operator."""

    real_node: RealNode
    keda: Keda
    scaler: scaler.Scaler
    url: str
    tenant: Tenant
    op: Operator
    build_ns: str
    s3: str

    def deploy(self, name: str, runtime: str, files: dict[str, str | bytes], wait: float = 600,
               **spec: Any) -> dict[str, Any]:  # fmt: skip
        """``Tenant.deploy``; a failure says what the build pods and the operator said."""
        try:
            return self.tenant.deploy(name, runtime, files, wait=wait, **spec)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{build_logs(self.real_node, self.build_ns)}\n{self.op.log_tail()}") from None

    def pods(self, function: str | None = None, ready_only: bool = False) -> list[dict[str, Any]]:
        """The function pods (of FUNCTION, else of every function); READY_ONLY: the ready ones not leaving."""
        selector = f"sless.dev/component={manifests.COMPONENT_FUNCTION}"
        if function is not None:
            selector = f"sless.dev/function={function},{selector}"
        bed = self.real_node.bed
        items: list[dict[str, Any]] = (bed.get("pods", "-n", self.tenant.ns, "-l", selector) or {}).get("items", [])
        if not ready_only:
            return items
        return [p for p in items if not p["metadata"].get("deletionTimestamp") and pod_is_ready(p)]

    def replicas(self, function: str) -> int:
        """The Deployment's ``spec.replicas`` (what KEDA and the HPA asked for); -1 while there is none."""
        deployment = self.real_node.bed.get("deployment", function, "-n", self.tenant.ns) or {}
        return int((deployment.get("spec") or {}).get("replicas", -1))

    def all_replicas(self) -> dict[str, int]:
        """``spec.replicas`` of every Deployment of the tenant, by name (one kubectl call)."""
        listed = self.real_node.bed.get("deployments", "-n", self.tenant.ns) or {}
        return {d["metadata"]["name"]: int((d.get("spec") or {}).get("replicas", -1)) for d in listed.get("items", [])}


def pod_is_ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])  # fmt: skip


@contextlib.contextmanager
def elastic_platform(real_node: RealNode, work: Path, tenant_prefix: str = "elastic",
                     api_env: dict[str, str] | None = None) -> Iterator[ElasticPlatform]:  # fmt: skip
    """Start KEDA, the scaler, S3, the API (with API_ENV besides the scaler's address and token), a tenant and
    its operator; at the end stop them and delete the tenant's and the build namespaces (without waiting).
    KEDA keeps running: it stops with the bed."""
    bed = real_node.bed
    apply_crds(real_node)
    keda = start_keda(bed)
    with scaler.running(work) as scaling, s3_server(real_node, work) as s3:
        told = {"SLESS_SCALER_ADDRESS": scaling.address, "SLESS_SCALER_TOKEN": scaler.TOKEN, **(api_env or {})}
        with api_server(real_node, s3, work, told) as url:
            tenant = Tenant(url, f"{tenant_prefix}-{secrets.token_hex(4)}")
            tenant.api("POST", "/ensure", expect=(200, 201))
            build_ns = build_namespace(real_node)
            env = operator_env(real_node, s3) | {"SLESS_SCALER_ADDRESS": scaling.address}
            op = Operator(bed, tenant.ns, build_ns, work, extra_env=env).start()
            try:
                yield ElasticPlatform(real_node, keda, scaling, url, tenant, op, build_ns, s3)
            finally:
                op.stop()
                strip_finalizers(bed, tenant.ns)
                bed.kubectl("delete", "namespace", tenant.ns, build_ns, "--wait=false", check=False)
