"""``sless-events`` as a real process: the test bed's API server, a real RabbitMQ, a real PostgreSQL.

The process runs with the credentials the chart gives it (a ServiceAccount bound to exactly
:data:`EVENTS_RULES`), so these tests also prove that those rules are enough. Triggers and Function
status are written the way the API and the operator write them (custom resources, the status
subresource).

kwok runs no containers and this machine has no cluster DNS, so a call to a function's Service
(``http://<fn>.<ns>.svc.cluster.local:8080``) fails: the invoker answers 502 ("function
unreachable"), which the dispatcher retries and then dead-letters. That is the end-to-end behaviour
observable here, and what these tests assert; a call that succeeds needs a real cluster network.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import requests
import yaml

from sless_core import crd
from tests.support import services
from tests.support.events_proc import Events, events_command
from tests.support.metrics import SCRAPE_TOKEN, sample, scrape
from tests.support.poll import holds
from tests.support.rabbitmq import RabbitBroker, drain, publish, queue_counts, take_all
from tests.support.services import free_port, fresh_pg_database
from tests.support.testbed import Testbed

pytestmark = [pytest.mark.k8s, pytest.mark.pg, pytest.mark.rabbitmq]

#: What the chart's ClusterRole for sless-events grants; nothing more.
EVENTS_RULES: list[dict[str, Any]] = [
    {"apiGroups": [crd.GROUP], "resources": ["functions", "triggers"], "verbs": ["list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    {"apiGroups": [crd.GROUP], "resources": ["triggers/status"], "verbs": ["patch"]},
]
READY = {"phase": "Ready", "message": "ready", "image": "registry.test.invalid/sless/fn:1"}


@pytest.fixture(scope="module")
def events_kubeconfig(sless_crds: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A kubeconfig with a ServiceAccount token bound to EVENTS_RULES only (cluster-wide)."""
    bed = sless_crds
    suffix = secrets.token_hex(4)
    sa_ns, role = f"sless-events-{suffix}", f"sless-events-test-{suffix}"
    bed.kubectl("create", "namespace", sa_ns)
    bed.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "events", "namespace": sa_ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role},
         "rules": EVENTS_RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": "events", "namespace": sa_ns}]},
    )
    token = bed.kubectl("create", "token", "events", "-n", sa_ns, "--duration=2h").stdout.strip()
    config = yaml.safe_load(bed.kubeconfig.read_text())
    for cluster in config["clusters"]:
        ca = cluster["cluster"].get("certificate-authority")
        if ca and not Path(ca).is_absolute():
            cluster["cluster"]["certificate-authority"] = str(bed.kubeconfig.parent / ca)
    config["users"] = [{"name": "events", "user": {"token": token}}]
    for ctx in config["contexts"]:
        ctx["context"]["user"] = "events"
    path = tmp_path_factory.mktemp("events-kube") / "kubeconfig"
    path.write_text(json.dumps(config))
    try:
        yield path
    finally:
        bed.kubectl("delete", "clusterrolebinding,clusterrole", role, "--ignore-not-found", check=False)
        bed.kubectl("delete", "namespace", sa_ns, "--wait=false", check=False)


@pytest.fixture
def db_url(pg_url: str) -> str:
    return fresh_pg_database(pg_url)


@pytest.fixture
def events_factory(sless_crds: Testbed, events_kubeconfig: Path, rabbitmq_url: str, db_url: str,
                   tmp_path: Path) -> Iterator[Callable[..., Events]]:
    made: list[Events] = []

    def make(start: bool = True, **env: str) -> Events:
        base = {k: v for k, v in sless_crds.env.items() if not k.startswith("SLESS_")}
        full = {**base, "KUBECONFIG": str(events_kubeconfig), "SLESS_RABBITMQ_URL": rabbitmq_url,
                "SLESS_DATABASE_URL": db_url, "SLESS_EVENTS_HOST": "127.0.0.1",
                "SLESS_EVENTS_PORT": str(free_port()), "SLESS_KUBE_WATCH_TIMEOUT_SEC": "60",
                "SLESS_EVENT_MAX_RETRIES": "2", "SLESS_EVENT_RETRY_BACKOFF_SEC": "0.2",
                "SLESS_EVENT_RETRY_BACKOFF_MAX_SEC": "1", "SLESS_EVENT_DRAIN_SEC": "10", "PYTHONUNBUFFERED": "1",
                "SLESS_METRICS_TOKEN": SCRAPE_TOKEN, **env}
        log_dir = tmp_path / f"events-{len(made)}"
        log_dir.mkdir()
        ev = Events(full, log_dir)
        made.append(ev)
        return ev.start() if start else ev

    yield make
    for ev in made:
        if ev.proc is not None and ev.proc.poll() is None:
            ev.term()


