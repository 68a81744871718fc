"""A tenant's count limits on ``sless up`` (SLESS_TENANT_MAX_FUNCTIONS, _TRIGGERS, _JOBS): a create beyond them is a
403 that says which limit and how many are in use, as Kubernetes' ResourceQuota answers through the API; other
tenants keep their own; deleting makes room; a taken name is still a 409, whatever the count."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.platform import SlessProcess, Tenant, running_sless

pytestmark = [pytest.mark.e2e]

LIMITS = {"SLESS_TENANT_MAX_FUNCTIONS": "2", "SLESS_TENANT_MAX_TRIGGERS": "1", "SLESS_TENANT_MAX_JOBS": "1"}


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlessProcess]:
    with running_sless(Path(tmp_path_factory.mktemp("tenant-limits")), LIMITS) as sp:
        yield sp


def function(tenant: Tenant, name: str, expect: int | tuple[int, ...] = 201) -> dict[str, object]:
    resp = tenant.api("POST", "/functions", json={"name": name, "runtime": "python3.11"}, expect=expect)
    body: dict[str, object] = resp.json()
    return body


def test_functions_beyond_the_limit_are_refused_with_what_is_in_use(platform: SlessProcess) -> None:
    tenant = Tenant(platform.url, "limited-functions")
    function(tenant, "one")
    function(tenant, "two")
    refused = function(tenant, "three", expect=403)
    assert refused["quota"] == "functions" and (refused["limit"], refused["used"], refused["requested"]) == (2, 2, 1)
    assert "SLESS_TENANT_MAX_FUNCTIONS" in str(refused["error"]) and "'three'" in str(refused["error"])
    assert function(tenant, "one", expect=409)["existing"]  # a taken name is a conflict, not the limit
    assert [f["name"] for f in tenant.api("GET", "/functions", expect=200).json()["items"]] == ["one", "two"]
    function(Tenant(platform.url, "limited-neighbour"), "three")  # another tenant has a limit of its own
    tenant.api("DELETE", "/functions/two", expect=204)
    function(tenant, "three")  # deleting made room


def test_creates_racing_for_the_last_place_let_exactly_one_in(platform: SlessProcess) -> None:
    tenant = Tenant(platform.url, "limited-race")
    function(tenant, "first")
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: tenant.api("POST", "/functions", json={
            "name": f"racer-{i}", "runtime": "python3.11"}).status_code, range(8)))  # fmt: skip
    assert sorted(answers) == [201] + [403] * 7


def test_triggers_and_jobs_have_their_own_limits(platform: SlessProcess) -> None:
    tenant = Tenant(platform.url, "limited-kinds")
    function(tenant, "fn")
    tenant.api("POST", "/triggers", json={"name": "cron-a", "type": "cron", "function": "fn",
                                          "schedule": "0 3 * * *"}, expect=201)  # fmt: skip
    refused = tenant.api("POST", "/triggers", json={"name": "cron-b", "type": "cron", "function": "fn",
                                                    "schedule": "0 4 * * *"}, expect=403).json()  # fmt: skip
    assert (refused["quota"], refused["limit"], refused["used"]) == ("triggers", 1, 1)
    assert "SLESS_TENANT_MAX_TRIGGERS" in refused["error"]
    tenant.api("POST", "/jobs", json={"name": "job-a", "function": "fn", "run_id": 0}, expect=201)
    refused = tenant.api("POST", "/jobs", json={"name": "job-b", "function": "fn", "run_id": 0}, expect=403).json()
    assert (refused["quota"], refused["limit"], refused["used"]) == ("jobs", 1, 1)
    tenant.api("DELETE", "/jobs/job-a", expect=204)
    tenant.api("POST", "/jobs", json={"name": "job-b", "function": "fn", "run_id": 0}, expect=201)
