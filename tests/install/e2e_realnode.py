"""End to end through the platform running as pods on the real node (Molecule scenario e2e-real; its verify).

Not collected by a plain `pytest` run (no test_ prefix): it needs what the scenario made, namely the
test bed with its real node ($KUBECONFIG), the chart installed by playbooks/install.yml with the
platform image from the bed's registry, Secrets from Vault, PostgreSQL, RabbitMQ and S3 on the
node's bridge address.

Unlike e2e_installed.py nothing of the platform runs here: the API, the operator and the event
dispatcher are the chart's pods, so every call below crosses what a cluster puts between them (the
API's Service, cluster DNS, the chart's and the tenant's NetworkPolicies enforced by kube-router,
Pod Security "restricted"). The test reaches the API at its Service's ClusterIP (kube-proxy's rules
serve the node's own traffic too) and RabbitMQ with the URL the platform has.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions
import pytest
import requests

from tests.install.e2e_installed import NS, POLL, counted_cluster, get, kubectl, secret_value
from tests.support.platform import Tenant
from tests.support.poll import until

pytestmark = [pytest.mark.e2e, pytest.mark.k8s, pytest.mark.realnode]

BUILD_NS = "sless-build"
COMPONENTS = ("api", "operator", "events")

#: One hello function per runtime; each says which runtime answered.
HELLO: dict[str, tuple[str, dict[str, str | bytes]]] = {
    "python3.11": ("hello-py", {"handler.py": (
        'def handle(event):\n'
        '    return {"hello": event.get("name", "world"), "runtime": "python", "type": event.get("type")}\n')}),
    "nodejs20": ("hello-node", {"handler.js": (
        'exports.handle = async (event) => ({ hello: event.name ?? "world", runtime: "node" });\n')}),
    "go1.23": ("hello-go", {"handler.go": (
        'package function\n\nimport "context"\n\n'
        "func Handle(ctx context.Context, event map[string]any) (any, error) {\n"
        '\treturn map[string]any{"hello": event["name"], "runtime": "go"}, nil\n}\n')}),
}  # fmt: skip
RUNTIME_WORD = {"python3.11": "python", "nodejs20": "node", "go1.23": "go"}


def pods(namespace: str, selector: str) -> list[dict[str, Any]]:
    return list((get("pods", "-n", namespace, "-l", selector) or {}).get("items", []))


def component_pods(component: str) -> list[dict[str, Any]]:
    return pods(NS, f"app.kubernetes.io/component={component}")


def diagnostics(tenant_ns: str | None = None) -> str:
    """Pods, events and log tails of the platform (and of a tenant and the builds), for a failure's message."""
    out = [kubectl("get", "pods", "-A", "-o", "wide", check=False)]
    for component in COMPONENTS:
        logs = kubectl("logs", "-n", NS, "-l", f"app.kubernetes.io/component={component}", "--tail=40",
                       "--all-containers", check=False)  # fmt: skip
        out.append(f"--- {component} ---\n{logs}")
    for ns in filter(None, (tenant_ns, BUILD_NS)):
        out.append(f"--- events in {ns} ---\n" + kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp",
                                                          check=False)[-3000:])  # fmt: skip
    return "\n".join(out)


@dataclass
class Platform:
    url: str
    jwt_secret: str
    node: str


