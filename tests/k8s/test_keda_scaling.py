"""A scaled Function with a real KEDA on kwok: its ScaledObject gets an HPA, reported load sets the replicas.

Nothing stands in for KEDA here: the operator writes the ScaledObject, KEDA's operator makes the HPA and asks
``sless-scaler`` (a real process) through its external-push trigger, the HPA controller reads the metric through
KEDA's adapter and the aggregator and scales the Deployment, and kwok runs the pods. The load is what an API
process reports: a :class:`LoadReporter` in this test says how many calls the function has in flight.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sless_api.services.scaling.reporter import LoadReporter
from tests.support import scaler
from tests.support.keda import Keda, condition
from tests.support.kube_operator import Operator, Sless
from tests.support.poll import holds
from tests.support.testbed import Testbed

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

#: HPA syncs every 15 s on the bed, KEDA polls every 10 s: scaling takes tens of seconds.
SCALING_TIMEOUT = 150


class ReportedLoad:
    """A LoadReporter on a loop of its own, reporting N calls in flight for one function until told otherwise."""

    def __init__(self, address: str, namespace: str, function: str) -> None:
        self.address, self.namespace, self.function = address, namespace, function
        self.loop = asyncio.new_event_loop()
        self.reporter: LoadReporter | None = None
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._in_flight = 0
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        self.reporter = LoadReporter(self.address, scaler.TOKEN, f"test-{secrets.token_hex(4)}", interval=0.5)
        await self.reporter.start()

    def set(self, in_flight: int) -> None:
        def apply() -> None:
            assert self.reporter is not None
            while self._in_flight < in_flight:
                self.reporter.begin(self.namespace, self.function)
                self._in_flight += 1
            while self._in_flight > in_flight:
                self.reporter.end(self.namespace, self.function)
                self._in_flight -= 1

        self.loop.call_soon_threadsafe(apply)

    def close(self) -> None:
        if self.reporter is not None:
            asyncio.run_coroutine_threadsafe(self.reporter.aclose(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def elastic(keda: Keda, sless_crds: Testbed, tenant: str, tmp_path: Path) -> Iterator[tuple[Sless, ReportedLoad]]:
    with scaler.running(tmp_path) as scaling:
        build_ns = f"sless-build-{secrets.token_hex(4)}"
        op = Operator(sless_crds, tenant, build_ns, tmp_path, extra_env={"SLESS_SCALER_ADDRESS": scaling.address})
        op.start()
        load = ReportedLoad(scaling.address, tenant, "web")
        try:
            yield Sless(sless_crds, tenant, op), load
        finally:
            load.close()
            op.stop()
            sless_crds.kubectl("delete", "namespace", build_ns, "--wait=false", "--ignore-not-found", check=False)


def replicas(sless: Sless, name: str) -> int:
    return int(((sless.get("deployment", name) or {}).get("spec") or {}).get("replicas", -1))


def test_reported_load_scales_a_function_out_and_back_to_zero_and_the_operator_keeps_out(
        elastic: tuple[Sless, ReportedLoad], keda: Keda) -> None:
    sless, load = elastic
    sless.function("web", scale={"min": 0, "max": 4, "target": 2, "idleSec": 5})
    sless.wait_phase("Function", "web", "Ready")

    def scaled_object_ready() -> dict[str, Any] | None:
        obj = keda.scaled_object(sless.ns, "web")
        ready = condition(obj, "Ready")
        return obj if ready and ready["status"] == "True" else None

    sless.op.wait("KEDA took the ScaledObject", scaled_object_ready, timeout=60)
    hpa = sless.op.wait("KEDA's HPA", lambda: keda.hpa(sless.ns, "web"), timeout=60)
    assert hpa["spec"]["scaleTargetRef"]["name"] == "web" and hpa["spec"]["maxReplicas"] == 4

    load.set(6)  # 6 calls in flight at 2 per pod: 3 pods
    sless.op.wait("3 replicas for 6 calls in flight", lambda: replicas(sless, "web") == 3, SCALING_TIMEOUT)
    metric = keda.external_metric(sless.ns, "web", hpa["spec"]["metrics"][0]["external"]["metric"]["name"])
    assert metric == 6, keda.log_tails()

    sless.patch_spec("Function", "web", envVars={"GREETING": "hi"})  # a reconcile that rolls the Deployment
    sless.wait_phase("Function", "web", "Ready")
    holds("the operator leaves KEDA's replicas", lambda: replicas(sless, "web") == 3, 5,
          "the reconcile that rolled the new env is over; a replicas write would come within its run")

    load.set(0)
    sless.op.wait("back to zero once idle", lambda: replicas(sless, "web") == 0, SCALING_TIMEOUT)
