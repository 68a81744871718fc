"""Fixtures for tests against the Kubernetes test bed: CRDs, tenant namespaces, the operator.

- ``sless_crds``: the chart's CRDs applied once per session (``charts/sless/crds``).
- ``tenant``: a fresh namespace shaped like a tenant's (``sless-<16 hex>``), removed afterwards
  with the finalizers of our resources cleared (the operator may be stopped by then).
- ``operator``: a real ``sless-operator`` process serving that namespace and its own build
  namespace, so tests never see each other's operators; it can be killed and restarted.
- ``kube_api``: the API process on the kubernetes backend, one per test module that uses it.
- ``pod_outcome``: a kwok Stage from ``tests/testbed/stages/sless-pod-outcome.yaml`` that makes
  Running pods with given labels terminate with a chosen exit code and termination message.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kube_api import KubeApi, start_api
from tests.support.kube_operator import CRDS, SLESS_KINDS, Operator, Sless, strip_finalizers
from tests.support.quotas import wait_counted
from tests.support.services import S3Endpoint
from tests.support.stages import render_stage
from tests.support.testbed import Testbed


@pytest.fixture(scope="session")
def sless_crds(k8s_testbed: Testbed) -> Testbed:
    """The CRDs of charts/sless/crds, applied and Established."""
    k8s_testbed.kubectl("apply", "-f", str(CRDS))
    k8s_testbed.wait_established(*SLESS_KINDS)
    wait_counted(k8s_testbed)  # the tenant quota counts them
    return k8s_testbed


@pytest.fixture
def tenant(sless_crds: Testbed) -> Iterator[str]:
    """A fresh tenant-shaped namespace."""
    bed = sless_crds
    name = f"sless-{secrets.token_hex(8)}"
    bed.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        strip_finalizers(bed, name)
        bed.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def operator(sless_crds: Testbed, tenant: str, tmp_path: Path) -> Iterator[Operator]:
    """A running operator for the ``tenant`` namespace (stopped and its build namespace removed after)."""
    bed = sless_crds
    build_ns = f"sless-build-{secrets.token_hex(4)}"
    op = Operator(bed, tenant, build_ns, tmp_path).start()
    try:
        yield op
    finally:
        op.stop()
        if os.environ.get("SLESS_KEEP_OPERATOR_LOGS"):
            print(op.log_tail(400))
        bed.kubectl("delete", "namespace", build_ns, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def pod_outcome(k8s_testbed: Testbed) -> Iterator[Callable[..., str]]:
    """``pod_outcome(labels=..., namespace=..., succeed=..., message=...)`` -> the Stage's name."""
    created: list[str] = []

    def make(**kwargs: Any) -> str:
        name = f"sless-outcome-{secrets.token_hex(4)}"
        k8s_testbed.apply(render_stage(name, **kwargs))
        created.append(name)
        return name

    try:
        yield make
    finally:
        for name in created:
            k8s_testbed.delete_stage(name)


@pytest.fixture
def sless(operator: Operator, tenant: str, sless_crds: Testbed) -> Sless:
    return Sless(sless_crds, tenant, operator)


@pytest.fixture(scope="module")
def kube_api(k8s_testbed: Testbed, s3_endpoint: S3Endpoint,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApi]:
    """The API process on the kubernetes backend, one per test module that asks (tests/support/kube_api.py)."""
    api = start_api(k8s_testbed, s3_endpoint, tmp_path_factory.mktemp("kube-api"))
    yield api
    clean = api.stop()
    api.gate.close()
    assert clean, f"the API did not stop cleanly ({api.proc.returncode}):\n{api.log_tail()}"
