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