@pytest.fixture(scope="module")
def platform() -> Platform:
    service = next(s for s in get("services", "-n", NS)["items"]
                   if s["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "api")  # fmt: skip
    url = f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"

    def healthy() -> bool:
        try:
            return requests.get(url + "/ready", timeout=3).status_code == 200
        except requests.RequestException:
            return False

    try:
        until("the API's /ready through its Service", healthy, 120, POLL)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnostics()}") from None
    node = get("nodes")["items"][0]["metadata"]["name"]
    return Platform(url, secret_value("sless-jwt", "secret"), node)


def test_the_platform_runs_as_pods_of_the_platform_image_on_the_real_node(platform: Platform) -> None:
    config = get("configmap", "sless-config", "-n", NS)["data"]
    image = config["SLESS_BUILD_FETCH_IMAGE"]  # the chart's platform image (build.fetchImage left empty)
    assert "@sha256:" in image, image
    for component in COMPONENTS:
        running = [p for p in component_pods(component) if p["status"].get("phase") == "Running"]
        assert running, f"no {component} pod running\n{diagnostics()}"
        for pod in running:
            assert pod["spec"]["nodeName"] == platform.node
            assert [c["image"] for c in pod["spec"]["containers"]] == [image]
            assert all(c["ready"] for c in pod["status"]["containerStatuses"]), pod["status"]
            assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


@pytest.fixture(scope="module")
def tenant(platform: Platform) -> Tenant:
    counted_cluster()
    t = Tenant(platform.url, f"e2e-real-{uuid.uuid4()}", secret=platform.jwt_secret)
    t.api("POST", "/ensure", expect=(200, 201))
    return t


@pytest.fixture(scope="module")
def deployed(tenant: Tenant) -> dict[str, str]:
    """The three hello functions, uploaded at once (their builds run side by side), each behind an http
    trigger, Ready; runtime -> function name."""
    start = time.monotonic()
    for runtime, (name, files) in HELLO.items():
        tenant.api("POST", "/functions", json={"name": name, "runtime": runtime}, expect=201)
        tenant.upload(name, files)
        tenant.api("POST", "/triggers", json={"name": name, "type": "http", "function": name}, expect=201)
    for runtime, (name, _) in HELLO.items():
        try:
            tenant.wait_phase(name, ("Ready",), 900)
        except AssertionError as exc:
            raise AssertionError(f"{runtime}: {exc}\n{diagnostics(tenant.ns)}") from None
        print(f"{runtime}: uploaded -> Ready after {time.monotonic() - start:.1f}s")
    return {runtime: name for runtime, (name, _) in HELLO.items()}


@pytest.mark.parametrize("runtime", list(HELLO))
def test_a_hello_function_answers_through_the_apis_fn(tenant: Tenant, deployed: dict[str, str],
                                                       runtime: str) -> None:  # fmt: skip
    name = deployed[runtime]
    last: list[str] = []

    def answered() -> Any:
        try:
            resp = requests.post(tenant.fn_url(name, "/greet"), json={"name": "real pods"}, timeout=30)
        except requests.RequestException as exc:
            last[:] = [repr(exc)]
            return None
        last[:] = [f"{resp.status_code} {resp.text[:300]}"]
        return resp.json() if resp.status_code == 200 else None

    start = time.monotonic()
    try:
        body = until(f"{name} answers through /fn", answered, 180, POLL)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last answer: {last}\n{diagnostics(tenant.ns)}") from None
    print(f"{runtime}: first 200 through /fn after {time.monotonic() - start:.1f}s")
    assert body["hello"] == "real pods" and body["runtime"] == RUNTIME_WORD[runtime], body
    served = pods(tenant.ns, f"sless.dev/function={name},sless.dev/component=function")
    assert served and all(p["status"]["phase"] == "Running" for p in served)


def test_a_function_job_runs_in_a_pod_and_its_result_comes_back(tenant: Tenant, deployed: dict[str, str]) -> None:
    name = deployed["python3.11"]
    start = time.monotonic()
    tenant.api("POST", "/jobs", json={"name": "once", "function": name, "event": {"name": "a job"}, "run_id": 1},
               expect=201)  # fmt: skip
    try:
        record = tenant.wait_job("once", wait=300)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnostics(tenant.ns)}") from None
    print(f"FunctionJob: created -> {record['phase']} in {time.monotonic() - start:.1f}s")
    assert record["phase"] == "Succeeded", f"{record}\n{diagnostics(tenant.ns)}"
    assert json.loads(record["message"]) == {"hello": "a job", "runtime": "python", "type": None}
    ran = pods(tenant.ns, "sless.dev/job=once")
    assert [p["status"]["phase"] for p in ran] == ["Succeeded"]


def test_a_cron_trigger_fires_and_the_firing_is_recorded(tenant: Tenant, deployed: dict[str, str]) -> None:
    name = deployed["python3.11"]
    tenant.api("POST", "/triggers", json={"name": "minutely", "type": "cron", "function": name,
                                          "schedule": "* * * * *"}, expect=201)  # fmt: skip
    try:
        start = time.monotonic()

        def fired() -> dict[str, Any] | None:
            trigger = tenant.api("GET", "/triggers/minutely", expect=200).json()
            return dict(trigger) if trigger.get("last_fired_at") else None

        def last_run() -> dict[str, Any] | None:
            status = (get("triggers.sless.dev", "minutely", "-n", tenant.ns) or {}).get("status", {})
            cond: dict[str, Any] = next((c for c in status.get("conditions", []) if c["type"] == "LastRun"), {})
            return cond if cond.get("status") in ("True", "False") else None

        try:
            trigger = until("the cron trigger fired (within its minute)", fired, 150, POLL)
            cond = until("the firing's outcome recorded", last_run, 180, POLL)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnostics(tenant.ns)}") from None
        print(f"cron: trigger created -> outcome recorded in {time.monotonic() - start:.1f}s")
        assert cond["status"] == "True", f"{cond}\n{diagnostics(tenant.ns)}"
        job, result = cond["message"].split(": ", 1)
        assert json.loads(result) == {"hello": "world", "runtime": "python", "type": "cron"}
        run = get("job", job, "-n", tenant.ns)
        assert run is not None and run["metadata"]["ownerReferences"][0]["kind"] == "CronJob"
        assert trigger["last_fired_at"]
    finally:
        tenant.api("DELETE", "/triggers/minutely", expect=(200, 202, 204))


def _consumers(url: str, queue: str) -> int:
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
    except pika.exceptions.AMQPError:
        return 0
    try:
        return int(conn.channel().queue_declare(queue, passive=True).method.consumer_count)
    except pika.exceptions.ChannelClosedByBroker:  # not declared yet
        return 0
    finally:
        if conn.is_open:
            conn.close()


