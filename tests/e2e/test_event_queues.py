"""A tenant's queues through the REST API, on `sless up` with a real broker: publish with only a token, and the
dead letters listed, inspected, redriven (and then handled) and purged; never another tenant's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.eventqueues import POLL, SWITCHABLE, calls, consumer, publish, sless_queues
from tests.support.platform import REPO, SlessProcess, Tenant
from tests.support.poll import until
from tests.support.rabbitmq import RabbitBroker, queue_counts

pytestmark = [pytest.mark.e2e, pytest.mark.rabbitmq]
__all__ = ["sless_queues"]  # the module's fixture, from tests.support.eventqueues


def dead_letters(tenant: Tenant, queue: str = "inbox", expect: int = 200, **params: Any) -> dict[str, Any]:
    answer: dict[str, Any] = tenant.api("GET", f"/queues/{queue}/dead-letters", expect=expect, params=params).json()
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


def test_dead_letters_are_listed_inspected_redriven_and_purged(
        sless_queues: SlessProcess, rabbitmq_broker: RabbitBroker, tmp_path: Path) -> None:
    tenant = consumer(sless_queues, rabbitmq_broker, "queues-dlq", tmp_path)
    other_tenant = Tenant(sless_queues.url, "queues-intruder")
    (tmp_path / "fail").touch()
    for n in range(4):
        publish(tenant, "inbox", json.dumps({"n": n}), **{"Content-Type": "application/json",
                                                          "X-Sless-Message-Id": f"m-{n}"})
    until("four dead letters", lambda: queue_counts(rabbitmq_broker, f"{tenant.ns}.inbox.dlq")[0] == 4, 60, POLL)
    listed = dead_letters(tenant)  # in the order they were dead-lettered (retries make it any order)
    order = [item["message_id"] for item in listed["items"]]
    assert sorted(order) == ["m-0", "m-1", "m-2", "m-3"] and not listed["more"]
    first = listed["items"][0]
    assert (first["kind"], first["attempts"], first["status"], first["function"]) == ("failed", 2, 500, "switchable")
    assert "switched to fail" in first["reason"] and "body" not in first
    # first seen at its first delivery, last seen when dead-lettered after its retries (ISO 8601 UTC, same form)
    assert first["first_seen_at"].endswith("Z") and first["failed_at"].endswith("Z")
    assert first["first_seen_at"] < first["failed_at"]
    assert dead_letters(tenant, limit=2)["more"] is True
    assert [i["message_id"] for i in dead_letters(tenant)["items"]] == order  # browsing left them in order
    shown = tenant.api("GET", f"/queues/inbox/dead-letters/{first['id']}", expect=200).json()
    assert json.loads(shown["body"]) == {"n": int(order[0][2:])} and shown["body_encoding"] == "utf-8"

    # another tenant sees none of it: not its namespace, and its own queue of that name has no dead letters
    other_tenant.api("POST", "/ensure", expect=(200, 201))
    resp = requests.get(f"{tenant.url}/v1/namespaces/{tenant.ns}/queues/inbox/dead-letters",
                        headers={"Authorization": f"Bearer {other_tenant.token}"}, timeout=10)
    assert resp.status_code == 403
    assert dead_letters(other_tenant, expect=404)["error"]
    other_tenant.api("POST", "/queues/inbox/dead-letters/purge", json={"all": True}, expect=404)
    assert queue_counts(rabbitmq_broker, f"{tenant.ns}.inbox.dlq")[0] == 4

    (tmp_path / "fail").unlink()
    redriven = tenant.api("POST", "/queues/inbox/dead-letters/redrive", json={"ids": [first["id"]]}, expect=200)
    assert redriven.json() == {"redriven": 1, "more": False}
    until("the redriven message handled", lambda: len(calls(tmp_path)) == 1, 60, POLL)
    assert calls(tmp_path)[0]["data"] == {"n": int(order[0][2:])}
    again = tenant.api("POST", "/queues/inbox/dead-letters/redrive", json={"ids": [first["id"]]}, expect=200)
    assert again.json()["redriven"] == 0  # gone from the dead letters: nothing runs twice
    tenant.api("GET", f"/queues/inbox/dead-letters/{first['id']}", expect=404)

    second = dead_letters(tenant)["items"][0]
    purged = tenant.api("POST", "/queues/inbox/dead-letters/purge", json={"ids": [second["id"]]}, expect=200)
    assert purged.json() == {"purged": 1, "more": False}
    assert [i["message_id"] for i in dead_letters(tenant)["items"]] == order[2:]
    tenant.api("POST", "/queues/inbox/dead-letters/redrive", json={"all": True}, expect=200)
    until("the rest handled", lambda: len(calls(tmp_path)) == 3, 60, POLL)
    assert sorted(c["data"]["n"] for c in calls(tmp_path)) == sorted(int(m[2:]) for m in order if m != order[1])
    assert dead_letters(tenant)["items"] == []


def test_a_redrive_to_another_queue_and_bad_selections(sless_queues: SlessProcess, rabbitmq_broker: RabbitBroker,
                                                        tmp_path: Path) -> None:
    tenant = consumer(sless_queues, rabbitmq_broker, "queues-moved", tmp_path / "a")
    (tmp_path / "a" / "fail").touch()
    publish(tenant, "inbox", json.dumps({"n": 7}), **{"Content-Type": "application/json"})
    until("a dead letter", lambda: queue_counts(rabbitmq_broker, f"{tenant.ns}.inbox.dlq")[0] == 1, 60, POLL)
    tenant.api("POST", "/queues/inbox/dead-letters/redrive", json={"all": True, "to_queue": "nowhere"}, expect=404)
    for bad in ({}, {"ids": []}, {"ids": ["x"]}, {"all": False}, {"all": True, "ids": ["0" * 32]}, {"every": True},
                [1], {"ids": ["0" * 32] * 1001}):
        tenant.api("POST", "/queues/inbox/dead-letters/redrive", json=bad, expect=400)
        tenant.api("POST", "/queues/inbox/dead-letters/purge", json=bad, expect=400)
    tenant.api("POST", "/queues/inbox/dead-letters/purge", json={"all": True, "to_queue": "x"}, expect=400)
    tenant.api("GET", "/queues/inbox/dead-letters/not-an-id", expect=400)
    tenant.api("GET", "/queues/inbox/dead-letters", params={"limit": 0}, expect=400)
    # the other queue's consumer handles the copy
    tenant.deploy("other", "python3.11", {"handler.py": SWITCHABLE}, http=False, timeout_sec=10,
                  env_vars={"OUT_DIR": str(tmp_path / "b")})
    (tmp_path / "b").mkdir()
    tenant.api("POST", "/triggers", json={"name": "on-spare", "type": "event", "function": "other",
                                          "queue": "spare"}, expect=201)
    until("the spare consumer", lambda: queue_counts(rabbitmq_broker, f"{tenant.ns}.spare")[1] == 1, 60, POLL)
    moved = tenant.api("POST", "/queues/inbox/dead-letters/redrive", json={"all": True, "to_queue": "spare"},
                       expect=200)
    assert moved.json()["redriven"] == 1
    until("handled from the other queue", lambda: len(calls(tmp_path / "b")) == 1, 60, POLL)
    assert calls(tmp_path / "b")[0]["data"] == {"n": 7} and calls(tmp_path / "a") == []


def test_queues_without_a_broker_are_422(tenant: Tenant) -> None:
    tenant.api("POST", "/ensure", expect=(200, 201))
    body = tenant.api("POST", "/queues/inbox/messages", data="{}", headers={"Content-Type": "application/json"},
                      expect=422).json()
    assert "SLESS_RABBITMQ_URL" in body["error"]
    tenant.api("GET", "/queues/inbox/dead-letters", expect=422)


def sless(tenant: Tenant, *argv: str, stdin: bytes = b"", expect: int = 0) -> str:
    """The ``sless`` command as the tenant; asserts its exit code and that no traceback reached stderr."""
    env = {**os.environ, "SLESS_TOKEN": tenant.token, "SLESS_URL": tenant.url}
    done = subprocess.run([sys.executable, "-m", "sless_api", *argv], input=stdin, env=env, cwd=REPO,
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == expect, (argv, done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert b"Traceback" not in done.stderr, done.stderr
    return done.stdout.decode() + done.stderr.decode()


def test_the_cli_publishes_and_handles_dead_letters(sless_queues: SlessProcess, rabbitmq_broker: RabbitBroker,
                                                   tmp_path: Path) -> None:
    tenant = consumer(sless_queues, rabbitmq_broker, "queues-cli", tmp_path / "out")
    said = sless(tenant, "publish", "inbox", "--data", '{"n": 1}', "--ce", "type=order.created", "--ce",
                 "source=/shop", "--ce", "id=evt-1", "--ce", "specversion=1.0", "--id", "cli-1")
    assert "published cli-1 to inbox" in said
    (tmp_path / "message.json").write_text('{"n": 2}')
    sless(tenant, "publish", "inbox", "--data", f"@{tmp_path / 'message.json'}")
    until("two calls", lambda: len(calls(tmp_path / "out")) == 2, 60, POLL)
    assert {c["type"] for c in calls(tmp_path / "out")} == {"order.created", "dev.sless.queue.message"}
    (tmp_path / "out" / "fail").touch()
    sless(tenant, "publish", "inbox", "--data", "-", "--id", "cli-3", stdin=b'{"n": 3}')
    until("a dead letter", lambda: queue_counts(rabbitmq_broker, f"{tenant.ns}.inbox.dlq")[0] == 1, 60, POLL)
    [row] = json.loads(sless(tenant, "dlq", "ls", "inbox", "-o", "json"))["items"]
    listed = sless(tenant, "dlq", "ls", "inbox")
    assert listed.splitlines()[0].split()[:3] == ["ID", "MESSAGE", "ID"] and row["id"] in listed
    assert '"n": 3' in sless(tenant, "dlq", "show", "inbox", row["id"])
    (tmp_path / "out" / "fail").unlink()
    assert "redriven: 1" in sless(tenant, "dlq", "redrive", "inbox", row["id"])
    until("the redriven call", lambda: len(calls(tmp_path / "out")) == 3, 60, POLL)
    assert "purged: 0" in sless(tenant, "dlq", "purge", "inbox", "--all")
    # usage errors (exit 2) and the API's refusals (one line, exit 1)
    sless(tenant, "dlq", "redrive", "inbox", expect=2)
    sless(tenant, "dlq", "purge", "inbox", row["id"], "--all", expect=2)
    sless(tenant, "publish", "inbox", "--ce", "no-equals-sign", expect=2)
    assert "HTTP 404" in sless(tenant, "publish", "nobody", "--data", "{}", expect=1)
    assert "HTTP 400" in sless(tenant, "dlq", "show", "inbox", "not-an-id", expect=1)
    assert "HTTP 403" in sless(tenant, "dlq", "ls", "inbox", "-n", "sless-0000000000000000", expect=1)
