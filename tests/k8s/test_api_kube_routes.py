"""The invoke proxy on the Kubernetes backend: routes from watches, no API server request per call.

kwok runs no containers and the test machine has no cluster DNS, so a routable function's Service
(``http://<fn>.<ns>.svc.cluster.local:8080``) is unreachable from here: a routable function answers
502 ("function unreachable"), one that is not routable 404. That difference is what these tests
observe; a real round trip to a function pod is not possible on this test bed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from sless_core import crd
from tests.support.kube_api import READY, KubeApi, cr, invoke, seconds_until, set_status, start_api, status_is
from tests.support.platform import Tenant
from tests.support.poll import holds, until
from tests.support.services import S3Endpoint
from tests.support.testbed import Testbed

pytestmark = pytest.mark.k8s


@pytest.fixture(scope="module")
def routes_api(k8s_testbed: Testbed, s3_endpoint: S3Endpoint,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApi]:
    # Long watches: within a test, the only requests the API sends are the ones the test causes.
    api = start_api(k8s_testbed, s3_endpoint, tmp_path_factory.mktemp("kube-routes"),
                    {"SLESS_KUBE_WATCH_TIMEOUT_SEC": "600"})
    yield api
    clean = api.stop()
    api.gate.close()
    assert clean, f"the API did not stop cleanly ({api.proc.returncode}):\n{api.log_tail()}"


def routable_function(api: KubeApi, name: str = "web") -> Tenant:
    t = api.tenant()
    t.api("POST", "/functions", json={"name": name, "runtime": "python3.11", "timeout_sec": 5}, expect=201)
    t.api("POST", "/triggers", json={"name": name, "type": "http", "function": name}, expect=201)
    set_status(api.bed, crd.FUNCTION_PLURAL, t.ns, name, READY)
    seconds_until("route appears", status_is(t, name, 502))
    return t


def test_route_follows_ready_and_trigger_state(routes_api: KubeApi) -> None:
    api, bed = routes_api, routes_api.bed
    t = api.tenant()
    t.api("POST", "/functions", json={"name": "web", "runtime": "python3.11"}, expect=201)
    # the route table learns of the new Function from its watch a few milliseconds later
    seconds_until("the new Function is known", status_is(t, "web", 404, "not ready (phase Pending)"))
    t.api("POST", "/triggers", json={"name": "web", "type": "http", "function": "web"}, expect=201)
    assert invoke(t, "web").status_code == 404

    timings: dict[str, float] = {}
    set_status(bed, crd.FUNCTION_PLURAL, t.ns, "web", READY)
    timings["Ready -> routed"] = seconds_until("Ready routes", status_is(t, "web", 502))
    resp = invoke(t, "web")
    assert resp.json()["error"].startswith("function unreachable")  # the Service, not the route, is missing
    assert resp.headers["content-type"] == "application/json"

    t.api("PATCH", "/triggers/web", json={"enabled": False}, expect=200)
    timings["disabled -> 404"] = seconds_until("disable unroutes", status_is(t, "web", 404, "no enabled http trigger"))
    t.api("PATCH", "/triggers/web", json={"enabled": True}, expect=200)
    timings["enabled -> routed"] = seconds_until("enable routes", status_is(t, "web", 502))

    # a rebuild keeps the deployed version routable; a function with nothing deployed is not
    set_status(bed, crd.FUNCTION_PLURAL, t.ns, "web", {"phase": "Building", "message": "building"})
    holds("a Building function with a deployed version stays routed", lambda: invoke(t, "web").status_code == 502,
          for_sec=1.0, why="the route table learns of a status change from its watch a few milliseconds later "
          "(the timings printed here are well under a second on the bed); 1 s is longer than that")
    set_status(bed, crd.FUNCTION_PLURAL, t.ns, "web", {"phase": "Failed", "image": None, "message": "boom"})
    timings["Failed -> 404"] = seconds_until("Failed unroutes", status_is(t, "web", 404, "not ready (phase Failed)"))
    set_status(bed, crd.FUNCTION_PLURAL, t.ns, "web", READY)
    seconds_until("Ready again", status_is(t, "web", 502))

    t.api("DELETE", "/triggers/web", expect=204)
    timings["trigger deleted -> 404"] = seconds_until("trigger delete unroutes", status_is(t, "web", 404))
    t.api("POST", "/triggers", json={"name": "web2", "type": "http", "function": "web"}, expect=201)
    seconds_until("new trigger routes", status_is(t, "web", 502))
    t.api("DELETE", "/functions/web", expect=204)
    timings["function deleted -> 404"] = seconds_until("delete unroutes", status_is(t, "web", 404, "not found"))
    print("route table latency (s):", json.dumps({k: round(v, 3) for k, v in timings.items()}))
    assert all(v < 10 for v in timings.values()), timings


def test_a_function_edited_past_the_platforms_rules_is_refused_everywhere_but_delete(routes_api: KubeApi) -> None:
    """kubectl accepts what the CRD schema allows; the codec the API, proxy and operator share refuses the rest."""
    api, bed = routes_api, routes_api.bed
    t = routable_function(api, "edited")
    t.api("POST", "/functions", json={"name": "fine", "runtime": "python3.11"}, expect=201)
    bed.kubectl("patch", f"{crd.FUNCTION_PLURAL}.{crd.GROUP}", "edited", "-n", t.ns, "--type=merge",
                "-p", json.dumps({"spec": {"envVars": {"PORT": "1"}}}))  # the schema allows it: no rule for names
    seconds_until("the edit unroutes", status_is(t, "edited", 404, "is invalid: spec.envVars"))
    body = t.api("GET", "/functions/edited", expect=409).json()
    assert "invalid as stored" in body["error"] and body["field"] == "spec.envVars", body
    assert [f["name"] for f in t.api("GET", "/functions", expect=200).json()["items"]] == ["fine"]
    t.api("PUT", "/functions/edited", json={"memory_mb": 256}, expect=409)
    bed.kubectl("patch", f"{crd.FUNCTION_PLURAL}.{crd.GROUP}", "edited", "-n", t.ns, "--type=json",
                "-p", json.dumps([{"op": "remove", "path": "/spec/envVars/PORT"}]))
    seconds_until("valid again, routed again", status_is(t, "edited", 502))
    bed.kubectl("patch", f"{crd.FUNCTION_PLURAL}.{crd.GROUP}", "edited", "-n", t.ns, "--type=merge",
                "-p", json.dumps({"spec": {"entrypoint": "handler.handle", "runtime": "go1.23"}}))
    seconds_until("a Python entrypoint on Go unroutes", status_is(t, "edited", 404, "spec.entrypoint"))
    t.api("DELETE", "/functions/edited", expect=204)
    assert cr(bed, crd.FUNCTION_PLURAL, t.ns, "edited") is None


def test_invocations_cost_no_api_server_requests(routes_api: KubeApi) -> None:
    api = routes_api
    t = routable_function(api, "counted")
    seen = [-1]

    def quiet() -> bool:
        """No byte went to the API server since the previous probe: the set-up's requests are done."""
        now, previous = api.gate.bytes_up, seen[0]
        seen[0] = now
        return now == previous

    until("the set-up's requests to the API server done", quiet, timeout=10, interval=0.5)
    before = api.gate.bytes_up
    for _ in range(50):
        assert invoke(t, "counted").status_code == 502
    assert invoke(t, "unknown").status_code == 404
    holds("no request to the API server after the invocations", lambda: api.gate.bytes_up == before, for_sec=0.5,
          why="a request an invocation caused would be sent while it is handled or right after (a lookup, a "
          "status write); the invocations are done, and 0.5 s is ample for one such request to go through the gate")
    # the counter does count: one REST read is one request through the gate
    t.api("GET", "/functions/counted", expect=200)
    assert api.gate.bytes_up > before


