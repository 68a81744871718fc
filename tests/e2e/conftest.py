"""One `sless up` process shared by the end-to-end tests of a session (each test uses its own tenant)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.platform import SlessProcess, Tenant, start_sless

_tenants = itertools.count()


@pytest.fixture(scope="session")
def sless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlessProcess]:
    sp = start_sless(Path(tmp_path_factory.mktemp("sless-e2e")))
    yield sp
    code = sp.stop()
    assert code == 0, f"sless up did not stop cleanly ({code}):\n{sp.log_tail()}"


@pytest.fixture
def tenant(sless: SlessProcess, request: pytest.FixtureRequest) -> Tenant:
    return Tenant(sless.url, f"tenant-{request.node.name}-{next(_tenants)}", platform_log=sless.log_of)


@pytest.fixture
def other_tenant(sless: SlessProcess) -> Tenant:
    return Tenant(sless.url, f"other-{next(_tenants)}", platform_log=sless.log_of)