def test_an_event_published_to_rabbitmq_reaches_its_function(tenant: Tenant, deployed: dict[str, str]) -> None:
    """The dispatcher pod consumes the trigger's queue and calls the function pod (both NetworkPolicies
    in between); the call is in the invocation log (PostgreSQL) with trigger ``event``."""
    name = deployed["python3.11"]
    amqp = secret_value("sless-rabbitmq", "url")  # the platform's own URL: the node's bridge address
    queue = f"{tenant.ns}.e2e-events"
    tenant.api("POST", "/triggers", json={"name": "queue", "type": "event", "function": name,
                                          "queue": "e2e-events"}, expect=201)  # fmt: skip
    try:
        until("the dispatcher consumes the trigger's queue", lambda: _consumers(amqp, queue) > 0, 120, POLL)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnostics(tenant.ns)}") from None
    conn = pika.BlockingConnection(pika.URLParameters(amqp))
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.basic_publish("", queue, json.dumps({"name": "rabbit"}).encode(),
                              pika.BasicProperties(message_id=f"e2e-{uuid.uuid4()}", content_type="application/json",
                                                   delivery_mode=2))  # fmt: skip
    finally:
        conn.close()
    start = time.monotonic()

    def recorded() -> dict[str, Any] | None:
        listed = tenant.api("GET", f"/functions/{name}/invocations", expect=200).json()
        items = listed["items"] if isinstance(listed, dict) else listed
        return next((i for i in items if i["trigger"] == "event"), None)

    try:
        record = until("the event's call in the invocation log", recorded, 120, POLL)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnostics(tenant.ns)}") from None
    print(f"event: published -> call recorded in {time.monotonic() - start:.1f}s")
    assert record["status"] == 200 and record["error"] is None, record
    status = until("the trigger's status says it fired",
                   lambda: (get("triggers.sless.dev", "queue", "-n", tenant.ns) or {}).get("status", {})
                   .get("lastFiredAt") and True, 60, POLL)  # fmt: skip
    assert status


def test_a_rolling_restart_of_the_api_fails_no_call(tenant: Tenant, deployed: dict[str, str]) -> None:
    """`kubectl rollout restart` of the API (2 replicas, one at a time) under a bounded load through its Service:
    every call answers 200. A leaving pod pauses in its preStop hook while its endpoint leaves the Service, then
    finishes what it has; a new one takes calls only once its route table has loaded (/ready). Each call opens a
    connection of its own, so a refused or reset connection is the platform's failure, not a keep-alive race."""
    name = deployed["python3.11"]
    url = tenant.fn_url(name, "/greet")
    stop = threading.Event()
    counts = {"ok": 0}
    failures: list[str] = []
    lock = threading.Lock()

    def caller() -> None:
        while not stop.is_set():
            try:
                resp = requests.post(url, json={"name": "rollout"}, headers={"Connection": "close"}, timeout=30)
                outcome = "" if resp.status_code == 200 else f"{resp.status_code} {resp.text[:200]}"
            except requests.RequestException as exc:
                outcome = repr(exc)[:300]
            with lock:
                if outcome:
                    failures.append(outcome)
                else:
                    counts["ok"] += 1
            time.sleep(0.02)

    before = {p["metadata"]["name"] for p in component_pods("api")}
    threads = [threading.Thread(target=caller, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        until("calls going through", lambda: counts["ok"] >= 20, 60, POLL)
        started = time.monotonic()
        kubectl("rollout", "restart", "deployment/sless-api", "-n", NS)
        # a rollout on a busy node takes minutes (each new pod's start and readiness, each old one's pause and
        # drain): kubectl's own bound, and the process's a little longer
        kubectl("rollout", "status", "deployment/sless-api", "-n", NS, "--timeout=300s", timeout=330)
        took = time.monotonic() - started
        time.sleep(2)  # calls right after the last old pod left
    finally:
        stop.set()
        for thread in threads:
            thread.join(40)
    # pods of the rollout's new ReplicaSet; an old one may still be finishing its drain (terminating, phase Running)
    after = {p["metadata"]["name"] for p in component_pods("api")
             if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")}
    print(f"API rolled in {took:.1f}s under load: {counts['ok']} calls answered 200, {len(failures)} failed")
    assert not before & after, (before, after)  # every API pod was replaced
    assert counts["ok"] > 0 and not failures, f"{len(failures)} failed, e.g. {failures[:5]}\n{diagnostics()}"


def test_no_platform_pod_hit_an_rbac_refusal() -> None:
    for component in COMPONENTS:
        logs = kubectl("logs", "-n", NS, "-l", f"app.kubernetes.io/component={component}", "--tail=-1",
                       "--all-containers")  # fmt: skip
        assert "forbidden" not in logs.lower(), f"{component} hit RBAC refusals:\n{logs[-3000:]}"
