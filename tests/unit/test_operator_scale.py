"""A scaled Function's objects without a cluster: the KEDA ScaledObject, the Deployment whose replicas it owns,
placement (topology spread, PodDisruptionBudget), the rollout rule at 0 replicas, the merge patches that take
away what a builder no longer sets, and the discovery of KEDA. tests/k8s/test_operator_scale.py drives the
same code through a real apiserver and operator."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import replace
from typing import Any

import pytest

from sless_core.envconfig import ConfigError
from sless_core.models import ScaleSpec
from sless_operator import autoscale, children, manifests
from sless_operator.config import OperatorConfig
from sless_operator.context import Context
from sless_operator.kube import ApiError
from sless_operator.observe import TriggerSummary, deployment_summary, desired_replicas, switched_off
from tests.support.operator_refs import NS, fn_ref

CONFIG = OperatorConfig(registry="registry.test/sless", scaler_address="scaler.test:9090")
SPREAD = "topologySpreadConstraints"


def scaled(min_: int = 0, max_: int = 5, target: int = 7, idle: int = 120, replicas: int = 1) -> manifests.FunctionRef:
    return replace(fn_ref(scale=ScaleSpec(min=min_, max=max_, target=target, idle_sec=idle)), replicas=replicas)


def pod(dep: dict[str, Any]) -> dict[str, Any]:
    return dict(dep["spec"]["template"]["spec"])


def test_the_scaled_object_targets_the_deployment_with_the_functions_scale() -> None:
    obj = manifests.scaled_object(CONFIG, scaled(), paused=False)
    assert obj["apiVersion"] == "keda.sh/v1alpha1" and obj["kind"] == "ScaledObject"
    meta = obj["metadata"]
    assert (meta["name"], meta["namespace"]) == ("hello", NS)
    assert meta["ownerReferences"] == [fn_ref().owner.reference()]
    assert manifests.ANNOTATION_PAUSED_REPLICAS not in meta["annotations"]
    spec = obj["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "hello"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (0, 5)
    assert spec["cooldownPeriod"] == spec["initialCooldownPeriod"] == 120
    assert spec["pollingInterval"] == 10
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior == {"scaleUp": {"stabilizationWindowSeconds": 0}, "scaleDown": {"stabilizationWindowSeconds": 120}}
    assert spec["triggers"] == [{"type": "external-push", "metadata": {
        "scalerAddress": "scaler.test:9090", "function": "hello", "target": "7"}}]  # fmt: skip


def test_a_long_idle_time_caps_the_hpa_stabilisation_and_the_api_version_is_configurable() -> None:
    config = replace(CONFIG, keda_api_version="keda.example/v1beta1")
    obj = manifests.scaled_object(config, scaled(idle=3600), paused=False)
    assert obj["apiVersion"] == "keda.example/v1beta1"
    assert obj["spec"]["cooldownPeriod"] == 3600
    scale_down = obj["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert scale_down == {"stabilizationWindowSeconds": 300}


def test_switched_off_pauses_the_scaled_object_at_zero() -> None:
    running = manifests.scaled_object(CONFIG, scaled(), paused=False)
    paused = manifests.scaled_object(CONFIG, scaled(), paused=True)
    assert paused["metadata"]["annotations"][manifests.ANNOTATION_PAUSED_REPLICAS] == "0"
    assert paused["spec"] == running["spec"]
    assert manifests.spec_hash(paused) != manifests.spec_hash(running)  # a pause is a change to apply


def test_a_scaled_deployment_leaves_its_replicas_to_keda() -> None:
    dep = manifests.deployment(CONFIG, scaled(), "img:1", None)
    assert "replicas" not in dep["spec"]
    assert dep["metadata"]["annotations"][manifests.ANNOTATION_AUTOSCALED] == "true"
    fixed = manifests.deployment(CONFIG, fn_ref(), "img:1", 1)
    assert fixed["spec"]["replicas"] == 1 and manifests.ANNOTATION_AUTOSCALED not in fixed["metadata"]["annotations"]
    assert manifests.initial_replicas(ScaleSpec(min=0, max=3), paused=False) == 1  # the first deploy starts a pod
    assert manifests.initial_replicas(ScaleSpec(min=2, max=3), paused=False) == 2
    assert manifests.initial_replicas(ScaleSpec(min=2, max=3), paused=True) == 0


def test_a_deployment_of_two_or_more_pods_spreads_them_over_nodes() -> None:
    many = pod(manifests.deployment(CONFIG, scaled(max_=2), "img:1", None))
    assert many[SPREAD] == [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                             "whenUnsatisfiable": "ScheduleAnyway",
                             "labelSelector": {"matchLabels": manifests.selector_labels("hello")}}]  # fmt: skip
    assert SPREAD not in pod(manifests.deployment(CONFIG, scaled(max_=1), "img:1", None))
    assert SPREAD in pod(manifests.deployment(CONFIG, replace(fn_ref(), replicas=2), "img:1", 2))
    # the fixed count of the spec decides, not the 0 of a switched-off function (no rollout for a switch)
    off = manifests.deployment(CONFIG, replace(fn_ref(), replicas=2), "img:1", 0)
    assert SPREAD in pod(off)
    assert SPREAD not in pod(manifests.deployment(CONFIG, fn_ref(), "img:1", 1))
    # a fixed-replica Deployment of a scaled spec (a traffic split's other version) counts its fixed replicas
    assert not manifests.many_replicas(scaled(max_=9), autoscaled=False)
    assert manifests.many_replicas(scaled(max_=9), autoscaled=True)


def test_the_disruption_budget_lets_one_pod_go_at_a_time() -> None:
    pdb = manifests.pod_disruption_budget(fn_ref())
    assert pdb["apiVersion"] == "policy/v1" and pdb["kind"] == "PodDisruptionBudget"
    assert pdb["metadata"]["ownerReferences"] == [fn_ref().owner.reference()]
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": manifests.selector_labels("hello")}}
    assert manifests.PLURALS["PodDisruptionBudget"] == "poddisruptionbudgets"
    assert manifests.PLURALS["ScaledObject"] == "scaledobjects"


def test_a_scaled_deployment_is_ready_at_zero_and_while_it_scales_up() -> None:
    def summary(replicas: int, status: dict[str, Any], *, complete: bool = True, autoscaled: bool = True) -> str:
        annotations = {manifests.ANNOTATION_AUTOSCALED: "true"} if autoscaled else {}
        reason = "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated"
        conditions = [{"type": "Progressing", "status": "True", "reason": reason}]
        body = {"metadata": {"generation": 3, "annotations": annotations}, "spec": {"replicas": replicas},
                "status": {"observedGeneration": 3, "conditions": conditions, **status}}  # fmt: skip
        return deployment_summary(body).rollout()[0]

    assert summary(0, {}) == "ready"
    starting = {"replicas": 3, "updatedReplicas": 3, "availableReplicas": 1}
    assert summary(3, starting) == "ready"  # KEDA scaled up: not a rollout
    assert summary(3, starting, autoscaled=False) == "progressing"
    assert summary(3, starting, complete=False) == "progressing"  # a new template still rolling out
    assert summary(1, {"replicas": 2, "updatedReplicas": 1, "availableReplicas": 1}) == "progressing"  # old pod


def test_a_replicas_change_by_keda_is_no_rollout_but_a_new_template_is() -> None:
    body = {"metadata": {"generation": 5, "annotations": {manifests.ANNOTATION_AUTOSCALED: "true"}},
            "spec": {"replicas": 0},
            "status": {"observedGeneration": 4, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1,
                       "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]}}
    lagging = deployment_summary(body)  # KEDA set replicas 0 (generation 5); the controller has not looked yet
    assert lagging.rollout()[0] == "progressing"  # the operator's template generation unknown: wait
    assert dataclasses.replace(lagging, template_generation=4).rollout()[0] == "ready"  # written at 4: no rollout
    assert dataclasses.replace(lagging, template_generation=5).rollout()[0] == "progressing"  # a new template


def test_the_summary_says_autoscaled_and_spread() -> None:
    dep = manifests.deployment(CONFIG, scaled(max_=4), "img:1", None)
    found = deployment_summary(dep)
    assert found.autoscaled and found.spread
    plain = deployment_summary(manifests.deployment(CONFIG, fn_ref(), "img:1", 1))
    assert not plain.autoscaled and not plain.spread


def _trigger(kind: str = "http", enabled: bool = True) -> TriggerSummary:
    return TriggerSummary(NS, "t", "u", "sless.dev/v1alpha1", kind, "hello", enabled, "", False)


def test_switched_off_is_the_http_rule() -> None:
    assert not switched_off([]) and not switched_off([_trigger("cron", False)])
    assert switched_off([_trigger(enabled=False)])
    assert not switched_off([_trigger(enabled=False), _trigger()])
    assert desired_replicas(3, [_trigger(enabled=False)]) == 0 and desired_replicas(3, [_trigger()]) == 3


class FakeKube:
    """Records writes; GETs answer from a dict of path -> object (None: 404)."""

    def __init__(self, objects: dict[str, Any] | None = None) -> None:
        self.objects = objects or {}
        self.calls: list[tuple[str, str, Any]] = []

    async def get(self, path: str) -> Any:
        self.calls.append(("GET", path, None))
        return self.objects.get(path)

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("POST", path, body))
        if path in self.objects and isinstance(self.objects[path], ApiError):
            raise self.objects[path]
        return body

    async def patch(self, path: str, body: Any, content_type: str = "") -> dict[str, Any]:
        self.calls.append(("PATCH", path, body))
        return dict(body)

    async def delete(self, path: str, propagation: str = "Background") -> bool:
        self.calls.append(("DELETE", path, None))
        return True


def test_a_scaled_deployment_is_created_with_its_first_replicas_and_never_patched_with_any() -> None:
    want = manifests.deployment(CONFIG, scaled(min_=2), "img:1", None)
    kube = FakeKube()
    asyncio.run(children.ensure(kube, want, initial={"replicas": 2}))  # type: ignore[arg-type]
    [(verb, _, body)] = kube.calls
    assert verb == "POST" and body["spec"]["replicas"] == 2
    assert "replicas" not in want["spec"]  # the builder's object is left as it was

    live = json.loads(json.dumps(want))
    live["spec"]["replicas"] = 7  # KEDA's
    live["metadata"]["annotations"][manifests.SPEC_HASH] = "older"
    kube = FakeKube()
    asyncio.run(children.converge(kube, want, live))  # type: ignore[arg-type]
    [(verb, _, patch)] = kube.calls
    assert verb == "PATCH" and "replicas" not in patch["spec"]
    assert not children.needs_update(want, {**live, "metadata": want["metadata"]})  # replicas are not compared


def test_an_update_takes_away_the_autoscaled_mark_and_the_spread_it_no_longer_wants() -> None:
    live = manifests.deployment(CONFIG, scaled(max_=4), "img:1", None)
    want = manifests.deployment(CONFIG, fn_ref(), "img:1", 1)
    kube = FakeKube()
    asyncio.run(children.converge(kube, want, live))  # type: ignore[arg-type]
    [(_, _, patch)] = kube.calls
    assert patch["metadata"]["annotations"][manifests.ANNOTATION_AUTOSCALED] is None
    assert patch["spec"]["replicas"] == 1  # the operator owns them again
    assert patch["spec"]["template"]["spec"][SPREAD] is None
    assert SPREAD not in want["spec"]["template"]["spec"]

    paused = manifests.scaled_object(CONFIG, scaled(), paused=True)
    running = manifests.scaled_object(CONFIG, scaled(), paused=False)
    kube = FakeKube()
    asyncio.run(children.converge(kube, running, paused))  # type: ignore[arg-type]
    [(_, _, patch)] = kube.calls
    assert patch["metadata"]["annotations"][manifests.ANNOTATION_PAUSED_REPLICAS] is None


def _context(kube: FakeKube, config: OperatorConfig = CONFIG) -> Context:
    return Context(config, kube=kube)  # type: ignore[arg-type]


def test_keda_is_discovered_once_and_asked_again_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube({"/apis/keda.sh/v1alpha1": {"resources": [{"name": "scaledjobs"}, {"name": "scaledobjects"}]}})
    clock = [1000.0]
    monkeypatch.setattr(autoscale, "_now", lambda: clock[0])

    async def run() -> None:
        ctx = _context(kube)
        assert await autoscale.keda_installed(ctx)
        assert await autoscale.keda_installed(ctx)
        assert len(kube.calls) == 1  # remembered
        clock[0] += autoscale.PRESENT_RECHECK_SEC + 1
        assert await autoscale.keda_installed(ctx)
        assert len(kube.calls) == 2

        absent = _context(FakeKube(), replace(CONFIG, keda_api_version="keda.example/v1"))
        with pytest.raises(autoscale.KedaMissing, match=r"scaling needs KEDA: scaledobjects\.keda\.example "
                                                        r"\(keda\.example/v1\) is not installed"):  # fmt: skip
            await autoscale.require_keda(absent)
        absent.kube.objects["/apis/keda.example/v1"] = {"resources": [{"name": "scaledobjects"}]}  # type: ignore[attr-defined]
        assert not await autoscale.keda_installed(absent)  # still the remembered answer
        clock[0] += autoscale.ABSENT_RECHECK_SEC + 1
        assert await autoscale.keda_installed(absent)  # installed meanwhile: found

    asyncio.run(run())


def test_a_scaled_object_write_the_apiserver_does_not_serve_means_keda_is_gone() -> None:
    path = "/apis/keda.sh/v1alpha1/namespaces/" + NS + "/scaledobjects"
    kube = FakeKube({path: ApiError(404, "NotFound", "the server could not find the requested resource")})

    async def run() -> None:
        ctx = _context(kube)
        ctx.state.keda = (True, 0.0)
        with pytest.raises(autoscale.KedaMissing):
            await autoscale.ensure_scaled_object(ctx, scaled(), paused=False)
        assert ctx.state.keda is not None and ctx.state.keda[0] is False
        assert not autoscale.applied(ctx, NS, "ScaledObject", "hello")

    asyncio.run(run())


def test_the_scaler_address_and_keda_api_version_settings() -> None:
    default = OperatorConfig.from_env({})
    assert default.scaler_address == "sless-scaler.sless-system.svc:9090"
    assert default.keda_api_version == "keda.sh/v1alpha1"
    config = OperatorConfig.from_env({"SLESS_SCALER_ADDRESS": "10.0.0.7:7000", "SLESS_KEDA_API_VERSION": "k.io/v2"})
    assert (config.scaler_address, config.keda_api_version) == ("10.0.0.7:7000", "k.io/v2")
    assert OperatorConfig.from_env({"SLESS_SCALER_ADDRESS": "[fd00::1]:9090"}).scaler_address == "[fd00::1]:9090"
    for name, value in (("SLESS_SCALER_ADDRESS", "no-port"), ("SLESS_SCALER_ADDRESS", "host:99999"),
                        ("SLESS_KEDA_API_VERSION", "keda.sh"), ("SLESS_KEDA_API_VERSION", "Keda/v1")):  # fmt: skip
        with pytest.raises(ConfigError, match=name):
            OperatorConfig.from_env({name: value})
