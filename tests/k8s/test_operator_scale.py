"""Functions with ``scale`` on the test bed: the operator's KEDA ScaledObject, replicas left to KEDA, placement.

KEDA's CRDs are applied without KEDA running (``keda_crds``): the ScaledObject is checked as the operator writes
it, and where KEDA or its HPA would change the Deployment's replicas the test does it, as the stand-in the
helpers' names say (``as_keda_scale``). A cluster without KEDA is a fresh API group the operator is configured
to use (``SLESS_KEDA_API_VERSION``): its ScaledObject CRD is missing, then applied, on a shared bed where the
real ``keda.sh`` one stays for every other test.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.kube_operator import Operator, Sless
from tests.support.poll import holds
from tests.support.testbed import Testbed

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
KEDA = "v2.20.2"  # tests/testbed/build-keda.sh's
SCALED_OBJECTS = "scaledobjects.keda.sh"
SCALER = "sless-scaler.test.invalid:9090"
PAUSED = "autoscaling.keda.sh/paused-replicas"


def keda_crd_file() -> Path | None:
    """KEDA's ScaledObject CRD: from tests/testbed/build-keda.sh's folder once built, else from the module cache
    that build downloads KEDA's published module into (the same file, there as soon as the build has started)."""
    proc = subprocess.run(["bash", str(ROOT / "tests/testbed/build-keda.sh"), "--check"], capture_output=True,
                          text=True, check=False)  # fmt: skip
    if proc.returncode == 0 and proc.stdout.strip():
        built = Path(proc.stdout.strip()) / "crds" / "keda.sh_scaledobjects.yaml"
        if built.exists():
            return built
    cache = Path(os.environ.get("TESTBED_CACHE", "/var/cache/sless-testbed"))
    downloaded = cache / "keda/gomod/github.com/kedacore/keda" / f"v2@{KEDA}" / "config/crd/bases"
    found = downloaded / "keda.sh_scaledobjects.yaml"
    return found if found.exists() else None


@pytest.fixture(scope="module")
def keda_crd(sless_crds: Testbed) -> dict[str, Any]:
    """KEDA's ScaledObject CRD applied (KEDA itself does not run); the CRD as read from KEDA's sources."""
    path = keda_crd_file()
    if path is None:
        pytest.skip("KEDA's CRDs are not there yet: run tests/testbed/build-keda.sh")
    crd: dict[str, Any] = yaml.safe_load(path.read_text())
    if sless_crds.get("crd", SCALED_OBJECTS) is None:
        sless_crds.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=sless-tests",
                           "-f", str(path))  # fmt: skip
    sless_crds.wait_established(SCALED_OBJECTS)
    return crd


@contextmanager
def start_operator(bed: Testbed, tenant: str, tmp_path: Path, **env: str) -> Iterator[Operator]:
    build_ns = f"sless-build-{secrets.token_hex(4)}"
    op = Operator(bed, tenant, build_ns, tmp_path, extra_env={"SLESS_SCALER_ADDRESS": SCALER, **env}).start()
    try:
        yield op
    finally:
        op.stop()
        bed.kubectl("delete", "namespace", build_ns, "--wait=false", "--ignore-not-found", check=False)


def renamed_crd(keda_crd: dict[str, Any], group: str) -> dict[str, Any]:
    """KEDA's ScaledObject CRD under another API group (served by the API server alike, watched by no KEDA)."""
    crd: dict[str, Any] = json.loads(json.dumps(keda_crd))
    crd["metadata"] = {"name": f"scaledobjects.{group}"}
    crd["spec"]["group"] = group
    crd["spec"]["names"].pop("shortNames", None)
    crd["spec"]["names"].pop("categories", None)
    return crd


@pytest.fixture(scope="module")
def own_group(keda_crd: dict[str, Any], sless_crds: Testbed) -> Iterator[str]:
    """An API group of this module's own for the ScaledObjects (``SLESS_KEDA_API_VERSION``): a real KEDA that another
    test of the session may run watches ``keda.sh`` only, so here nothing but the operator and the tests' stand-in
    (``as_keda_scale``) moves a Deployment's replicas."""
    group = f"t{secrets.token_hex(6)}.keda.test"
    crd = renamed_crd(keda_crd, group)
    sless_crds.apply(crd)
    sless_crds.wait_established(crd["metadata"]["name"])
    try:
        yield group
    finally:
        sless_crds.kubectl("delete", "crd", crd["metadata"]["name"], "--ignore-not-found", "--wait=false",
                           check=False)  # fmt: skip


class ScaledSless(Sless):
    """``Sless`` whose operator writes its ScaledObjects in GROUP."""

    def __init__(self, bed: Testbed, namespace: str, op: Operator, group: str) -> None:
        super().__init__(bed, namespace, op)
        self.scaled_objects = f"scaledobjects.{group}"


