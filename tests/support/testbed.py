"""The Kubernetes test bed for pytest: one real control plane per test session.

`k8s_testbed` (session fixture) runs `tests/testbed/testbed up` into a temporary folder and
`down` at the end; with SLESS_TESTBED_EXISTING=1 and KUBECONFIG it reuses that cluster instead.
The returned `Testbed` carries the kubeconfig, the bin folder (kubectl, helm, ...) and an
environment for subprocesses, plus helpers for what kwok cannot do by itself: make Job pods
fail, and choose what `kubectl logs` returns for a pod.

The binaries must be built before the session (`tests/testbed/testbed build`, ~30 min cold on
2 cores): a cold build inside a test would only hit the test timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.poll import until
from tests.testbed.bedlib.kubectl import established

TESTBED = Path(__file__).resolve().parent.parent / "testbed" / "testbed"
NOT_BUILT = 3  # exit code of `testbed build --check` when the binaries are not in the cache
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"  # kwok's chaos stage: Running pod -> Failed

# kwok stage template: every container terminated with the given code; the pod's phase Failed.
_FAILED_STATUS = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  type: ContainersReady
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  restartCount: 0
  started: false
  state:
    terminated:
      exitCode: %(exit_code)d
      reason: %(reason)s
      message: %(message)s
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
phase: Failed
"""


