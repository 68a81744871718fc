"""A real ``sless-operator`` process on the Kubernetes test bed, and our custom resources driven through kubectl.

Used by the operator's tests (tests/k8s), the API-with-operator and contract tests, the real-node tests and the
benchmarks: each starts its own operator on its own namespaces, so they share the process handling and the
cleanup (finalizers cleared once no operator is left to clear them), not a fixture.
"""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.metrics import SCRAPE_TOKEN
from tests.support.services import free_port
from tests.support.testbed import Testbed

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "charts" / "sless" / "crds"
SLESS_KINDS = ("functions.sless.dev", "triggers.sless.dev", "functionjobs.sless.dev")
REGISTRY = "registry.test.invalid/sless"


def operator_command() -> list[str]:
    """The installed console script next to this interpreter (the venv's), else on PATH."""
    script = Path(sys.executable).parent / "sless-operator"
    found = str(script) if script.exists() else shutil.which("sless-operator")
    if not found:
        raise RuntimeError("sless-operator is not installed (pip install -e .)")
    return [found]


@contextmanager
def operator_for(bed: Testbed, namespace: str, work: Path, extra_env: dict[str, str]) -> Iterator[Operator]:
    """An operator process serving NAMESPACE (a tenant's, made through the API) with a build namespace of its
    own; afterwards stopped, and both namespaces deleted (their finalizers taken off first)."""
    build_ns = f"sless-build-{secrets.token_hex(4)}"
    op = Operator(bed, namespace, build_ns, work, extra_env=extra_env).start()
    try:
        yield op
    finally:
        op.stop()
        strip_finalizers(bed, namespace)
        bed.kubectl("delete", "namespace", namespace, build_ns, "--wait=false", "--ignore-not-found", check=False)


def strip_finalizers(bed: Testbed, namespace: str) -> None:
    """Clear our resources' finalizers in NAMESPACE, so it can go once no operator is left to clear them."""
    for kind in SLESS_KINDS:
        listed = bed.get(kind, "-n", namespace)
        for item in (listed or {}).get("items", []):
            if item["metadata"].get("finalizers"):
                bed.kubectl("-n", namespace, "patch", kind, item["metadata"]["name"], "--type=merge",
                            "-p", '{"metadata":{"finalizers":null}}', check=False)  # fmt: skip