def test_routing_answers_from_memory_while_the_api_server_is_away(routes_api: KubeApi) -> None:
    api, bed = routes_api, routes_api.bed
    t = routable_function(api, "steady")
    api.gate.cut()
    try:
        for _ in range(20):
            assert invoke(t, "steady").status_code == 502
        assert invoke(t, "nope").status_code == 404
        # the REST API cannot reach the cluster: a JSON 503, never a 500
        for method, rest, body in (("GET", "/functions", None), ("GET", "/functions/steady", None),
                                   ("POST", "/functions", {"name": "x", "runtime": "python3.11"}),
                                   ("PATCH", "/triggers/steady", {"enabled": False})):
            resp = t.api(method, rest, json=body)
            assert resp.status_code == 503, (method, rest, resp.status_code, resp.text)
            assert "Kubernetes API is unreachable" in resp.json()["error"]
        # a change the API cannot see yet: it keeps serving what it knew
        set_status(bed, crd.FUNCTION_PLURAL, t.ns, "steady", {"phase": "Failed", "image": None})
        holds("the route kept while the API server is away", lambda: invoke(t, "steady").status_code == 502,
              for_sec=1.0, why="with the watch up a Failed status unroutes within milliseconds (the first test's "
              "timings); the watch is cut, so nothing may change, and 1 s is far longer than that update takes")
    finally:
        api.gate.restore()
    # back: the watch reconnects (backoff) and relists, and the missed change arrives
    took = seconds_until("watch recovers", status_is(t, "steady", 404, "not ready (phase Failed)"), timeout=60)
    print(f"route table caught up {took:.1f}s after the API server came back")
    t.api("GET", "/functions/steady", expect=200)


def test_token_triggers_need_a_token_of_the_tenant(routes_api: KubeApi) -> None:
    api = routes_api
    t = api.tenant()
    t.api("POST", "/functions", json={"name": "private", "runtime": "python3.11"}, expect=201)
    t.api("POST", "/triggers", json={"name": "private", "type": "http", "function": "private", "auth": "token"},
          expect=201)
    set_status(api.bed, crd.FUNCTION_PLURAL, t.ns, "private", READY)
    seconds_until("route appears", lambda: invoke(t, "private").status_code == 401)
    assert invoke(t, "private", token="not-a-jwt").status_code == 401
    assert invoke(t, "private", token=api.tenant("other").token).status_code == 403
    assert invoke(t, "private", token=t.token).status_code == 502