@pytest.fixture
def scaled(own_group: str, sless_crds: Testbed, tenant: str, tmp_path: Path) -> Iterator[ScaledSless]:
    """``sless`` with an operator that knows the scaler's address, its ScaledObjects in the module's own group."""
    with start_operator(sless_crds, tenant, tmp_path, SLESS_KEDA_API_VERSION=f"{own_group}/v1alpha1") as op:
        yield ScaledSless(sless_crds, tenant, op, own_group)


def scaled_object(sless: ScaledSless, name: str) -> dict[str, Any] | None:
    return sless.get(sless.scaled_objects, name)


def deployment(sless: Sless, name: str) -> dict[str, Any]:
    found = sless.get("deployment", name)
    assert found is not None, f"no Deployment {name}"
    return found


def replicas(sless: Sless, name: str) -> int:
    return int(deployment(sless, name)["spec"]["replicas"])


def as_keda_scale(sless: Sless, name: str, count: int) -> None:
    """What KEDA (or the HPA it owns) does to a scaled Function's Deployment: set its replicas."""
    sless.bed.kubectl("-n", sless.ns, "scale", "deployment", name, f"--replicas={count}")


def pod_spec(dep: dict[str, Any]) -> dict[str, Any]:
    return dict(dep["spec"]["template"]["spec"])


def env_of(dep: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod_spec(dep)["containers"][0]["env"]}


def ready_with(sless: Sless, name: str, probe: Any) -> dict[str, Any]:
    """The Function once Ready at its current generation with PROBE(body) true."""

    def check() -> dict[str, Any] | None:
        body = sless.get("Function", name)
        status = (body or {}).get("status") or {}
        if body and status.get("phase") == "Ready" and status.get("observedGeneration") == \
                body["metadata"]["generation"] and probe(body):  # fmt: skip
            return body
        return None

    found: dict[str, Any] = sless.op.wait(f"Function {name} Ready as expected", check)
    return found


def test_a_scaled_function_gets_its_scaled_object_and_keda_keeps_the_replicas(scaled: ScaledSless) -> None:
    sless = scaled
    sless.function("web", scale={"min": 0, "max": 3, "target": 5, "idleSec": 60})
    body = sless.wait_phase("Function", "web", "Ready")
    so = sless.op.wait("the ScaledObject", lambda: scaled_object(sless, "web"))
    assert so["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    assert so["metadata"]["ownerReferences"][0]["controller"] is True
    assert PAUSED not in (so["metadata"].get("annotations") or {})
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (0, 3)
    assert spec["cooldownPeriod"] == spec["initialCooldownPeriod"] == 60
    assert spec["pollingInterval"] == 10
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == {
        "scaleUp": {"stabilizationWindowSeconds": 0}, "scaleDown": {"stabilizationWindowSeconds": 60}}  # fmt: skip
    assert spec["triggers"] == [{"type": "external-push",
                                 "metadata": {"scalerAddress": SCALER, "function": "web", "target": "5"}}]  # fmt: skip

    dep = deployment(sless, "web")
    assert dep["spec"]["replicas"] == 1  # max(min, 1): the first deploy shows that a pod starts
    assert dep["metadata"]["annotations"]["sless.dev/autoscaled"] == "true"
    # max >= 2: spread over nodes, and a budget that lets a drain take one pod at a time
    [spread] = pod_spec(dep)["topologySpreadConstraints"]
    assert (spread["topologyKey"], spread["whenUnsatisfiable"], spread["maxSkew"]) == \
        ("kubernetes.io/hostname", "ScheduleAnyway", 1)  # fmt: skip
    pdb = sless.op.wait("the PodDisruptionBudget", lambda: sless.get("poddisruptionbudget", "web"))
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == dep["spec"]["selector"]
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]

    as_keda_scale(sless, "web", 3)
    sless.patch_spec("Function", "web", envVars={"GREETING": "hi"})  # a reconcile that updates the Deployment
    sless.op.wait("the new env rolled out", lambda: env_of(deployment(sless, "web")).get("GREETING") == "hi")
    ready_with(sless, "web", lambda _: True)
    assert replicas(sless, "web") == 3
    holds("KEDA's 3 replicas stay", lambda: replicas(sless, "web") == 3, 3,
          "a reconcile that wrote replicas would do so within its run, well under a second on the bed; the "
          "rollout's own events wake it again within 3 s")  # fmt: skip

    sless.patch_spec("Function", "web", scale=None)  # fixed replicas again: spec.replicas (1)
    sless.wait_gone(sless.scaled_objects, "web")
    sless.op.wait("the operator sets the replicas again", lambda: replicas(sless, "web") == 1)
    dep = deployment(sless, "web")
    assert "sless.dev/autoscaled" not in (dep["metadata"].get("annotations") or {})
    assert "topologySpreadConstraints" not in pod_spec(dep)
    sless.wait_gone("poddisruptionbudget", "web")
    ready_with(sless, "web", lambda _: True)