class Operator:
    """A ``sless-operator`` subprocess limited to one tenant namespace (and MORE_NAMESPACES) and its own
    build namespace."""

    def __init__(self, bed: Testbed, namespace: str, build_namespace: str, log_dir: Path,
                 extra_env: dict[str, str] | None = None, more_namespaces: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.bed = bed
        self.namespace = namespace
        self.more_namespaces = more_namespaces
        self.build_namespace = build_namespace
        self.log_dir = log_dir
        self.env = {
            **bed.env,
            "SLESS_BUILD_NAMESPACE": build_namespace,
            "SLESS_REGISTRY": REGISTRY,
            "SLESS_OPERATOR_WATCH_TIMEOUT": "20",
            # fewer retries than the defaults: each failed attempt costs the Job controller's 10 s backoff
            "SLESS_BUILD_RETRIES": "1",
            "SLESS_JOB_RETRIES": "0",
            # signs code download URLs (locally: no S3 server is asked)
            "SLESS_S3_ENDPOINT": "s3.test.invalid:9000",
            "SLESS_S3_ACCESS_KEY": "test-access",
            "SLESS_S3_SECRET_KEY": "test-secret",
            "SLESS_RUNTIME_IMAGE_PREFIX": "runtimes.test.invalid/sless",
            "PYTHONUNBUFFERED": "1",
            "SLESS_METRICS_TOKEN": SCRAPE_TOKEN,
            "SLESS_OPERATOR_METRICS_PORT": str(free_port()),
            **(extra_env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.env['SLESS_OPERATOR_METRICS_PORT']}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"operator-{self.starts}.log"

    def start(self) -> Operator:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [*operator_command(), "--verbose", "--namespace", self.namespace,
                 *[arg for ns in self.more_namespaces for arg in ("--namespace", ns)]],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: no cleanup, no finalizer handling, in-flight work lost."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None

    def stop(self) -> int | None:
        """SIGTERM and wait (Kopf exits cleanly); SIGKILL after a grace period."""
        proc, code = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        code = proc.returncode
        self.proc = None
        return code

    def log_tail(self, lines: int = 60) -> str:
        out = []
        for n in range(1, self.starts + 1):
            path = self.log_dir / f"operator-{n}.log"
            if path.exists():
                text = path.read_text(errors="replace").splitlines()
                out.append(f"--- {path.name} (last {lines} lines)\n" + "\n".join(text[-lines:]))
        return "\n".join(out)

    def wait(self, what: str, probe: Callable[[], Any], timeout: float = 90, interval: float = 0.3) -> Any:
        """Poll PROBE until truthy; on timeout fail with the operator's log tail."""
        deadline = time.monotonic() + timeout
        while True:
            value = probe()
            if value:
                return value
            if self.proc is not None and self.proc.poll() is not None:  # died on its own
                raise AssertionError(f"operator exited ({self.proc.returncode}) while waiting for {what}\n"
                                     + self.log_tail())  # fmt: skip
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not reached within {timeout:.0f}s\n{self.log_tail()}")
            time.sleep(interval)


@contextmanager
def stopped(op: Operator) -> Iterator[None]:
    """Run the body with the operator stopped, then start it again."""
    op.stop()
    try:
        yield
    finally:
        op.start()


CODE_A = "a1" * 32
CODE_B = "b2" * 32
RESOURCES = {
    "Function": "functions.sless.dev",
    "Trigger": "triggers.sless.dev",
    "FunctionJob": "functionjobs.sless.dev",
}


class Sless:
    """Our custom resources in one tenant namespace, driven through kubectl, and waits on them."""

    def __init__(self, bed: Testbed, namespace: str, op: Operator) -> None:
        self.bed = bed
        self.ns = namespace
        self.op = op

    def apply(self, kind: str, name: str, spec: dict[str, Any]) -> None:
        self.bed.apply({"apiVersion": "sless.dev/v1alpha1", "kind": kind,
                        "metadata": {"name": name, "namespace": self.ns}, "spec": spec})  # fmt: skip

    def function(self, name: str, code_hash: str | None = CODE_A, **spec: Any) -> None:
        body: dict[str, Any] = {"runtime": "python3.11", **spec}
        if code_hash:
            body.update(codeHash=code_hash, contextKey=f"contexts/{self.ns}/{name}/{code_hash[:8]}.tar.gz")
        self.apply("Function", name, body)

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.bed.get(RESOURCES.get(resource, resource), name, "-n",
                                                    namespace or self.ns)  # fmt: skip
        return found

    def status(self, resource: str, name: str) -> dict[str, Any]:
        return dict((self.get(resource, name) or {}).get("status") or {})

    def patch_spec(self, resource: str, name: str, **spec: Any) -> None:
        self.bed.kubectl("-n", self.ns, "patch", RESOURCES[resource], name, "--type=merge",
                         "-p", json.dumps({"spec": spec}))  # fmt: skip

    def delete(self, resource: str, name: str, namespace: str | None = None) -> None:
        self.bed.kubectl("-n", namespace or self.ns, "delete", RESOURCES.get(resource, resource), name,
                         "--wait=false")  # fmt: skip

    def labelled(self, resource: str, selector: str, namespace: str | None = None) -> list[dict[str, Any]]:
        listed = self.bed.get(resource, "-n", namespace or self.ns, "-l", selector)
        return list((listed or {}).get("items", []))

    def build_jobs(self, function: str) -> list[dict[str, Any]]:
        selector = f"sless.dev/component=build,sless.dev/namespace={self.ns},sless.dev/function={function}"
        return self.labelled("jobs", selector, self.op.build_namespace)

    def wait_phase(self, resource: str, name: str, phase: str, timeout: float = 90) -> dict[str, Any]:
        """Wait until the resource's status.phase is PHASE and describes its current generation."""

        def probe() -> dict[str, Any] | None:
            body = self.get(resource, name)
            status = (body or {}).get("status") or {}
            if (
                body
                and status.get("phase") == phase
                and status.get("observedGeneration") == body["metadata"].get("generation")
            ):
                return body
            return None

        result: dict[str, Any] = self.op.wait(f"{resource} {name} phase {phase}", probe, timeout)
        return result

    def wait_gone(self, resource: str, name: str, namespace: str | None = None, timeout: float = 90) -> None:
        self.op.wait(f"{resource} {name} gone", lambda: self.get(resource, name, namespace) is None, timeout)
