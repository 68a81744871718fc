"""The attacker's walk over every route of the kubernetes backend's API (the same walk as on `sless up`)."""

from __future__ import annotations

import time
import uuid

import jwt
import pytest

from tests.support.attack import VICTIM_FUNCTION, VICTIM_JOB, raw_request, walk
from tests.support.kube_api import HELLO, KubeApi
from tests.support.platform import SECRET

pytestmark = pytest.mark.k8s


def test_every_route_denies_an_attacker_however_the_path_is_spelled(kube_api: KubeApi) -> None:
    victim = kube_api.tenant("victim")
    victim.api("POST", "/ensure", expect=201)
    mark = f"mark-{uuid.uuid4()}"
    victim.api("POST", "/functions", json={"name": VICTIM_FUNCTION, "runtime": "python3.11",
                                           "env_vars": {"SECRET_MARK": mark}}, expect=201)
    victim.upload(VICTIM_FUNCTION, HELLO)
    victim.api("POST", "/triggers", json={"name": VICTIM_FUNCTION, "type": "http", "function": VICTIM_FUNCTION},
               expect=201)
    victim.api("POST", "/jobs", json={"name": VICTIM_JOB, "function": VICTIM_FUNCTION, "run_id": 0}, expect=201)
    assert walk(kube_api.url, victim, mark) > 1000


@pytest.mark.parametrize("namespace", ["default", "kube-system", "sless-system", "..", "sless-0123456789ABCDEF"])
def test_admins_cannot_leave_tenant_namespaces(kube_api: KubeApi, namespace: str) -> None:
    token = jwt.encode({"sub": "root", "exp": int(time.time()) + 600, "sless_admin": True}, SECRET, "HS256")
    for method, suffix in (("POST", "/ensure"), ("GET", "/functions"), ("POST", "/functions")):
        answer = raw_request(kube_api.url, method, f"/v1/namespaces/{namespace}{suffix}",
                             {"Authorization": f"Bearer {token}"}, b'{"name": "x", "runtime": "python3.11"}')
        assert answer.status in (400, 404), (namespace, suffix, answer.status, answer.body[:200])
