"""A `sless up` with a real broker and a function that fails while a file says so: what the event-queue tests (REST,
CLI and the console's) share."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.platform import SlessProcess, Tenant, start_sless
from tests.support.poll import until
from tests.support.rabbitmq import RabbitBroker, queue_counts

POLL = 0.1
#: as test_events.py: quick retries, and no sandbox so the function writes to the test's folder
EVENT_ENV = {"SLESS_EVENT_MAX_RETRIES": "1", "SLESS_EVENT_RETRY_BACKOFF_SEC": "0.1",
             "SLESS_EVENT_RECONNECT_MAX_SEC": "1", "SLESS_SANDBOX": "off"}

#: Fails while the file "fail" is in OUT_DIR; else appends what it got to calls.jsonl.
SWITCHABLE = """
import json, os

def handle(event):
    if os.path.exists(os.path.join(os.environ["OUT_DIR"], "fail")):
        raise ValueError("switched to fail")
    line = {"id": event["id"], "type": event.get("type"), "source": event.get("source"), "data": event.get("data")}
    with open(os.path.join(os.environ["OUT_DIR"], "calls.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\\n")
    return {"ok": True}
"""


def calls(out: Path) -> list[dict[str, Any]]:
    path = out / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def sless_queues(tmp_path_factory: pytest.TempPathFactory, rabbitmq_url: str) -> Iterator[SlessProcess]:
    sp = start_sless(Path(tmp_path_factory.mktemp("sless-queues")), {"SLESS_RABBITMQ_URL": rabbitmq_url,
                                                                      **EVENT_ENV})
    yield sp
    assert sp.stop() == 0, sp.log_tail()


def consumer(sp: SlessProcess, broker: RabbitBroker, sub: str, out: Path, queue: str = "inbox") -> Tenant:
    out.mkdir(parents=True, exist_ok=True)
    tenant = Tenant(sp.url, sub)
    tenant.deploy("switchable", "python3.11", {"handler.py": SWITCHABLE}, http=False, timeout_sec=10,
                  env_vars={"OUT_DIR": str(out)})
    tenant.api("POST", "/triggers", json={"name": f"on-{queue}", "type": "event", "function": "switchable",
                                          "queue": queue}, expect=201)
    until("the consumer", lambda: queue_counts(broker, f"{tenant.ns}.{queue}")[1] == 1, 60, POLL)
    return tenant


def publish(tenant: Tenant, queue: str, body: bytes | str, expect: int = 202, **headers: str) -> dict[str, Any]:
    resp = requests.post(f"{tenant.url}/v1/namespaces/{tenant.ns}/queues/{queue}/messages", data=body,
                         headers={"Authorization": f"Bearer {tenant.token}", **headers}, timeout=30)
    assert resp.status_code == expect, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


def test_a_published_message_calls_the_function(sless_queues: SlessProcess, rabbitmq_broker: RabbitBroker,
                                                tmp_path: Path) -> None:
    tenant = consumer(sless_queues, rabbitmq_broker, "queues-publish", tmp_path)
    plain = publish(tenant, "inbox", json.dumps({"n": 1}), **{"Content-Type": "application/json",
                                                              "X-Sless-Message-Id": "order-1"})
    assert plain == {"queue": "inbox", "message_id": "order-1"}
    binary = publish(tenant, "inbox", json.dumps({"n": 2}), **{
        "Content-Type": "application/json", "ce-specversion": "1.0", "ce-id": "evt-2", "ce-source": "/shop",
        "ce-type": "order.created"})
    assert len(binary["message_id"]) == 32
    structured = {"specversion": "1.0", "id": "evt-3", "source": "/shop", "type": "order.paid", "data": {"n": 3}}
    publish(tenant, "inbox", json.dumps(structured), **{"Content-Type": "application/cloudevents+json"})
    until("three calls", lambda: len(calls(tmp_path)) == 3, 60, POLL)
    got = {c["data"]["n"]: c for c in calls(tmp_path)}
    assert got[1]["id"] == "order-1"
    assert (got[2]["id"], got[2]["type"], got[2]["source"]) == ("evt-2", "order.created", "/shop")
    assert (got[3]["id"], got[3]["type"]) == ("evt-3", "order.paid")
    # the same message id again: the deduplication skips it
    publish(tenant, "inbox", json.dumps({"n": 1}), **{"Content-Type": "application/json",
                                                      "X-Sless-Message-Id": "order-1"})
    publish(tenant, "inbox", json.dumps({"n": 4}), **{"Content-Type": "application/json"})
    until("the fourth call", lambda: len(calls(tmp_path)) == 4, 60, POLL)
    assert sorted(c["data"]["n"] for c in calls(tmp_path)) == [1, 2, 3, 4]


def test_bad_publishes_are_refused_before_the_broker(sless_queues: SlessProcess, rabbitmq_broker: RabbitBroker,
                                                    tmp_path: Path) -> None:
    tenant = consumer(sless_queues, rabbitmq_broker, "queues-bad", tmp_path)
    other_tenant = Tenant(sless_queues.url, "queues-intruder")
    json_type = {"Content-Type": "application/json"}
    assert "no queue 'nobody'" in publish(tenant, "nobody", "{}", 404, **json_type)["error"]
    for queue in ("inbox.dlq", "a" * 201):
        publish(tenant, queue, "{}", 400, **json_type)
    publish(tenant, "in*box", "{}", 404, **json_type)  # the path's one spelling: no route, nothing read
    assert "not a valid event" in publish(tenant, "inbox", "{not json", 400, **json_type)["error"]
    assert "not a valid event" in publish(tenant, "inbox", '{"id": "x"}', 400,
                                          **{"Content-Type": "application/cloudevents+json"})["error"]
    publish(tenant, "inbox", "{}", 400, **json_type, **{"X-Sless-Message-Id": "bad id with spaces"})
    publish(tenant, "inbox", b"x" * (6 * 1024 * 1024 + 1), 413, **{"Content-Type": "application/octet-stream"})
    url = f"{tenant.url}/v1/namespaces/{tenant.ns}/queues/inbox/messages"
    assert requests.post(url, data="{}", headers=json_type, timeout=10).status_code == 401
    assert requests.post(url, data="{}", headers={**json_type, "Authorization": f"Bearer {other_tenant.token}"},
                         timeout=10).status_code == 403
    assert calls(tmp_path) == []
