"""Elastic functions on real pods: KEDA scales a Function from zero on its first call, out under load, and back.

Everything is real: the operator gives the Function a KEDA ScaledObject; KEDA's operator and metrics adapter
(built from KEDA's module, host processes of the test bed) read the calls in flight from ``sless-scaler``, which
the API process feeds; the HPA controller scales the Deployment; the kubelet starts and stops the pods; the API's
activator holds a call at zero until the EndpointSlices show a ready pod and balances calls over the ready pods.
The load is bounded in count and time, and every call of it must be answered 200.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests

from sless_operator import manifests
from tests.support import scaler
from tests.support.elastic import elastic_platform
from tests.support.events_proc import Events
from tests.support.keda import Keda
from tests.support.kube_operator import Operator
from tests.support.platform import Tenant
from tests.support.poll import until
from tests.support.rabbitmq import RabbitBroker, publish, queue_counts
from tests.support.realnode import RealNode
from tests.support.services import free_port, fresh_pg_database, sql

pytestmark = [pytest.mark.realnode, pytest.mark.pg, pytest.mark.rabbitmq, pytest.mark.timeout(1800)]

#: Each call holds its pod 50 ms and says which pod answered.
SLEEPY = ("import socket, time\n\n"
          "def handle(event):\n"
          "    time.sleep(0.05)\n"
          "    return {'pod': socket.gethostname()}\n")  # fmt: skip
#: 8 callers at 2 calls in flight per pod ask for 4 pods; idle 10 s before going back to zero.
SCALE = {"min": 0, "max": 4, "target": 2, "idle_sec": 10}
CALLERS = 8
#: An event handler that says which message it ran for.
CONSUMER = "def handle(event):\n    return {'order': event['data']['order']}\n"
BACKLOG = 40


@dataclass
class Elastic:
    real_node: RealNode
    keda: Keda
    tenant: Tenant
    op: Operator
    scaler: scaler.Scaler
    events: Events
    db_url: str


@pytest.fixture(scope="module")
def elastic(real_node: RealNode, rabbitmq_url: str, pg_url: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Elastic]:  # fmt: skip
    work = tmp_path_factory.mktemp("scaling")
    db_url = fresh_pg_database(pg_url)
    with elastic_platform(real_node, work, api_env={"SLESS_RABBITMQ_URL": rabbitmq_url}) as platform:
        # the event dispatcher as the API: on the host, routing to ready pods, telling the scaler its calls
        events = Events(real_node.bed.env | {
            "SLESS_SCALER_ADDRESS": platform.scaler.address, "SLESS_SCALER_TOKEN": scaler.TOKEN,
            "SLESS_RABBITMQ_URL": rabbitmq_url, "SLESS_DATABASE_URL": db_url, "SLESS_EVENTS_HOST": "127.0.0.1",
            "SLESS_EVENTS_PORT": str(free_port()), "SLESS_KUBE_ROUTING": "endpoints", "SLESS_EVENT_MAX_RETRIES": "1",
            "PYTHONUNBUFFERED": "1"}, work)  # fmt: skip
        try:
            platform.deploy("sleepy", "python3.11", {"handler.py": SLEEPY}, scale=SCALE)
            platform.deploy("consumer", "python3.11", {"handler.py": CONSUMER}, http=False, scale=SCALE)
            events.start()
            yield Elastic(real_node, platform.keda, platform.tenant, platform.op, platform.scaler, events, db_url)
        finally:
            if events.proc is not None:
                events.term()


def pods(e: Elastic, ready_only: bool = False, function: str = "sleepy") -> list[dict[str, Any]]:
    selector = f"sless.dev/function={function},sless.dev/component={manifests.COMPONENT_FUNCTION}"
    items = (e.real_node.bed.get("pods", "-n", e.tenant.ns, "-l", selector) or {}).get("items", [])
    live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
    if not ready_only:
        return list(items)
    return [p for p in live if any(c.get("type") == "Ready" and c.get("status") == "True"
                                   for c in (p.get("status") or {}).get("conditions") or [])]  # fmt: skip


def replicas(e: Elastic, function: str = "sleepy") -> int:
    deployment = e.real_node.bed.get("deployment", function, "-n", e.tenant.ns) or {}
    return int((deployment.get("spec") or {}).get("replicas", -1))


@dataclass
class Load:
    """CALLERS threads calling as fast as answers come, each call's (status, pod or error) kept in order."""

    url: str
    callers: int
    answers: list[tuple[float, int, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self, callers: int | None = None) -> None:
        for _ in range(callers or self.callers):
            thread = threading.Thread(target=self._call, daemon=True)
            thread.start()
            self.threads.append(thread)

    def _call(self) -> None:
        with requests.Session() as session:
            while not self.stop.is_set():
                try:
                    resp = session.get(self.url, timeout=60)
                    who = resp.json().get("pod", "?") if resp.status_code == 200 else resp.text[:200]
                    self.answers.append((time.monotonic(), resp.status_code, str(who)))
                except (requests.RequestException, ValueError) as exc:
                    self.answers.append((time.monotonic(), 0, repr(exc)))

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=90)
        self.threads.clear()
        self.stop.clear()

    def failed(self) -> list[tuple[float, int, str]]:
        return [a for a in self.answers if a[1] != 200]


