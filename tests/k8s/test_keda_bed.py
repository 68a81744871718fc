"""KEDA on the test bed: a real operator and metrics adapter scale a Deployment on kwok.

A ScaledObject with KEDA's `kubernetes-workload` trigger (the number of pods matching a selector: a
metric that needs nothing outside the cluster) scales a Deployment. The whole chain runs as in a
cluster: KEDA's operator makes the HPA `keda-hpa-<name>`, the HPA controller asks the apiserver for
`external.metrics.k8s.io`, the aggregator proxies to KEDA's adapter (ExternalName `localhost`, the
front-proxy client cert), the adapter asks the operator over mutual-TLS gRPC, and the operator counts
the pods. KEDA itself scales 0 <-> 1, the HPA 1 <-> N.
"""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.keda import Keda, condition, scaled_object
from tests.support.poll import until

pytestmark = pytest.mark.k8s

IMAGE = "registry.invalid/sless/nothing:1"  # never pulled: kwok runs no containers
# KEDA polls every 1 s; the HPA controller syncs every 15 s (the controller-manager's default) and may need two
# syncs after the metric changes; kwok makes pods Ready in about a second. 120 s bounds each step with room for
# a loaded 2-core machine.
STEP = 120.0


def _deployment(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "main", "image": IMAGE}]}}},
    }  # fmt: skip


def _work_pods(ns: str, label: str, numbers: range) -> list[dict[str, Any]]:
    """Pods the trigger counts (`work=LABEL`); the Deployment's own pods (`app=...`) do not match."""
    return [{
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"work-{i}", "namespace": ns, "labels": {"work": label}},
        "spec": {"containers": [{"name": "main", "image": IMAGE}]},
    } for i in numbers]  # fmt: skip


def _replicas(keda: Keda, ns: str, name: str) -> tuple[int, int]:
    """The Deployment's (spec.replicas, status.readyReplicas)."""
    deployment = keda.bed.get("deployment", name, "-n", ns) or {}
    return int(deployment["spec"].get("replicas", 1)), int((deployment.get("status") or {}).get("readyReplicas", 0))


def _metric_is(keda: Keda, ns: str, name: str, want: float) -> bool:
    """Whether the aggregated API serves WANT; a failed read (the operator's scaler cache still building,
    a slow gRPC answer on a loaded machine) is "not yet", as for the HPA controller, which asks again."""
    try:
        return keda.external_metric(ns, "fn", name) == want
    except AssertionError:
        return False


def _true(obj: dict[str, Any] | None, kind: str) -> bool:
    cond = condition(obj, kind)
    return bool(cond and cond.get("status") == "True")


def test_keda_scales_a_deployment_through_the_aggregated_external_metrics(keda: Keda) -> None:
    bed = keda.bed
    with bed.namespace("keda-t") as ns:
        trigger = {"type": "kubernetes-workload", "metadata": {"podSelector": "work=fn", "value": "1"}}
        for obj in (_deployment("fn", 1), scaled_object("fn", "fn", [trigger])):
            bed.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(obj))

        # KEDA's operator: the ScaledObject Ready, its HPA made, the Deployment scaled to minReplicaCount 0
        until("ScaledObject fn Ready", lambda: _true(keda.scaled_object(ns, "fn"), "Ready"), STEP)
        hpa = until(f"HPA {keda.hpa_name('fn')}", lambda: keda.hpa(ns, "fn"), STEP)
        [metric] = hpa["spec"]["metrics"]
        assert metric["type"] == "External", hpa["spec"]
        name = metric["external"]["metric"]["name"]  # s0-workload-<namespace>
        assert name.startswith("s0-workload-"), metric
        until("Deployment fn scaled to 0 (no work pods)", lambda: _replicas(keda, ns, "fn") == (0, 0), STEP)
        until("the adapter serving 0 through the aggregator", lambda: _metric_is(keda, ns, name, 0), STEP)

        # 3 work pods -> active: KEDA scales 0 -> 1, the HPA gets 3 through the aggregator and scales to 3
        bed.apply(*_work_pods(ns, "fn", range(3)))
        until("the adapter serving 3 through the aggregator", lambda: _metric_is(keda, ns, name, 3), STEP)
        until("Deployment fn at 3 replicas, all Ready", lambda: _replicas(keda, ns, "fn") == (3, 3), STEP,
              interval=0.5)  # fmt: skip
        hpa = keda.hpa(ns, "fn") or {}
        assert _true(hpa, "ScalingActive"), hpa.get("status")
        [current] = hpa["status"]["currentMetrics"]
        assert current["external"]["metric"]["name"] == name, current
        assert current["external"]["current"]["averageValue"] in ("1", "3"), current  # 3 pods over 1 or 3 replicas

        # a 4th and a 5th: the HPA follows (maxReplicaCount 5)
        bed.apply(*_work_pods(ns, "fn", range(3, 5)))
        until("Deployment fn at 5 replicas", lambda: _replicas(keda, ns, "fn")[0] == 5, STEP, interval=0.5)

        # no work pods -> inactive: KEDA scales to minReplicaCount 0 after the 1 s cooldown
        bed.kubectl("delete", "pods", "-n", ns, "-l", "work=fn", "--wait=false")
        until("the adapter serving 0", lambda: _metric_is(keda, ns, name, 0), STEP)
        until("Deployment fn back at 0", lambda: _replicas(keda, ns, "fn") == (0, 0), STEP, interval=0.5)
        so = keda.scaled_object(ns, "fn")
        assert not _true(so, "Active"), (so or {}).get("status")


def test_keda_processes_listen_on_loopback_only(keda: Keda) -> None:
    if keda.operator_log is None:
        pytest.skip("KEDA of an existing cluster: not our processes")
    pids = _recorded_pids(keda.bed.state)
    listening = _listening_addresses(pids)
    assert len(listening) >= 5, listening  # operator: metrics, health, gRPC; adapter: secure port, /metrics
    assert {address for address, _ in listening} == {"127.0.0.1"}, listening
    assert {port for _, port in listening} >= set(keda.info["ports"].values()), (listening, keda.info["ports"])


def _recorded_pids(state: Path) -> list[int]:
    """KEDA's two processes, as the bed recorded them (pids/<name>.json)."""
    return [int(json.loads((state / "pids" / f"{name}.json").read_text())["pid"])
            for name in ("keda-operator", "keda-adapter")]  # fmt: skip


def _listening_addresses(pids: list[int]) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket the processes PIDS hold (IPv4 and IPv6)."""
    inodes: set[str] = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    found = []
    for table, v6 in (("tcp", False), ("tcp6", True)):
        for line in Path(f"/proc/{pids[0]}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            hex_address, hex_port = fields[1].split(":")
            found.append((_address(hex_address, v6), int(hex_port, 16)))
    return found


def _address(hex_address: str, v6: bool) -> str:
    raw = bytes.fromhex(hex_address)
    # /proc/net/tcp* write each 32-bit word in host (little-endian) order
    data = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.IPv6Address(data) if v6 else ipaddress.IPv4Address(data))