def _limited_kubeconfig(bed: Testbed, namespace: str, dest: Path) -> Path:
    """Credentials that may manage sless resources in NAMESPACE only (no cluster-wide list/watch)."""
    sa_ns = "sless-api-limited"
    if bed.get("namespace", sa_ns) is None:
        bed.kubectl("create", "namespace", sa_ns)
    rules: list[dict[str, Any]] = [{"apiGroups": [crd.GROUP], "verbs": ["*"],
                                    "resources": ["functions", "triggers", "functionjobs"]}]
    bed.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "api", "namespace": sa_ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "sless-api-limited-namespaces"},
         "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "create", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "sless-api-limited-namespaces"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "sless-api-limited-namespaces"},
         "subjects": [{"kind": "ServiceAccount", "name": "api", "namespace": sa_ns}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "sless-api", "namespace": namespace}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "sless-api", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "sless-api"},
         "subjects": [{"kind": "ServiceAccount", "name": "api", "namespace": sa_ns}]},
    )
    token = bed.kubectl("create", "token", "api", "-n", sa_ns, "--duration=1h").stdout.strip()
    config = yaml.safe_load(bed.kubeconfig.read_text())
    config["users"] = [{"name": "limited", "user": {"token": token}}]
    for ctx in config["contexts"]:
        ctx["context"]["user"] = "limited"
    dest.write_text(json.dumps(config))
    return dest


def test_without_cluster_wide_access_routes_come_from_per_namespace_watches(
        k8s_testbed: Testbed, s3_endpoint: S3Endpoint, tmp_path: Path) -> None:
    bed = k8s_testbed
    probe = Tenant("http://unused", f"limited-{time.monotonic_ns()}")
    bed.apply({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": probe.ns, "labels": {"sless.dev/tenant": "true",
                                                         crd.LABEL_MANAGED: crd.MANAGED_BY}}})
    kubeconfig = _limited_kubeconfig(bed, probe.ns, tmp_path / "limited.kubeconfig")
    denied = bed.kubectl("--kubeconfig", str(kubeconfig), "get", f"functions.{crd.GROUP}", "-A", check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()  # the premise of this test
    api = start_api(bed, s3_endpoint, tmp_path / "api", kubeconfig=kubeconfig)
    try:
        t = Tenant(api.url, probe.sub)
        t.api("POST", "/ensure", expect=200)
        t.api("POST", "/functions", json={"name": "scoped", "runtime": "python3.11"}, expect=201)
        t.api("POST", "/triggers", json={"name": "scoped", "type": "http", "function": "scoped"}, expect=201)
        set_status(bed, crd.FUNCTION_PLURAL, t.ns, "scoped", READY)
        seconds_until("route appears", status_is(t, "scoped", 502), timeout=30)
        t.api("PATCH", "/triggers/scoped", json={"enabled": False}, expect=200)
        seconds_until("route follows", status_is(t, "scoped", 404, "no enabled http trigger"), timeout=30)
        assert cr(bed, crd.TRIGGER_PLURAL, t.ns, "scoped")["spec"]["enabled"] is False  # type: ignore[index]
        assert "watching per tenant namespace" in api.log_tail(400)
        # its route table is whole once the tenant namespaces it may see were looked for and listed
        until("/ready in per-namespace mode", lambda: requests.get(api.url + "/ready", timeout=5).status_code == 200,
              timeout=30)
    finally:
        assert api.stop(), api.log_tail()
        api.gate.close()


def test_ready_waits_until_the_route_table_has_loaded(k8s_testbed: Testbed, s3_endpoint: S3Endpoint,
                                                      tmp_path: Path) -> None:
    """An API replica that starts while the API server is away is alive but not ready: a Service must not send it
    calls it would answer 404 for functions it has not heard of. Ready once its watches have listed."""
    api = start_api(k8s_testbed, s3_endpoint, tmp_path / "api", gate_open=False)
    try:
        t = api.tenant()
        ready = requests.get(api.url + "/ready", timeout=5)
        assert ready.status_code == 503 and ready.json()["status"] == "loading", ready.text
        assert "route table is still loading" in ready.json()["error"]
        assert requests.get(api.url + "/health", timeout=5).status_code == 200
        assert invoke(t, "anything").status_code == 503  # a miss before the table loaded is not a 404
        api.gate.restore()
        until("/ready once the watches listed", lambda: requests.get(api.url + "/ready", timeout=5).status_code == 200,
              timeout=60)
        assert requests.get(api.url + "/ready", timeout=5).json()["status"] == "ready"
    finally:
        assert api.stop(), api.log_tail()
        api.gate.close()