def test_disabled_http_triggers_pause_the_scaled_object_at_zero(scaled: ScaledSless) -> None:
    sless = scaled
    sless.function("api", scale={"min": 1, "max": 1})
    sless.wait_phase("Function", "api", "Ready")
    sless.apply("Trigger", "api-http", {"type": "http", "function": "api"})
    sless.op.wait("trigger status", lambda: "serving /fn/" in sless.status("Trigger", "api-http").get("message", ""))
    assert PAUSED not in ((scaled_object(sless, "api") or {})["metadata"].get("annotations") or {})
    assert sless.get("poddisruptionbudget", "api") is None  # one pod at most: no budget
    assert "topologySpreadConstraints" not in pod_spec(deployment(sless, "api"))

    sless.patch_spec("Trigger", "api-http", enabled=False)
    so = sless.op.wait("paused at 0", lambda: (o := scaled_object(sless, "api")) and
                       (o["metadata"].get("annotations") or {}).get(PAUSED) == "0" and o)  # fmt: skip
    assert so["spec"]["minReplicaCount"] == 1
    # KEDA does not run here: replicas that moved would be the operator's write
    holds("the operator leaves the replicas to KEDA", lambda: replicas(sless, "api") == 1, 3,
          "the trigger's reconcile that paused the ScaledObject is over; a replicas write comes in the same run")

    sless.patch_spec("Trigger", "api-http", enabled=True)
    sless.op.wait("unpaused", lambda: PAUSED not in ((scaled_object(sless, "api") or {})["metadata"]
                                                     .get("annotations") or {}))  # fmt: skip
    assert replicas(sless, "api") == 1


def test_a_scaled_function_is_ready_at_zero_replicas(scaled: ScaledSless) -> None:
    sless = scaled
    sless.function("idle", scale={"min": 0, "max": 1, "idleSec": 5})
    body = sless.wait_phase("Function", "idle", "Ready")
    assert body["status"].get("message", "") == ""  # one pod runs
    as_keda_scale(sless, "idle", 0)  # idle for idleSec: KEDA takes it to 0
    body = ready_with(sless, "idle", lambda b: b["status"].get("message") == "scaled to zero")
    ready = next(c for c in body["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    sless.op.wait("pods gone", lambda: not sless.labelled("pods", "sless.dev/function=idle"))

    sless.patch_spec("Function", "idle", envVars={"V": "2"})  # new code or config at 0 replicas is ready at once
    ready_with(sless, "idle", lambda b: b["status"].get("message") == "scaled to zero")
    assert env_of(deployment(sless, "idle")).get("V") == "2" and replicas(sless, "idle") == 0

    as_keda_scale(sless, "idle", 1)  # a call came
    ready_with(sless, "idle", lambda b: not b["status"].get("message"))


@pytest.fixture
def keda_elsewhere(keda_crd: dict[str, Any], sless_crds: Testbed) -> Iterator[tuple[str, dict[str, Any]]]:
    """A KEDA API group of this test alone (``<random>.keda.test/v1alpha1``): its ScaledObject CRD (KEDA's,
    renamed) is not installed until the test applies it; removed afterwards."""
    group = f"t{secrets.token_hex(6)}.keda.test"
    crd = renamed_crd(keda_crd, group)
    try:
        yield f"{group}/v1alpha1", crd
    finally:
        sless_crds.kubectl("delete", "crd", crd["metadata"]["name"], "--ignore-not-found", "--wait=false",
                           check=False)  # fmt: skip


def test_without_keda_a_scaled_function_fails_and_others_run_until_keda_comes(
    keda_elsewhere: tuple[str, dict[str, Any]], sless_crds: Testbed, tenant: str, tmp_path: Path,
) -> None:  # fmt: skip
    api_version, crd = keda_elsewhere
    group = api_version.split("/")[0]
    with start_operator(sless_crds, tenant, tmp_path, SLESS_KEDA_API_VERSION=api_version) as op:
        sless = Sless(sless_crds, tenant, op)
        sless.function("plain")
        sless.function("elastic", scale={"min": 0, "max": 2})
        body = sless.wait_phase("Function", "elastic", "Failed")
        missing = f"scaling needs KEDA: scaledobjects.{group} ({api_version}) is not installed"
        assert body["status"]["message"] == missing
        ready = next(c for c in body["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "NoKEDA")
        sless.wait_phase("Function", "plain", "Ready")
        assert sless.get("deployment", "elastic") is None

        sless_crds.apply(crd)  # KEDA installed later: found without a restart
        sless_crds.wait_established(crd["metadata"]["name"])
        sless.wait_phase("Function", "elastic", "Ready", timeout=120)
        so = op.wait("the ScaledObject", lambda: sless.get(f"scaledobjects.{group}", "elastic"))
        assert so["apiVersion"] == api_version and so["spec"]["maxReplicaCount"] == 2
