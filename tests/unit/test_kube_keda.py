"""The API's check for KEDA (``kube.keda``): discovery's answer, kept for a minute, failures not kept."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from sless_api.backends.kube.keda import MISSING, RECHECK_SEC, KedaCheck
from sless_api.domain.errors import Unavailable, Unsupported


class FakeKube:
    """``call_raw`` and ``custom.get_api_resources``: each discovery answers the next of ANSWERS."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, str]] = []
        self.custom = self

    def get_api_resources(self, group: str, version: str) -> Any:
        self.asked.append((group, version))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def call_raw(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


SERVED = {"resources": [{"name": "scaledjobs"}, {"name": "scaledobjects"}, {"name": "scaledobjects/status"}]}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def check(kube: FakeKube, clock: Clock) -> KedaCheck:
    return KedaCheck(kube, clock=clock)  # type: ignore[arg-type]


def test_a_cluster_serving_scaledobjects_has_keda_and_is_asked_once_a_minute() -> None:
    kube, clock = FakeKube(SERVED, ApiException(status=404)), Clock()
    keda = check(kube, clock)
    assert asyncio.run(keda.available()) is True
    clock.now += RECHECK_SEC - 1
    asyncio.run(keda.require())
    assert kube.asked == [("keda.sh", "v1alpha1")]
    clock.now += 1  # a minute on: asked again, and KEDA is gone
    with pytest.raises(Unsupported) as refused:
        asyncio.run(keda.require())
    assert refused.value.status == 422 and refused.value.message == MISSING
    assert refused.value.details == {"field": "scale"}
    assert "KEDA" in MISSING and len(kube.asked) == 2


def test_a_group_without_scaledobjects_is_no_keda() -> None:
    keda = check(FakeKube({"resources": [{"name": "scaledjobs"}]}), Clock())
    assert asyncio.run(keda.available()) is False


def test_a_failed_discovery_is_a_503_and_not_remembered() -> None:
    kube, clock = FakeKube(ApiException(status=500), SERVED), Clock()
    keda = check(kube, clock)
    with pytest.raises(Unavailable):
        asyncio.run(keda.require())
    asyncio.run(keda.require())  # asked again at once
    assert len(kube.asked) == 2