# the cluster side, as the API and the operator write it

def apply(bed: Testbed, ns: str, kind: str, name: str, spec: dict[str, Any]) -> None:
    bed.apply({"apiVersion": crd.API_VERSION, "kind": kind, "metadata": {"name": name, "namespace": ns},
               "spec": spec})


def set_status(bed: Testbed, plural: str, ns: str, name: str, status: dict[str, Any]) -> None:
    bed.kubectl("patch", f"{plural}.{crd.GROUP}", name, "-n", ns, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": status}))


def patch_spec(bed: Testbed, plural: str, ns: str, name: str, spec: dict[str, Any]) -> None:
    bed.kubectl("patch", f"{plural}.{crd.GROUP}", name, "-n", ns, "--type=merge", "-p", json.dumps({"spec": spec}))


def ready_function(bed: Testbed, ns: str, name: str = "fn") -> None:
    apply(bed, ns, "Function", name, {"runtime": "python3.11", "timeoutSec": 5})
    set_status(bed, crd.FUNCTION_PLURAL, ns, name, READY)


def event_trigger(bed: Testbed, ns: str, name: str, queue: str, function: str = "fn", enabled: bool = True) -> None:
    apply(bed, ns, "Trigger", name, {"type": "event", "function": function, "queue": queue, "enabled": enabled})


def consumers(broker: RabbitBroker, queue: str) -> Callable[[int], Callable[[], bool]]:
    return lambda n: lambda: queue_counts(broker, queue)[1] == n


def sql(url: str, statement: str, *args: object) -> list[tuple[Any, ...]]:
    return services.sql(url, statement, *args, missing_table_ok=True)  # the dispatcher creates its tables


def invocations(url: str, ns: str) -> list[tuple[Any, ...]]:
    return sql(url, "SELECT function, method, path, status, trigger, error FROM invocations "
                    "WHERE namespace = %s ORDER BY id", ns)


def delivery(url: str, queue: str, key: str) -> tuple[str, int] | None:
    rows = sql(url, "SELECT state, attempts FROM event_deliveries WHERE queue = %s AND message_key = %s", queue, key)
    return (str(rows[0][0]), int(rows[0][1])) if rows else None


def props(message_id: str) -> Callable[[int], pika.BasicProperties]:
    return lambda i: pika.BasicProperties(message_id=message_id, content_type="application/json", delivery_mode=2)


# ------------------------------------------------------------------------------------------ tests


def test_an_event_trigger_is_consumed_and_unreachable_calls_are_dead_lettered(
        events_factory: Callable[..., Events], sless_crds: Testbed, tenant: str, rabbitmq_broker: RabbitBroker,
        db_url: str) -> None:
    bed, ns = sless_crds, tenant
    ev = events_factory()
    queue, dlq = f"{ns}.orders", f"{ns}.orders.dlq"
    ready_function(bed, ns)
    event_trigger(bed, ns, "on-orders", "orders")
    took = time.monotonic()
    ev.wait("the queue is consumed", consumers(rabbitmq_broker, queue)(1), timeout=30)
    print(f"trigger created -> consuming in {time.monotonic() - took:.2f}s")
    assert f"{ns}/on-orders" in (ev.get("/ready") or {})["consuming"]
    assert queue_counts(rabbitmq_broker, dlq) == (0, 0)  # declared, empty

    publish(rabbitmq_broker, queue, [{"order": 42}], props("order-42"))
    [(p, body)] = drain(rabbitmq_broker, dlq, 1, timeout=60)
    assert json.loads(body) == {"order": 42} and p.message_id == "order-42"
    headers = p.headers
    assert headers["x-sless-kind"] == "failed"
    assert headers["x-sless-attempts"] == 3  # the first call and SLESS_EVENT_MAX_RETRIES=2 retries
    assert headers["x-sless-status"] == 502
    assert "function unreachable" in headers["x-sless-reason"]
    assert (headers["x-sless-trigger"], headers["x-sless-function"], headers["x-sless-queue"]) == (
        f"{ns}/on-orders", "fn", queue)
    assert queue_counts(rabbitmq_broker, queue) == (0, 1)  # acked once dead-lettered, still consuming

    # every attempt is an invocation record of trigger "event" in PostgreSQL
    ev.wait("3 invocation records", lambda: len(invocations(db_url, ns)) == 3, timeout=30)
    for fn, method, path, status, trigger, error in invocations(db_url, ns):
        assert (fn, method, path, status, trigger) == ("fn", "POST", "/", 502, "event")
        assert "function unreachable" in error
    assert delivery(db_url, queue, "mid:order-42") == ("dead", 3)
    # the trigger's status tells what its consumer does (the operator owns message and conditions)
    status = ev.wait("the trigger's status", lambda: (bed.get(f"triggers.{crd.GROUP}", "on-orders", "-n", ns)
                                                      or {}).get("status", {}).get("lastFiredAt"), timeout=30)
    assert status
    note = bed.get(f"triggers.{crd.GROUP}", "on-orders", "-n", ns)["status"]["dispatcher"]
    assert "consuming" in note["message"] and note["replica"]
    assert ev.stats()["dead"] == 1 and ev.stats()["retried"] == 2
    # the same, for Prometheus; the DLQ's depth is measured every few seconds (the test drained it: put one back)
    assert requests.get(ev.url + "/metrics", timeout=5).status_code == 401
    publish(rabbitmq_broker, dlq, [{"parked": True}], props("parked-1"))
    labels = {"namespace": ns, "trigger": "on-orders"}

    def dlq_measured() -> str | None:
        text = scrape(ev.url)
        return text if sample(text, "sless_event_queue_messages", **labels, queue="dlq") == 1 else None

    text = ev.wait("the DLQ depth is measured", dlq_measured, timeout=30)
    assert sample(text, "sless_event_messages_total", **labels, outcome="dead") == 1
    assert sample(text, "sless_event_messages_total", **labels, outcome="retried") == 2
    assert sample(text, "sless_event_dead_letters_total", **labels, kind="failed") == 1
    assert sample(text, "sless_invocations_total", namespace=ns, function="fn", trigger="event", status="502") == 3
    assert ev.term() == 0


def test_disable_delete_and_readiness_start_and_stop_the_consumer(
        events_factory: Callable[..., Events], sless_crds: Testbed, tenant: str,
        rabbitmq_broker: RabbitBroker) -> None:
    bed, ns = sless_crds, tenant
    ev = events_factory()
    queue, dlq = f"{ns}.jobs", f"{ns}.jobs.dlq"
    count = consumers(rabbitmq_broker, queue)
    apply(bed, ns, "Function", "fn", {"runtime": "python3.11", "timeoutSec": 5})
    event_trigger(bed, ns, "on-jobs", "jobs")
    holds("no consumer before the function is deployed", lambda: queue_counts(rabbitmq_broker, queue) == (0, 0),
          for_sec=2.0, why="the dispatcher learns of a trigger from its watch of Triggers within a watch event "
          "(well under a second on the bed) and declares the queue and consumes at once; 2 s covers that")
    set_status(bed, crd.FUNCTION_PLURAL, ns, "fn", READY)
    ev.wait("consuming once Ready", count(1), timeout=30)

    patch_spec(bed, crd.TRIGGER_PLURAL, ns, "on-jobs", {"enabled": False})
    ev.wait("consumer cancelled on disable", count(0), timeout=30)
    publish(rabbitmq_broker, queue, [{"n": 1}], props("job-1"))
    holds("a disabled trigger's message stays queued", lambda: queue_counts(rabbitmq_broker, queue) == (1, 0),
          for_sec=3.0, why="the consumer was cancelled; a consumer left over or started again would take the "
          "message within the broker's delivery (milliseconds) or one watch event; 3 s is far more than both")
    assert take_all(rabbitmq_broker, dlq) == []

    patch_spec(bed, crd.TRIGGER_PLURAL, ns, "on-jobs", {"enabled": True})
    ev.wait("consuming again on enable", count(1), timeout=30)
    [(p, _)] = drain(rabbitmq_broker, dlq, 1, timeout=60)  # the queued message is handled now
    assert p.message_id == "job-1"

    # a second trigger on the same queue is not consumed (it would take half of the messages)
    event_trigger(bed, ns, "on-jobs-too", "jobs")
    note = ev.wait("the second trigger told why", lambda: (bed.get(f"triggers.{crd.GROUP}", "on-jobs-too", "-n", ns)
                                                          or {}).get("status", {}).get("dispatcher"), timeout=30)
    assert "already consumed by trigger 'on-jobs'" in note["message"]
    assert queue_counts(rabbitmq_broker, queue)[1] == 1

    # the function loses its deployment (a failed first build): no consumer; back: consuming
    set_status(bed, crd.FUNCTION_PLURAL, ns, "fn", {"phase": "Failed", "image": None, "message": "boom"})
    ev.wait("consumer cancelled when not deployed", count(0), timeout=30)
    set_status(bed, crd.FUNCTION_PLURAL, ns, "fn", READY)
    ev.wait("consuming when deployed again", count(1), timeout=30)

    bed.kubectl("delete", f"triggers.{crd.GROUP}", "on-jobs", "-n", ns)
    # the other trigger of the queue takes over
    ev.wait("the other trigger consumes", lambda: f"{ns}/on-jobs-too" in (ev.get("/ready") or {})["consuming"],
            timeout=30)
    bed.kubectl("delete", f"triggers.{crd.GROUP}", "on-jobs-too", "-n", ns)
    ev.wait("consumer cancelled on delete", count(0), timeout=30)
    assert queue_counts(rabbitmq_broker, queue) == (0, 0) and queue_counts(rabbitmq_broker, dlq) == (0, 0)
    with contextlib.closing(rabbitmq_broker.connection()) as conn:  # both queues are kept (the tenant's)
        ch = conn.channel()
        ch.queue_declare(queue, passive=True)
        ch.queue_declare(dlq, passive=True)
    assert ev.term() == 0


def test_sigkill_mid_retry_and_a_restart_continue_the_attempts(
        events_factory: Callable[..., Events], sless_crds: Testbed, tenant: str, rabbitmq_broker: RabbitBroker,
        db_url: str) -> None:
    bed, ns = sless_crds, tenant
    # long backoffs: the process is surely waiting for a retry when it is killed
    ev = events_factory(SLESS_EVENT_MAX_RETRIES="3", SLESS_EVENT_RETRY_BACKOFF_SEC="5",
                        SLESS_EVENT_RETRY_BACKOFF_MAX_SEC="5")
    queue, dlq = f"{ns}.mail", f"{ns}.mail.dlq"
    ready_function(bed, ns)
    event_trigger(bed, ns, "on-mail", "mail")
    ev.wait("consuming", consumers(rabbitmq_broker, queue)(1), timeout=30)
    publish(rabbitmq_broker, queue, [{"to": "a@example.org"}], props("mail-1"))
    ev.wait("the first attempt failed and was recorded",
            lambda: delivery(db_url, queue, "mid:mail-1") == ("failed", 1) and len(invocations(db_url, ns)) == 1,
            timeout=30)
    ev.kill()
    # the unacked message goes back to the queue; the store remembers the attempt
    ev.wait("the message is back in the queue", lambda: queue_counts(rabbitmq_broker, queue) == (1, 0), timeout=30)
    assert delivery(db_url, queue, "mid:mail-1") == ("failed", 1)

    ev.start()
    [(p, _)] = drain(rabbitmq_broker, dlq, 1, timeout=90)
    assert p.headers["x-sless-attempts"] == 4, "a restart must not grant new attempts"
    ev.wait("4 invocation records in all", lambda: len(invocations(db_url, ns)) == 4, timeout=30)
    assert delivery(db_url, queue, "mid:mail-1") == ("dead", 4)

    # the publisher sends the same message again: within the window it is acked without a call
    publish(rabbitmq_broker, queue, [{"to": "a@example.org"}], props("mail-1"))
    ev.wait("the duplicate acked", lambda: ev.stats().get("duplicate") == 1, timeout=30)
    ev.wait("queue empty", lambda: queue_counts(rabbitmq_broker, queue) == (0, 1), timeout=30)
    holds("the duplicate is not called", lambda: len(invocations(db_url, ns)) == 4, for_sec=1.0,
          why="the duplicate was acked (the queue is empty): a wrong call for it would be recorded as it fails, "
          "and the function has no pods here, so a call fails at once (a 502, like the 4 attempts); 1 s covers that")
    assert take_all(rabbitmq_broker, dlq) == []
    assert ev.term() == 0


def test_sigterm_gives_back_a_message_waiting_for_a_retry_and_exits_0(
        events_factory: Callable[..., Events], sless_crds: Testbed, tenant: str, rabbitmq_broker: RabbitBroker,
        db_url: str) -> None:
    bed, ns = sless_crds, tenant
    ev = events_factory(SLESS_EVENT_MAX_RETRIES="3", SLESS_EVENT_RETRY_BACKOFF_SEC="30",
                        SLESS_EVENT_RETRY_BACKOFF_MAX_SEC="30")
    queue = f"{ns}.slow"
    ready_function(bed, ns)
    event_trigger(bed, ns, "on-slow", "slow")
    ev.wait("consuming", consumers(rabbitmq_broker, queue)(1), timeout=30)
    publish(rabbitmq_broker, queue, [{"n": 1}], props("slow-1"))
    ev.wait("waiting for the first retry", lambda: delivery(db_url, queue, "mid:slow-1") == ("failed", 1),
            timeout=30)
    started = time.monotonic()
    assert ev.term() == 0
    took = time.monotonic() - started
    print(f"SIGTERM -> exit 0 in {took:.2f}s")
    assert took < 25, "the 30 s backoff must not hold the shutdown"
    assert queue_counts(rabbitmq_broker, queue) == (1, 0), "the message must go back to the queue"
    assert delivery(db_url, queue, "mid:slow-1") == ("failed", 1)
    assert len(invocations(db_url, ns)) == 1  # the invocation log was flushed on the way out
    log = ev.log_tail(200)
    assert "stopping" in log and "Traceback" not in log


def test_probes_without_a_broker_and_configuration_errors(events_factory: Callable[..., Events]) -> None:
    ev = events_factory(start=False, SLESS_RABBITMQ_URL=f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F")
    ev.start(wait_ready=False)

    def not_ready() -> dict[str, Any] | None:
        ready = ev.get("/ready")
        return ready if ready and ready["_code"] == 503 and ready["checks"]["triggers"] else None

    ready = ev.wait("/ready answers 503 with its checks", not_ready, timeout=30)
    assert ready["checks"]["rabbitmq"] is False and ready["status"] == "not ready"
    assert (ev.get("/health") or {})["_code"] == 200
    assert ev.term() == 0

    for env, text in ((({"SLESS_DATABASE_URL": "sqlite:////tmp/x.db"}), "postgresql://"),
                      ({"SLESS_RABBITMQ_URL": ""}, "SLESS_RABBITMQ_URL is required"),
                      ({"SLESS_EVENTS_PORT": "http"}, "SLESS_EVENTS_PORT")):
        proc = subprocess.run(events_command(), env={**ev.env, **env}, capture_output=True, text=True, timeout=60,
                              check=False)
        assert proc.returncode == 2 and text in proc.stderr, (env, proc.returncode, proc.stderr[-500:])


def test_a_broker_restart_is_survived(events_factory: Callable[..., Events], sless_crds: Testbed, tenant: str,
                                      rabbitmq_broker: RabbitBroker) -> None:
    bed, ns = sless_crds, tenant
    ev = events_factory(SLESS_EVENT_RECONNECT_MAX_SEC="2")
    queue, dlq = f"{ns}.restart", f"{ns}.restart.dlq"
    ready_function(bed, ns)
    event_trigger(bed, ns, "on-restart", "restart")
    ev.wait("consuming", consumers(rabbitmq_broker, queue)(1), timeout=30)
    rabbitmq_broker.stop()
    try:
        ev.wait("/ready says the broker is gone",
                lambda: (ev.get("/ready") or {}).get("checks", {}).get("rabbitmq") is False, timeout=30)
        assert (ev.get("/health") or {})["_code"] == 200
    finally:
        rabbitmq_broker.start()
    ev.wait("consuming again", consumers(rabbitmq_broker, queue)(1), timeout=60)
    assert (ev.get("/ready") or {})["_code"] == 200
    publish(rabbitmq_broker, queue, [{"n": 1}], props("after-restart"))
    [(p, _)] = drain(rabbitmq_broker, dlq, 1, timeout=60)
    assert p.message_id == "after-restart" and ev.stats()["connections"] == 2
    assert ev.term() == 0