def test_an_idle_function_goes_to_zero_and_a_call_wakes_it_cold(elastic: Elastic) -> None:
    e = elastic
    bed = e.real_node.bed
    bed.wait("the idle function scaled to zero", lambda: replicas(e) == 0 and not pods(e), timeout=180, interval=1)
    assert e.tenant.api("GET", "/functions/sleepy", expect=200).json()["phase"] == "Ready"
    started = time.monotonic()
    resp = requests.get(e.tenant.fn_url("sleepy"), headers={"X-Request-Id": "wake-at-zero-1"}, timeout=180)
    woke_in = time.monotonic() - started
    assert resp.status_code == 200, (resp.status_code, resp.text, e.keda.log_tails())
    def recorded() -> dict[str, Any] | None:
        items = e.tenant.api("GET", "/functions/sleepy/invocations?limit=20", expect=200).json()["items"]
        return next((r for r in items if r.get("request_id") == "wake-at-zero-1"), None)

    record = until("the call's record", recorded, 30, 0.2)
    assert record["cold"] is True and record["status"] == 200, record
    assert record["phases_ms"]["start"] > 0, record  # the activation: waiting for the first ready pod
    print(f"a call at zero answered in {woke_in:.2f}s (activation {record['phases_ms']['start']:.0f} ms)")


def test_load_scales_out_shares_the_pods_and_idle_scales_back_to_zero(elastic: Elastic) -> None:
    e = elastic
    bed = e.real_node.bed
    load = Load(e.tenant.fn_url("sleepy"), CALLERS)
    load.start()
    try:
        until("3 or more ready pods under load", lambda: len(pods(e, ready_only=True)) >= 3, 240, 1)
        until("every pod KEDA asked for is ready", lambda: len(pods(e, ready_only=True)) == replicas(e), 120, 1)
        window_start = time.monotonic()
        serving = {p["metadata"]["name"] for p in pods(e, ready_only=True)}
        until("200 calls answered in the steady window",
              lambda: sum(1 for t, _, _ in load.answers if t > window_start) >= 200, 120, 0.5)
        window = [a for a in list(load.answers) if a[0] > window_start and a[1] == 200]
        shares = Counter(who for _, _, who in window if who in serving)
        mean = len(window) / len(serving)
        assert set(shares) == serving, (shares, serving)
        assert all(abs(n - mean) <= 0.2 * mean for n in shares.values()), (shares, mean)
        # fewer callers: the function scales in while calls go on, and a pod leaving is drained
        load.finish()
        load.start(callers=1)
        until("scaled in below 3 pods under a trickle", lambda: replicas(e) < 3, 240, 1)
        bed.wait("the leaving pods gone", lambda: len(pods(e)) == replicas(e), timeout=120, interval=1)
    finally:
        load.finish()
    assert not load.failed(), load.failed()[:10]
    assert len(load.answers) > 300
    bed.wait("back to zero after idle", lambda: replicas(e) == 0 and not pods(e), timeout=240, interval=1)
    print(f"{len(load.answers)} calls through scale-out and scale-in, shares in the steady window: {dict(shares)}")


def test_a_queue_backlog_wakes_a_function_at_zero_and_drains_with_nothing_dead_lettered(
        elastic: Elastic, rabbitmq_broker: RabbitBroker) -> None:
    e = elastic
    bed = e.real_node.bed
    queue, dlq = f"{e.tenant.ns}.orders", f"{e.tenant.ns}.orders.dlq"
    e.tenant.api("POST", "/triggers", json={"name": "on-orders", "type": "event", "function": "consumer",
                                            "queue": "orders"}, expect=201)  # fmt: skip
    e.events.wait("the queue is consumed", lambda: queue_counts(rabbitmq_broker, queue)[1] == 1, timeout=60)
    bed.wait("the consumer at zero", lambda: replicas(e, "consumer") == 0 and not pods(e, function="consumer"),
             timeout=180, interval=1)  # fmt: skip
    publish(rabbitmq_broker, queue, [{"order": i} for i in range(BACKLOG)])

    def served() -> list[tuple[Any, ...]]:
        rows = sql(e.db_url, "SELECT status FROM invocations WHERE namespace = %s AND function = 'consumer' "
                             "AND trigger = 'event'", e.tenant.ns, missing_table_ok=True)  # fmt: skip
        return rows if len(rows) >= BACKLOG else []

    rows = e.events.wait(f"{BACKLOG} events served", served, timeout=240)
    assert [status for (status,) in rows] == [200] * BACKLOG, rows
    assert queue_counts(rabbitmq_broker, queue)[0] == 0
    assert queue_counts(rabbitmq_broker, dlq)[0] == 0, "nothing is dead-lettered"
    bed.wait("the consumer back to zero", lambda: replicas(e, "consumer") == 0, timeout=240, interval=1)

