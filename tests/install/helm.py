"""`helm template` and `helm lint` of charts/sless, for the chart tests.

helm comes from the test bed's bin folder (`tests/testbed/testbed build` builds it with the
Kubernetes binaries) or from PATH. Rendering pins the Kubernetes version: a helm built from its
Go module reports v1.20 by default, below the chart's kubeVersion.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "sless"
TESTBED = ROOT / "tests" / "testbed" / "testbed"
KUBE_VERSION = "1.34.4"
RELEASE = "sless"
NAMESPACE = "sless-system"


class HelmError(RuntimeError):
    """helm exited non-zero; the message holds its stderr."""


@cache
def helm_binary() -> str:
    """The test bed's helm, else helm on PATH; a clear failure when neither exists."""
    proc = subprocess.run([sys.executable, str(TESTBED), "build", "--check"], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    if proc.returncode == 0 and (Path(proc.stdout.strip()) / "helm").is_file():
        return str(Path(proc.stdout.strip()) / "helm")
    found = shutil.which("helm")
    if found:
        return found
    raise HelmError(f"no helm: run `{TESTBED} build` (it builds helm with the test bed) or put helm on PATH")


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=120, check=False)


def render(values: dict[str, Any] | None = None, *extra: str) -> list[dict[str, Any]]:
    """The chart's objects (test hooks included) for VALUES merged over values.yaml."""
    args = ["template", RELEASE, str(CHART), "-n", NAMESPACE, "--kube-version", KUBE_VERSION]
    for key, value in (values or {}).items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    proc = helm(*args, *extra)
    if proc.returncode != 0:
        raise HelmError(proc.stderr.strip())
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_specs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod spec the chart creates (Deployments' templates and bare Pods), by object name."""
    specs = {}
    for obj in objects:
        if obj["kind"] == "Deployment":
            specs[obj["metadata"]["name"]] = obj["spec"]["template"]["spec"]
        elif obj["kind"] == "Pod":
            specs[obj["metadata"]["name"]] = obj["spec"]
    return specs