@dataclass(frozen=True)
class Testbed:
    """A running (or reused) cluster and the means to reach it."""

    __test__ = False  # not a pytest test class despite its name

    state: Path
    kubeconfig: Path
    bin_dir: Path | None
    existing: bool
    env: dict[str, str] = field(repr=False)
    info: dict[str, Any] = field(repr=False)

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the test bed; raise with its stderr when CHECK and it fails."""
        proc = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, env=self.env,
                              timeout=timeout, check=False)  # fmt: skip
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def get(self, *args: str) -> Any:
        """`kubectl get ARGS -o json`, parsed; None when it does not exist."""
        proc = self.kubectl("get", *args, "-o", "json", check=False)
        if proc.returncode != 0:
            if "NotFound" in proc.stderr:
                return None
            raise AssertionError(f"kubectl get {' '.join(args)} failed: {proc.stderr.strip()}")
        return json.loads(proc.stdout)

    def apply(self, *objects: dict[str, Any]) -> None:
        """Apply OBJECTS (dicts); JSON needs no YAML library."""
        self.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}))

    def remove_applied(self, objects: list[dict[str, Any]], namespace: str) -> None:
        """Undo a chart's worth of ``apply``: delete its cluster-wide OBJECTS, then NAMESPACE (with the rest)."""
        for obj in objects:
            if "namespace" not in obj["metadata"]:
                self.kubectl("delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found", "--wait=false",
                             check=False)  # fmt: skip
        self.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)

    def wait(self, what: str, probe: Callable[[], Any], timeout: float = 60, interval: float = 0.25) -> Any:
        """Poll PROBE until it returns something truthy; fail the test after TIMEOUT seconds (poll.until, kept as a
        method: the test bed's own waits and the tests that hold a Testbed use it)."""
        return until(what, probe, timeout, interval)

    def wait_established(self, *crds: str, timeout: float = 90) -> None:
        """Until every named CRD (``functions.sless.dev``, no ``crd/`` prefix) is Established (polled: see
        ``bedlib.kubectl.established`` for why not ``kubectl wait``)."""
        self.wait(f"CRDs {', '.join(crds)} Established",
                  lambda: all(established(self.get("crd", name)) for name in crds), timeout=timeout)

    @contextmanager
    def namespace(self, prefix: str = "t") -> Iterator[str]:
        """A fresh namespace, deleted (without waiting) afterwards."""
        name = f"{prefix}-{os.getpid()}-{time.monotonic_ns() % 10**9}"
        self.kubectl("create", "namespace", name)
        try:
            yield name
        finally:
            self.kubectl("delete", "namespace", name, "--wait=false", check=False)

    @contextmanager
    def failing_job_pods(self, namespace: str, exit_code: int = 1, reason: str = "Error",
                         message: str = "failed by the test bed") -> Iterator[str]:  # fmt: skip
        """While active, every running Job pod in NAMESPACE terminates with EXIT_CODE.

        A kwok Stage with a weight wins over kwok's pod-complete stage (weight 0), so the Job
        controller sees a really failed pod and applies backoffLimit as in a real cluster.
        """
        name = f"sless-testbed-fail-{namespace}"[:253]
        self.apply_stage(name, [
            {"key": ".metadata.namespace", "operator": "In", "values": [namespace]},
            {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
            {"key": ".status.phase", "operator": "In", "values": ["Running"]},
            {"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]},
        ], _FAILED_STATUS % {"exit_code": exit_code, "reason": json.dumps(reason), "message": json.dumps(message)})
        try:
            yield name
        finally:
            self.delete_stage(name)

    def apply_stage(self, name: str, expressions: list[dict[str, Any]], status_template: str,
                    delay_ms: int = 200) -> None:  # fmt: skip
        """A kwok Stage that gives the pods matching EXPRESSIONS the status STATUS_TEMPLATE.

        Its weight wins over kwok's own pod stages (weight 0), so the matching pods take this outcome.
        """
        self.apply({
            "apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name},
            "spec": {"resourceRef": {"apiGroup": "v1", "kind": "Pod"}, "selector": {"matchExpressions": expressions},
                     "weight": 10000, "delay": {"durationMilliseconds": delay_ms},
                     "next": {"statusTemplate": status_template}},
        })  # fmt: skip

    def delete_stage(self, name: str) -> None:
        self.kubectl("delete", "stage.kwok.x-k8s.io", name, "--ignore-not-found", check=False)

    def set_pod_logs(self, namespace: str, pod: str, lines: list[str], container: str | None = None) -> Path:
        """Make `kubectl logs` of POD return LINES: kwok serves a file named by a Logs object."""
        logdir = self.state / "pod-logs"
        logdir.mkdir(exist_ok=True)
        path = logdir / f"{namespace}_{pod}_{container or 'all'}.log"
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
        path.write_text("".join(f"{stamp} stdout F {line}\n" for line in lines))
        entry: dict[str, Any] = {"logsFile": str(path), "follow": False}
        if container:
            entry["containers"] = [container]
        self.apply({
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Logs",
            "metadata": {"name": pod, "namespace": namespace},
            "spec": {"logs": [entry]},
        })  # fmt: skip
        return path


def _run_cli(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(TESTBED), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def start_testbed(state: Path | None = None, timeout: float = 600) -> Testbed:
    """Start the test bed (or adopt $KUBECONFIG with SLESS_TESTBED_EXISTING=1) into STATE."""
    existing = os.environ.get("SLESS_TESTBED_EXISTING") == "1"
    if not existing:
        check = _run_cli("build", "--check", timeout=60)
        if check.returncode == NOT_BUILT:
            raise RuntimeError(f"the test bed binaries are not built; run `{TESTBED} build` first (cold: ~30 min)")
    state = state or Path(tempfile.mkdtemp(prefix="sless-testbed-"))
    proc = _run_cli("up", "--state", str(state), "--owner-pid", str(os.getpid()), timeout=timeout)
    sys.stderr.write(proc.stderr)
    if proc.returncode != 0:
        _run_cli("down", "--state", str(state), timeout=120)
        raise RuntimeError(f"testbed up failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    info = json.loads((state / "env.json").read_text())
    exported: dict[str, str] = info["env"]
    env = dict(os.environ)
    env.update({k: v for k, v in exported.items() if k != "PATH_PREPEND"})
    if exported.get("PATH_PREPEND"):
        env["PATH"] = exported["PATH_PREPEND"] + os.pathsep + env.get("PATH", "")
    bin_dir = exported.get("SLESS_TESTBED_BIN")
    return Testbed(
        state=state,
        kubeconfig=Path(exported["KUBECONFIG"]),
        bin_dir=Path(bin_dir) if bin_dir else None,
        existing=bool(info.get("existing")),
        env=env,
        info=info,
    )


def stop_testbed(bed: Testbed) -> None:
    """Stop what `start_testbed` started and delete its folder (a reused cluster is left alone)."""
    proc = _run_cli("down", "--state", str(bed.state), timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"testbed down failed: {proc.stderr.strip()}")


_lock = threading.Lock()
_shared: Testbed | None = None
_users = 0


def acquire() -> Testbed:
    """The session's test bed, started on first use; shared even if several conftests register the fixture."""
    global _shared, _users
    with _lock:
        if _shared is None:
            _shared = start_testbed()
        _users += 1
        return _shared


def release() -> None:
    global _shared, _users
    with _lock:
        _users -= 1
        if _users == 0 and _shared is not None:
            bed, _shared = _shared, None
            stop_testbed(bed)


@pytest.fixture(scope="session")
def k8s_testbed() -> Iterator[Testbed]:
    """A real Kubernetes control plane with one kwok node, for the whole test session."""
    try:
        bed = acquire()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield bed
    finally:
        release()
