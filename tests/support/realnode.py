"""The real-node test bed for pytest: one control plane plus a real kubelet node per session.

`real_node` runs `tests/testbed/testbed up --real-node` (containerd, kubelet, kube-proxy, CNI
bridge, CoreDNS, a local registry with the runtime images) and `down` at the end, then checks
that the host is as before: no bridge, no iptables rule or ipset, no process, no mount, no cgroup left.

Opt-in: these tests need root, the packages of scripts/install-realnode.sh and a few minutes the
first time (images), so they are skipped unless SLESS_REALNODE=1. Warm the caches first with
`tests/testbed/testbed build --real-node`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.testbed import Testbed

ROOT = Path(__file__).resolve().parents[2]
TESTBED = ROOT / "tests" / "testbed" / "testbed"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


@dataclass(frozen=True)
class RealNode:
    """The running bed with its real node: the registry address and the images in it."""

    bed: Testbed
    registry: str
    node_ip: str
    images: dict[str, str]  # repository (sless/python3.11, sless-testbed/kaniko-executor, ...) -> full ref
    timings: dict[str, float] = field(repr=False)

    def image(self, repository: str) -> str:
        return self.images[repository]

    def pinned(self, repository: str) -> str:
        """The image by digest (``repo@sha256:...``), as the registry holds it now.

        The node's containerd store outlives the bed and the tags are reused (``:testbed``), so a pod
        pulling by tag with ``IfNotPresent`` may run an image built from older sources.
        """
        ref = self.images[repository]
        name, tag = ref.removeprefix(f"{self.registry}/").rsplit(":", 1)
        accept = ", ".join(["application/vnd.oci.image.manifest.v1+json",
                            "application/vnd.docker.distribution.manifest.v2+json"])  # fmt: skip
        request = urllib.request.Request(f"http://{self.registry}/v2/{name}/manifests/{tag}", method="HEAD",
                                         headers={"Accept": accept})  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as resp:
            digest = resp.headers["Docker-Content-Digest"]
        return f"{self.registry}/{name}@{digest}"


def restricted_security() -> tuple[dict[str, Any], dict[str, Any]]:
    """Pod- and container-level securityContext that Pod Security `restricted` admits."""
    pod = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    container = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True}
    return pod, container


# a handler for runtime pods that mount it from a ConfigMap (runtime_pod's HANDLER_CONFIGMAP)
HANDLER = 'def handle(event):\n    return {"hello": "real node", "method": event.get("_method")}\n'


def runtime_pod(name: str, image: str, labels: dict[str, str], handler_configmap: str | None) -> dict[str, Any]:
    """A pod of a runtime image the way the operator shapes it: non-root, read-only root, probed."""
    pod_sec, ctr_sec = restricted_security()
    container: dict[str, Any] = {
        "name": "function", "image": image, "ports": [{"containerPort": 8080}],
        "securityContext": ctr_sec | {"readOnlyRootFilesystem": True},
        "readinessProbe": {"httpGet": {"path": "/_/health", "port": 8080}, "periodSeconds": 1},
        "env": [{"name": "SLESS_ENTRYPOINT", "value": "handler.handle"}],
    }  # fmt: skip
    spec: dict[str, Any] = {"securityContext": pod_sec, "containers": [container], "terminationGracePeriodSeconds": 2}
    if handler_configmap:
        spec["volumes"] = [{"name": "code", "configMap": {"name": handler_configmap}}]
        container["volumeMounts"] = [{"name": "code", "mountPath": "/app/function", "readOnly": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}


def http_get(url: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace")


def pod_ready(bed: Testbed, namespace: str, name: str) -> dict[str, Any] | None:
    pod = bed.get("pod", name, "-n", namespace)
    if pod is None:
        return None
    status = pod.get("status", {})
    for cond in status.get("conditions", []):
        if cond["type"] == "Ready" and cond["status"] == "True":
            return dict(pod)
    waiting = [c.get("state", {}).get("waiting", {}) for c in status.get("containerStatuses", [])]
    bad = [w for w in waiting if w.get("reason") in ("ErrImagePull", "ImagePullBackOff", "CreateContainerError",
                                                       "CrashLoopBackOff", "CreateContainerConfigError")]  # fmt: skip
    if bad:
        raise AssertionError(f"pod {namespace}/{name} cannot start: {bad}")
    return None


def _cli(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TESTBED), *args], capture_output=True, text=True, timeout=timeout,
                          check=False)  # fmt: skip


def leftovers(state: Path) -> list[str]:
    """What a real node could leave on the host after `down`; empty when the host is clean."""
    found = []
    if Path("/sys/class/net/slessbr0").exists():
        found.append("bridge slessbr0")
    for binary in ("iptables-save", "ip6tables-save"):
        dump = subprocess.run([binary], capture_output=True, text=True, check=False).stdout
        ours = (":CNI-", ":KUBE-", "10.199.0.", "sless-testbed")
        found += [f"{binary}: {line}" for line in dump.splitlines() if any(mark in line for mark in ours)]
    # kube-router's ipsets (the NetworkPolicy firewall): KUBE-SRC-*, KUBE-DST-*, TMP-* while swapping
    sets = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True, check=False).stdout.split()
    found += [f"ipset {name}" for name in sets if name.removeprefix("inet6:").startswith(("KUBE-", "TMP-"))]
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(state) in cmdline and int(proc.name) != os.getpid():
            found.append(f"process {proc.name}: {cmdline[:200]}")
    mounts = Path("/proc/self/mounts").read_text()
    found += [f"mount {line.split()[1]}" for line in mounts.splitlines() if str(state) in line]
    for line in mounts.splitlines():
        fields = line.split()
        if fields[2] in ("cgroup", "cgroup2") and Path(fields[1], "sless-testbed").exists():
            found.append(f"cgroup {fields[1]}/sless-testbed")
    return found


@contextmanager
def real_node_bed() -> Iterator[RealNode]:
    """``testbed up --real-node`` in a fresh state folder; ``down`` afterwards, checked to leave nothing."""
    state = Path(tempfile.mkdtemp(prefix="sless-realnode-"))
    start = time.monotonic()
    proc = _cli("up", "--state", str(state), "--real-node", "--owner-pid", str(os.getpid()), timeout=1800)
    sys.stderr.write(proc.stderr[-6000:])
    if proc.returncode != 0:
        _cli("down", "--state", str(state), timeout=300)
        raise RuntimeError(f"testbed up --real-node failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    info = json.loads((state / "env.json").read_text())
    exported: dict[str, str] = info["env"]
    env = dict(os.environ) | {k: v for k, v in exported.items() if k != "PATH_PREPEND"}
    env["PATH"] = exported["PATH_PREPEND"] + os.pathsep + env.get("PATH", "")
    bed = Testbed(state=state, kubeconfig=Path(exported["KUBECONFIG"]), bin_dir=Path(exported["SLESS_TESTBED_BIN"]),
                  existing=False, env=env, info=info)  # fmt: skip
    node = info["real_node"]
    timings = dict(info.get("timings", {})) | {"up (fixture)": round(time.monotonic() - start, 1)}
    try:
        yield RealNode(bed, node["registry"], node["node_ip"], node["images"], timings)
    finally:
        down = _cli("down", "--state", str(state), timeout=300)
        left = leftovers(state)
        assert down.returncode == 0, f"testbed down failed: {down.stderr[-3000:]}"
        assert not left, f"the real node left things on the host after down: {left}"


@pytest.fixture(scope="session")
def real_node() -> Iterator[RealNode]:
    """A control plane and one real node for the whole session (opt-in: SLESS_REALNODE=1)."""
    if os.environ.get("SLESS_REALNODE") != "1":
        pytest.skip("real-node tests are opt-in: SLESS_REALNODE=1 (root, scripts/install-realnode.sh)")
    if os.geteuid() != 0:
        pytest.skip("a real node needs root")
    with ExitStack() as stack:
        failure = ""
        try:
            node = stack.enter_context(real_node_bed())
        except RuntimeError as exc:
            failure = str(exc)
        if failure:
            pytest.fail(failure, pytrace=False)
        yield node
