"""A real KEDA on the session's test bed, for the tests that ask for it: the session fixture `keda`.

The first test that takes `keda` starts KEDA's operator and metrics adapter on the session's bed
(`tests/testbed/testbed keda`, see tests/testbed/bedlib/keda.py): its CRDs, the namespace `keda`, the
APIService `v1beta1.external.metrics.k8s.io` Available. Later tests share it; it stops with the bed.
Tests that never ask for it start nothing. KEDA must be built before the session
(`tests/testbed/build-keda.sh`, ~6 min cold); the fixture fails fast when it is not.

With SLESS_TESTBED_EXISTING=1 the cluster is not ours to install into: the fixture uses the KEDA
already there (its APIService Available) and skips otherwise; the log paths are then None.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.testbed import TESTBED, Testbed

BUILD_KEDA = TESTBED.parent / "build-keda.sh"
APISERVICE = "v1beta1.external.metrics.k8s.io"
NOT_BUILT = 3


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    """The status condition KIND of OBJ (a ScaledObject, an HPA, an APIService), or None."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


@dataclass(frozen=True)
class Keda:
    """KEDA running on BED: where its logs are, and helpers to reach what it makes."""

    bed: Testbed
    namespace: str  # KEDA's own ("keda")
    operator_log: Path | None  # None on an existing cluster
    adapter_log: Path | None
    info: dict[str, Any] = field(repr=False)  # testbed's keda.json: ports, cert folder, timings

    @staticmethod
    def hpa_name(scaled_object: str) -> str:
        """The HPA KEDA makes for a ScaledObject (unless spec.advanced names another)."""
        return f"keda-hpa-{scaled_object}"

    def hpa(self, namespace: str, scaled_object: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self.bed.get("hpa", self.hpa_name(scaled_object), "-n", namespace)
        return result

    def scaled_object(self, namespace: str, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self.bed.get("scaledobject.keda.sh", name, "-n", namespace)
        return result

    def external_metric(self, namespace: str, scaled_object: str, metric: str) -> float:
        """The value the HPA would get: external.metrics.k8s.io through the apiserver's aggregator."""
        selector = urllib.parse.quote(f"scaledobject.keda.sh/name={scaled_object}")
        path = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{metric}?labelSelector={selector}"
        items = json.loads(self.bed.kubectl("get", "--raw", path).stdout)["items"]
        return sum(_quantity(item["value"]) for item in items)

    def log_tails(self, lines: int = 30) -> str:
        """The end of both logs, for an assertion message."""
        parts = []
        for log in (self.operator_log, self.adapter_log):
            if log is not None and log.exists():
                parts.append(f"--- {log} ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(parts)


def _quantity(value: str) -> float:
    """A Kubernetes quantity as KEDA's metrics use them ("3", "1500m")."""
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value)


def scaled_object(name: str, target: str, triggers: list[dict[str, Any]], *, min_replicas: int = 0,
                  max_replicas: int = 5, polling_interval: int = 1, cooldown_period: int = 1,
                  scale_down_window: int = 0) -> dict[str, Any]:  # fmt: skip
    """A ScaledObject for the Deployment TARGET, tuned for tests: KEDA polls every POLLING_INTERVAL s, scales
    to MIN_REPLICAS COOLDOWN_PERIOD s after its triggers go inactive, and its HPA scales down without the
    default 5-min stabilization window (SCALE_DOWN_WINDOW)."""
    return {
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"name": target}, "pollingInterval": polling_interval,
            "cooldownPeriod": cooldown_period, "minReplicaCount": min_replicas, "maxReplicaCount": max_replicas,
            "advanced": {"horizontalPodAutoscalerConfig": {
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": scale_down_window}}}},
            "triggers": triggers,
        },
    }  # fmt: skip


def _existing(bed: Testbed) -> Keda:
    service = bed.get("apiservice", APISERVICE)
    available = condition(service, "Available")
    if not (available and available.get("status") == "True") or bed.get("crd", "scaledobjects.keda.sh") is None:
        pytest.skip(f"the existing cluster has no KEDA (APIService {APISERVICE} Available, ScaledObject CRD)")
    namespace = ((service or {}).get("spec") or {}).get("service", {}).get("namespace", "keda")
    return Keda(bed, namespace, None, None, {"existing": True})


def start_keda(bed: Testbed, timeout: float = 240) -> Keda:
    """Start KEDA on BED (`testbed keda`; a running one is kept) and describe it."""
    check = subprocess.run(["bash", str(BUILD_KEDA), "--check"], capture_output=True, text=True, timeout=60,
                           check=False)  # fmt: skip
    if check.returncode == NOT_BUILT:
        raise RuntimeError(f"KEDA is not built; run `{BUILD_KEDA}` first (cold: ~6 min)")
    argv = [sys.executable, str(TESTBED), "keda", "--state", str(bed.state)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"testbed keda failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    info = json.loads(proc.stdout)
    return Keda(bed, info["namespace"], Path(info["operator_log"]), Path(info["adapter_log"]), info)


_lock = threading.Lock()
_started: dict[Path, Keda] = {}  # by the bed's state folder: a new bed (a new session's) gets its own KEDA


def acquire(bed: Testbed) -> Keda:
    """KEDA on BED, started on first use."""
    with _lock:
        if bed.state not in _started:
            _started[bed.state] = _existing(bed) if bed.existing else start_keda(bed)
        return _started[bed.state]


@pytest.fixture(scope="session")
def keda(k8s_testbed: Testbed) -> Iterator[Keda]:
    """A real KEDA (operator and metrics adapter) on the session's test bed; it stops with the bed."""
    try:
        running = acquire(k8s_testbed)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield running
