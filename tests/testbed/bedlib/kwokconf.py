"""What kwok needs to act as the node: CRDs, Stage objects and its config file.

Stages are served as Stage objects (kwok --enable-crds=Stage) instead of a --config file, so a
test can add its own stage while the cluster runs, e.g. "every Job pod in namespace X fails".
Logs are per-pod Logs objects (--enable-crds=Logs) with a cluster-wide default from the
config file, so `kubectl logs` answers for every kwok pod and a test can choose the text.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

# kwok v0.8.0 layout: kustomize/stage/{pod,node}/<set>/*.yaml (each set also has a kustomization.yaml)
STAGE_SETS = ("node/fast", "node/heartbeat-with-lease", "pod/fast")
# chaos stage: a Running pod labelled pod-container-running-failed.stage.kwok.x-k8s.io=true fails
EXTRA_STAGES = ("pod/chaos/pod-container-running-failed.yaml",)
CRDS = ("kwok.x-k8s.io_stages.yaml", "kwok.x-k8s.io_logs.yaml")
ENABLED_CRDS = "Stage,Logs"
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"


def stage_files(bin_dir: Path) -> list[Path]:
    root = bin_dir / "stages" / "kustomize"
    files: list[Path] = []
    for stage_set in STAGE_SETS:
        found = sorted(p for p in (root / stage_set).glob("*.yaml") if p.name != "kustomization.yaml")
        if not found:
            raise FileNotFoundError(f"no kwok stages in {root / stage_set}")
        files.extend(found)
    for extra in EXTRA_STAGES:
        path = root / extra
        if not path.is_file():
            raise FileNotFoundError(f"kwok stage {path} is missing")
        files.append(path)
    return files


def stages_manifest(bin_dir: Path) -> str:
    return "\n---\n".join(p.read_text() for p in stage_files(bin_dir))


def crds_manifest(bin_dir: Path) -> str:
    root = bin_dir / "kwok-crds"
    return "\n---\n".join((root / name).read_text() for name in CRDS)


def write_config(state: Path) -> Path:
    """Write kwok.yaml (a cluster-wide ClusterLogs default) and the log file it serves."""
    logfile = state / "kwok-default-container.log"
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
    # CRI log format: <RFC3339Nano time> <stream> <P|F> <text>
    logfile.write_text(f"{stamp} stdout F sless-testbed: kwok runs no containers; this is the default log\n")
    config = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "ClusterLogs",
        "metadata": {"name": "sless-testbed-default"},
        "spec": {"logs": [{"logsFile": str(logfile), "follow": False}]},
    }
    path = state / "kwok.yaml"
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def fake_node(name: str) -> dict[str, object]:
    """A Node object kwok adopts (--manage-all-nodes). No taint, so ordinary pods land on it."""
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
            },
        },
        "status": {"allocatable": resources, "capacity": resources},
    }
