"""Concurrency limits at `/fn` on `sless up`: a function's max_concurrency and the tenant's, a short queue, then 429."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support.platform import SlessProcess, Tenant, running_sless

pytestmark = pytest.mark.e2e

LIMITS = {"SLESS_TENANT_MAX_CONCURRENCY": "3", "SLESS_CONCURRENCY_QUEUE_MAX": "1",
          "SLESS_CONCURRENCY_QUEUE_WAIT_SEC": "4"}
SLOW = "import time\ndef handle(event):\n    time.sleep(1.5)\n    return {'ok': True}\n"


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlessProcess]:
    with running_sless(Path(tmp_path_factory.mktemp("limits")), LIMITS) as sp:
        yield sp


def at_once(urls: list[str]) -> list[requests.Response]:
    with concurrent.futures.ThreadPoolExecutor(len(urls)) as pool:
        return list(pool.map(lambda url: requests.get(url, timeout=60), urls))


def test_a_function_limit_queues_one_and_refuses_the_next(platform: SlessProcess) -> None:
    tenant = Tenant(platform.url, "limited-fn")
    tenant.deploy("one-at-a-time", "python3.11", {"handler.py": SLOW}, max_concurrency=1)
    answers = at_once([tenant.fn_url("one-at-a-time")] * 3)
    assert sorted(a.status_code for a in answers) == [200, 200, 429], [a.text for a in answers]
    [refused] = [a for a in answers if a.status_code == 429]
    assert refused.headers["Retry-After"] == "4" and "max_concurrency of 1" in refused.json()["error"]
    records = tenant.api("GET", "/functions/one-at-a-time/invocations", expect=200).json()["items"]
    assert all(r["status"] in (200, 429) for r in records)


def test_the_tenant_limit_spans_its_functions(platform: SlessProcess) -> None:
    tenant = Tenant(platform.url, "limited-tenant")
    for name in ("left", "right"):
        tenant.deploy(name, "python3.11", {"handler.py": SLOW})
    answers = at_once([tenant.fn_url("left")] * 3 + [tenant.fn_url("right")] * 2)
    assert sorted(a.status_code for a in answers) == [200, 200, 200, 200, 429], [a.text for a in answers]
    assert "the tenant has its 3 calls in flight" in next(a for a in answers if a.status_code == 429).json()["error"]
    other = Tenant(platform.url, "unlimited-neighbour")  # another tenant has its own budget
    other.deploy("free", "python3.11", {"handler.py": SLOW})
    assert [a.status_code for a in at_once([other.fn_url("free")] * 3)] == [200, 200, 200]


@pytest.mark.parametrize("bad", [-1, 1001, "2", True, 1.5, None])
def test_max_concurrency_is_validated(platform: SlessProcess, bad: object) -> None:
    tenant = Tenant(platform.url, "limit-input")
    tenant.api("POST", "/ensure", expect=(200, 201))
    answer = tenant.api("POST", "/functions", json={"name": "f", "runtime": "python3.11", "max_concurrency": bad},
                        expect=400).json()
    assert answer["field"] == "max_concurrency"


def test_max_concurrency_is_kept_and_changed(platform: SlessProcess) -> None:
    tenant = Tenant(platform.url, "limit-update")
    tenant.api("POST", "/ensure", expect=(200, 201))
    created = tenant.api("POST", "/functions", json={"name": "g", "runtime": "python3.11"}, expect=201).json()
    assert created["max_concurrency"] == 0
    updated = tenant.api("PUT", "/functions/g", json={"max_concurrency": 7}, expect=200).json()
    assert updated["max_concurrency"] == 7
    assert tenant.api("GET", "/functions/g", expect=200).json()["max_concurrency"] == 7
