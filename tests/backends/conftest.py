"""One platform, two backends: the fixtures that put either behind the same REST API.

``backend`` is parametrized over

- ``standalone``: ``sless up`` as a real process (functions really build and run);
- ``kubernetes``: the API process with ``SLESS_BACKEND=kubernetes`` on the Kubernetes test bed, its
  code in a real S3 server, and a real ``sless-operator`` process reconciling what the API writes.
  kwok runs no containers: builds and job pods "succeed" without running anything, and a routable
  function answers 502. Cases that need a function to really run are marked ``needs_running`` and
  run only on the backends in RUNS_FUNCTIONS.

Both backends get the same RabbitMQ, so event triggers are accepted by both.

The kubernetes backend's operator serves every namespace matching one glob: each tenant of the
suite is given a ``sub`` whose namespace starts with ``sless-c0fe`` (found by trying subs; one in
65536 hashes does), so one operator process serves every test without touching the namespaces of
other test modules' operators.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.backends import NAMESPACE_PREFIX, Backend
from tests.support.kube_api import KubeApi, start_api
from tests.support.kube_operator import Operator
from tests.support.platform import SlessProcess, Tenant, start_sless
from tests.support.services import S3Endpoint, free_port
from tests.support.testbed import Testbed

BACKENDS = ("standalone", "kubernetes")
RUNS_FUNCTIONS = ("standalone",)  # kwok runs no containers


def _standalone(tmp: Path, rabbitmq_url: str, host_port: int) -> Iterator[Backend]:
    # Functions have a network namespace of their own: of the host's loopback they reach this API's port and
    # HOST_PORT only, where a test runs a service for them to call.
    sp: SlessProcess = start_sless(tmp, {"SLESS_RABBITMQ_URL": rabbitmq_url,
                                         "SLESS_SANDBOX_HOST_PORTS": str(host_port)})
    try:
        yield Backend("standalone", sp.url, True, 180)
    finally:
        code = sp.stop()
        assert code == 0, f"sless up did not stop cleanly ({code}):\n{sp.log_tail()}"


def _kubernetes(bed: Testbed, s3: S3Endpoint, tmp: Path, rabbitmq_url: str) -> Iterator[Backend]:
    api: KubeApi = start_api(bed, s3, tmp / "api", extra_env={"SLESS_RABBITMQ_URL": rabbitmq_url})
    build_ns = f"sless-build-{secrets.token_hex(4)}"
    op = Operator(bed, f"{NAMESPACE_PREFIX}*", build_ns, tmp, extra_env=s3.env()).start()
    backend = Backend("kubernetes", api.url, False, 120, bed, build_ns)
    try:
        yield backend
    finally:
        op.stop()
        clean = api.stop()
        api.gate.close()
        backend.release()
        bed.kubectl("delete", "namespace", build_ns, "--wait=false", "--ignore-not-found", check=False)
        assert clean, f"the API did not stop cleanly ({api.proc.returncode}):\n{api.log_tail()}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every case on both backends; one marked ``needs_running`` only where functions really run."""
    if "backend" not in metafunc.fixturenames:
        return
    running_only = metafunc.definition.get_closest_marker("needs_running") is not None
    names = [b for b in BACKENDS if not running_only or b in RUNS_FUNCTIONS]
    metafunc.parametrize("backend", names, indirect=True, scope="module")


@pytest.fixture(scope="module")
def host_service_port() -> int:
    """A host loopback port that functions may reach (SLESS_SANDBOX_HOST_PORTS): a test's service binds it."""
    return free_port()


@pytest.fixture(scope="module")
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            rabbitmq_url: str, host_service_port: int) -> Iterator[Backend]:
    tmp = tmp_path_factory.mktemp(f"backend-{request.param}")
    if request.param == "standalone":
        yield from _standalone(tmp, rabbitmq_url, host_service_port)
    else:
        bed: Testbed = request.getfixturevalue("k8s_testbed")
        s3: S3Endpoint = request.getfixturevalue("s3_endpoint")
        yield from _kubernetes(bed, s3, tmp, rabbitmq_url)


@pytest.fixture
def tenant(backend: Backend, request: pytest.FixtureRequest) -> Iterator[Tenant]:
    """A fresh tenant (and any made during the test: all are removed after it)."""
    yield backend.tenant(request.node.originalname[:20].replace("_", "-"))
    backend.release()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The kubernetes parameter needs the test bed: mark it, so ``-m "not k8s"`` leaves it out."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("backend") == "kubernetes":
            item.add_marker(pytest.mark.k8s)
