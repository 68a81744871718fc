"""Event triggers end to end: `sless up` with SLESS_RABBITMQ_URL, real runtimes, a real broker.

Functions here append what they receive to a file, so "how many times did it run" is a line
count, whatever the platform believes.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from sless_api.services.events.config import EventsConfig
from tests.support.platform import SlessProcess, Tenant, start_sless
from tests.support.poll import holds, until
from tests.support.rabbitmq import RabbitBroker, drain, publish, queue_counts, take_all

pytestmark = [pytest.mark.e2e, pytest.mark.rabbitmq]
POLL = 0.1  # s between looks: events reach a function within milliseconds; some tests act on a stream mid-way

#: SLESS_SANDBOX=off: the recorder below appends to a folder of the test's, which a function's sandbox
#: (rightly) does not show; these tests are about delivery, test_hostile_functions.py about the sandbox.
EVENT_ENV = {"SLESS_EVENT_MAX_RETRIES": "2", "SLESS_EVENT_RETRY_BACKOFF_SEC": "0.1",
             "SLESS_EVENT_RECONNECT_MAX_SEC": "1", "SLESS_SANDBOX": "off"}

#: Appends one JSON line per call: the message id and what the function saw.
RECORDER = """
import json, os, time

def handle(event):
    data = event.get("data")
    if isinstance(data, dict) and data.get("fail"):
        raise ValueError("asked to fail: " + event["id"])
    if isinstance(data, dict) and data.get("sleep"):
        open(os.path.join(os.environ["OUT_DIR"], "started-" + event["id"]), "w").close()
        time.sleep(data["sleep"])
    line = {"id": event["id"], "type": event.get("type"), "source": event.get("source"), "data": data,
            "trigger": event.get("_trigger"), "queue": event.get("_queue")}
    with open(os.path.join(os.environ["OUT_DIR"], "calls.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\\n")
    return {"ok": True}
"""


def lines(out: Path) -> list[dict[str, Any]]:
    path = out / "calls.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def event_attempts(tenant: Tenant) -> list[int]:
    """The ``attempt`` of each of the recorder's event invocation records."""
    return [i["attempt"] for i in tenant.api("GET", "/functions/recorder/invocations", expect=200).json()["items"]
            if i["trigger"] == "event"]


@pytest.fixture(scope="module")
def sless_events(tmp_path_factory: pytest.TempPathFactory, rabbitmq_url: str) -> Iterator[SlessProcess]:
    sp = start_sless(Path(tmp_path_factory.mktemp("sless-events")), {"SLESS_RABBITMQ_URL": rabbitmq_url,
                                                                      **EVENT_ENV})
    yield sp
    code = sp.stop()
    assert code == 0, f"sless up did not stop cleanly ({code}):\n{sp.log_tail()}"


def subscriber(sp: SlessProcess, sub: str, out: Path, queue: str = "inbox",
               broker: RabbitBroker | None = None, **trigger: str) -> Tenant:
    """A tenant with the recorder function subscribed to ``queue`` (consuming when this returns)."""
    out.mkdir(parents=True, exist_ok=True)
    tenant = Tenant(sp.url, sub)
    tenant.deploy("recorder", "python3.11", {"handler.py": RECORDER}, http=False, timeout_sec=10,
                  env_vars={"OUT_DIR": str(out)})
    tenant.api("POST", "/triggers", json={"name": "on-inbox", "type": "event", "function": "recorder",
                                          "queue": queue, **trigger}, expect=201)
    if broker is not None:
        until("the consumer", lambda: queue_counts(broker, f"{tenant.ns}.{queue}")[1] == 1, 60, POLL)
    return tenant


def test_messages_call_the_function_and_are_recorded_as_event_invocations(
        sless_events: SlessProcess, rabbitmq_broker: RabbitBroker, tmp_path: Path) -> None:
    tenant = subscriber(sless_events, "events-delivery", tmp_path, broker=rabbitmq_broker)
    queue = f"{tenant.ns}.inbox"
    trigger = tenant.api("GET", "/triggers/on-inbox", expect=200).json()
    assert queue in trigger["message"] and f"{queue}.dlq" in trigger["message"]
    publish(rabbitmq_broker, queue, [{"n": i} for i in range(10)])
    structured = {"specversion": "1.0", "id": "ce-1", "source": "/shop", "type": "shop.order", "data": {"o": 1}}
    publish(rabbitmq_broker, queue, [json.dumps(structured).encode(), b'{"o": 2}'], lambda i: [
        pika.BasicProperties(content_type="application/cloudevents+json"),
        pika.BasicProperties(content_type="application/json", headers={
            "ce-specversion": "1.0", "ce-id": "ce-2", "ce-source": "/shop", "ce-type": "shop.paid"})][i])
    until("12 calls", lambda: len(lines(tmp_path)) >= 12, 60, POLL)
    by_id = {line["id"]: line for line in lines(tmp_path)}
    assert sorted(by_id) == sorted([f"m{i}" for i in range(10)] + ["ce-1", "ce-2"])
    assert by_id["m3"]["data"] == {"n": 3} and by_id["m3"]["trigger"] == "on-inbox"
    assert by_id["m3"]["queue"] == queue
    assert (by_id["ce-1"]["type"], by_id["ce-1"]["source"], by_id["ce-1"]["data"]) == ("shop.order", "/shop", {"o": 1})
    assert (by_id["ce-2"]["type"], by_id["ce-2"]["data"]) == ("shop.paid", {"o": 2})

    def recorded() -> list[dict[str, Any]]:
        items = tenant.api("GET", "/functions/recorder/invocations", expect=200).json()["items"]
        return [i for i in items if i["trigger"] == "event"]
    until("12 event invocation records", lambda: len(recorded()) == 12, 30, POLL)
    assert {i["status"] for i in recorded()} == {200}
    assert {i["version"] for i in recorded()} == {1}  # every record names the version that answered
    until("the trigger's counters",
          lambda: "12 done" in tenant.api("GET", "/triggers/on-inbox").json()["message"], 20, POLL)
    assert queue_counts(rabbitmq_broker, queue) == (0, 1)


def test_an_event_after_a_new_version_is_served_and_recorded_by_it(
        sless_events: SlessProcess, rabbitmq_broker: RabbitBroker, tmp_path: Path) -> None:
    """The event path keeps a function's route between events: a change of the function must still reach the
    next event at once (its new configuration, its new version number)."""
    tenant = subscriber(sless_events, "events-versions", tmp_path, broker=rabbitmq_broker)
    queue = f"{tenant.ns}.inbox"
    publish(rabbitmq_broker, queue, [{"n": 1}], lambda i: pika.BasicProperties(message_id="before"))
    until("the first event", lambda: len(lines(tmp_path)) == 1, 60, POLL)
    tenant.api("PATCH", "/functions/recorder", json={"env_vars": {"OUT_DIR": str(tmp_path), "MARK": "two"}},
               expect=200)
    tenant.wait_phase("recorder", ("Ready",), 120)
    publish(rabbitmq_broker, queue, [{"n": 2}], lambda i: pika.BasicProperties(message_id="after"))
    until("the second event", lambda: len(lines(tmp_path)) == 2, 60, POLL)

    def versions() -> list[int]:
        return sorted(i["version"] for i in tenant.api("GET", "/functions/recorder/invocations", expect=200)
                      .json()["items"] if i["trigger"] == "event")
    until("both events recorded", lambda: len(versions()) == 2, 30, POLL)
    assert versions() == [1, 2]


def test_a_failing_function_is_retried_then_dead_lettered(sless_events: SlessProcess, rabbitmq_broker: RabbitBroker,
                                                          tmp_path: Path) -> None:
    tenant = subscriber(sless_events, "events-failing", tmp_path, broker=rabbitmq_broker)
    queue = f"{tenant.ns}.inbox"
    publish(rabbitmq_broker, queue, [{"fail": True}, b"not json at all"],
            lambda i: pika.BasicProperties(message_id=["bad-1", "poison-1"][i], content_type="application/json",
                                           delivery_mode=2))
    dead = {p.message_id: p.headers for p, _ in drain(rabbitmq_broker, f"{queue}.dlq", 2, timeout=60)}
    assert dead["bad-1"]["x-sless-kind"] == "failed" and dead["bad-1"]["x-sless-attempts"] == 3
    assert dead["bad-1"]["x-sless-status"] == 500
    assert "ValueError" in dead["bad-1"]["x-sless-reason"] and "asked to fail" in dead["bad-1"]["x-sless-reason"]
    assert dead["poison-1"]["x-sless-kind"] == "malformed"
    assert lines(tmp_path) == []

    def failed() -> list[dict[str, Any]]:
        return [i for i in tenant.api("GET", "/functions/recorder/invocations").json()["items"]
                if i["trigger"] == "event" and i["status"] == 500]
    until("three failed event invocations recorded", lambda: len(failed()) == 3, 30, POLL)
    assert sorted(i["attempt"] for i in failed()) == [1, 2, 3]  # each record says which delivery it was


def test_disable_enable_and_delete(sless_events: SlessProcess, rabbitmq_broker: RabbitBroker, tmp_path: Path) -> None:
    tenant = subscriber(sless_events, "events-lifecycle", tmp_path, broker=rabbitmq_broker)
    queue = f"{tenant.ns}.inbox"
    tenant.api("PATCH", "/triggers/on-inbox", json={"enabled": False}, expect=200)
    until("the consumer to be cancelled", lambda: queue_counts(rabbitmq_broker, queue)[1] == 0, 60, POLL)
    until("the trigger's status to say it no longer consumes",
          lambda: tenant.api("GET", "/triggers/on-inbox").json()["message"].startswith("not consuming"), 60, POLL)
    publish(rabbitmq_broker, queue, [{"n": i} for i in range(5)])
    holds("a disabled trigger's messages stay queued, uncalled",
          lambda: lines(tmp_path) == [] and queue_counts(rabbitmq_broker, queue) == (5, 0), for_sec=2.0,
          why="the consumer is cancelled; one left over would be handed the messages by the broker within "
          "milliseconds and the recorder writes each at once; 2 s is far more")

    tenant.api("PATCH", "/triggers/on-inbox", json={"enabled": True}, expect=200)
    until("the queued messages after enabling", lambda: len(lines(tmp_path)) == 5, 60, POLL)

    tenant.api("DELETE", "/triggers/on-inbox", expect=204)
    until("the consumer to be cancelled on delete", lambda: queue_counts(rabbitmq_broker, queue)[1] == 0, 60, POLL)
    publish(rabbitmq_broker, queue, [{"after": "delete"}], lambda i: pika.BasicProperties(message_id="late"))
    # the queue and its messages belong to the tenant: kept, not consumed
    holds("the late message stays queued after the trigger's deletion",
          lambda: queue_counts(rabbitmq_broker, queue) == (1, 0) and len(lines(tmp_path)) == 5, for_sec=1.0,
          why="the consumer is cancelled; a consumer left over would take the message within milliseconds of the "
          "publish, and a deletion that deleted the queue would show at once; 1 s is far more")

    # Deleting the function deletes its triggers too: a new trigger, then the function goes.
    tenant.api("POST", "/triggers", json={"name": "again", "type": "event", "function": "recorder",
                                          "queue": "inbox"}, expect=201)
    until("the late message", lambda: len(lines(tmp_path)) == 6, 60, POLL)
    tenant.api("DELETE", "/functions/recorder", expect=204)
    until("no consumer after the function went", lambda: queue_counts(rabbitmq_broker, queue)[1] == 0, 60, POLL)


def test_messages_wait_while_the_function_is_not_ready(sless_events: SlessProcess, rabbitmq_broker: RabbitBroker,
                                                      tmp_path: Path) -> None:
    tenant = Tenant(sless_events.url, "events-not-ready")
    tenant.api("POST", "/ensure", expect=(200, 201))
    tenant.api("POST", "/functions", json={"name": "recorder", "runtime": "python3.11", "timeout_sec": 10,
                                           "env_vars": {"OUT_DIR": str(tmp_path)}}, expect=201)
    tenant.api("POST", "/triggers", json={"name": "early", "type": "event", "function": "recorder",
                                          "queue": "inbox"}, expect=201)
    queue = f"{tenant.ns}.inbox"
    conn = rabbitmq_broker.connection()
    conn.channel().queue_declare(queue, durable=True)  # the producer came first
    conn.close()
    publish(rabbitmq_broker, queue, [{"n": i} for i in range(3)])
    holds("no consumer and no dead letter while the function has no code",
          lambda: queue_counts(rabbitmq_broker, queue) == (3, 0)
          and queue_counts(rabbitmq_broker, f"{queue}.dlq") == (0, 0), for_sec=3.0,
          why="the dispatcher starts consuming as soon as it sees an enabled trigger (a change it is told of at "
          "once); a consumer started too early would take the 3 messages, and fail them into the DLQ after 2 "
          "retries of 0.1 s, within a second; 3 s covers that")
    tenant.upload("recorder", {"handler.py": RECORDER})
    tenant.wait_phase("recorder", ("Ready",))
    until("the waiting messages once the function is Ready", lambda: len(lines(tmp_path)) == 3, 60, POLL)
    assert sorted(line["id"] for line in lines(tmp_path)) == ["m0", "m1", "m2"]


def test_bad_event_trigger_specs(sless_events: SlessProcess) -> None:
    tenant = Tenant(sless_events.url, "events-bad-specs")
    tenant.api("POST", "/ensure", expect=(200, 201))
    tenant.api("POST", "/functions", json={"name": "f", "runtime": "python3.11"}, expect=201)
    base = {"name": "t", "type": "event", "function": "f"}
    tenant.api("POST", "/triggers", json=base, expect=400)  # no queue
    for queue in ("", "has space", "slash/ed", "x" * 201, "ünï", 42):
        body = tenant.api("POST", "/triggers", json={**base, "queue": queue}, expect=400).json()
        assert body.get("field") == "queue" or "queue" in body["error"], body
    tenant.api("POST", "/triggers", json={**base, "name": "Bad_Name", "queue": "q"}, expect=400)
    tenant.api("POST", "/triggers", json={**base, "queue": "q", "schedule": "* * * * *"}, expect=400)
    tenant.api("POST", "/triggers", json={**base, "function": "ghost", "queue": "q"}, expect=404)
    tenant.api("POST", "/triggers", json={"name": "h", "type": "http", "function": "f", "queue": "q"}, expect=400)
    tenant.api("POST", "/triggers", json={**base, "queue": "q"}, expect=201)
    tenant.api("POST", "/triggers", json={**base, "queue": "q"}, expect=409)  # same name
    dup = tenant.api("POST", "/triggers", json={**base, "name": "t2", "queue": "q"}, expect=409).json()
    assert "already consumed" in dup["error"]
    tenant.api("PATCH", "/triggers/t", json={"queue": "bad queue"}, expect=400)
    for delivery in ("exactly_once", "", 1, True):
        body = tenant.api("PATCH", "/triggers/t", json={"delivery": delivery}, expect=400).json()
        assert body["field"] == "delivery", body
    assert tenant.api("PATCH", "/triggers/t", json={"delivery": "at_least_once"}, expect=200).json()["delivery"] \
        == "at_least_once"
    tenant.api("POST", "/triggers", json={"name": "h2", "type": "http", "function": "f",
                                          "delivery": "at_least_once"}, expect=400)
    tenant.api("POST", "/triggers", json={**base, "name": "t3", "queue": "q2"}, expect=201)
    tenant.api("PATCH", "/triggers/t3", json={"queue": "q"}, expect=409)
    # Queue names are per tenant: another tenant may use "q" too.
    other = Tenant(sless_events.url, "events-bad-specs-other")
    other.api("POST", "/ensure", expect=(200, 201))
    other.api("POST", "/functions", json={"name": "f", "runtime": "python3.11"}, expect=201)
    other.api("POST", "/triggers", json={**base, "queue": "q"}, expect=201)


def test_event_triggers_without_rabbitmq_are_422(tenant: Tenant) -> None:
    tenant.api("POST", "/ensure", expect=(200, 201))
    tenant.api("POST", "/functions", json={"name": "f", "runtime": "python3.11"}, expect=201)
    body = tenant.api("POST", "/triggers", json={"name": "t", "type": "event", "function": "f", "queue": "q"},
                      expect=422).json()
    assert "SLESS_RABBITMQ_URL" in body["error"]


@pytest.mark.slow
def test_broker_restart_while_consuming(sless_events: SlessProcess, rabbitmq_broker: RabbitBroker,
                                        tmp_path: Path) -> None:
    tenant = subscriber(sless_events, "events-broker-restart", tmp_path, broker=rabbitmq_broker)
    queue = f"{tenant.ns}.inbox"
    publish(rabbitmq_broker, queue, [{"n": i} for i in range(40)])
    until("the stream to start", lambda: len(lines(tmp_path)) >= 5, 60, POLL)
    try:
        rabbitmq_broker.stop()
    finally:
        rabbitmq_broker.start()
    until("the consumer to come back", lambda: queue_counts(rabbitmq_broker, queue)[1] == 1, 60, POLL)
    publish(rabbitmq_broker, queue, [{"n": i} for i in range(40, 50)],
            lambda i: pika.BasicProperties(message_id=f"m{40 + i}", content_type="application/json", delivery_mode=2))
    until("every message after the broker restart",
          lambda: {line["id"] for line in lines(tmp_path)} >= {f"m{i}" for i in range(50)}, 90, POLL)
    ids = [line["id"] for line in lines(tmp_path)]
    assert len(ids) == len(set(ids)), "a message ran twice"


# ------------------------------------------------------------------------------- sless up SIGKILLed


def _restart(sp: SlessProcess) -> SlessProcess:
    sp.stop(signal.SIGKILL)
    return start_sless(sp.data_dir, {k: sp.env[k] for k in ("SLESS_RABBITMQ_URL", *EVENT_ENV)})


@pytest.mark.slow
def test_sigkill_mid_message_runs_the_function_once(rabbitmq_url: str, rabbitmq_broker: RabbitBroker,
                                                    tmp_path: Path) -> None:
    sp = start_sless(tmp_path / "data", {"SLESS_RABBITMQ_URL": rabbitmq_url, **EVENT_ENV})
    try:
        tenant = subscriber(sp, "events-sigkill-one", tmp_path / "out", broker=rabbitmq_broker)
        queue = f"{tenant.ns}.inbox"
        publish(rabbitmq_broker, queue, [{"sleep": 3}], lambda i: pika.BasicProperties(
            message_id="slow-1", content_type="application/json", delivery_mode=2))
        until("the call to start", lambda: (tmp_path / "out" / "started-slow-1").exists(), 60, POLL)
        sp = _restart(sp)  # the runtime finishes the call it holds (it drains on its parent's death)
        [(props, body)] = drain(rabbitmq_broker, f"{queue}.dlq", 1, timeout=60)
        assert props.message_id == "slow-1" and props.headers["x-sless-kind"] == "interrupted"
        assert json.loads(body) == {"sleep": 3}
        until("the interrupted call's own side effect", lambda: len(lines(tmp_path / "out")) >= 1, 60, POLL)
        publish(rabbitmq_broker, queue, [{"n": 2}], lambda i: pika.BasicProperties(
            message_id="after", content_type="application/json", delivery_mode=2))
        until("the next message", lambda: len(lines(tmp_path / "out")) >= 2, 60, POLL)
        holds("no message ran again after the restart",
              lambda: [line["id"] for line in lines(tmp_path / "out")] == ["slow-1", "after"], for_sec=1.0,
              why="a second call of 'after' would write its line within milliseconds of the first; a re-run of "
              "slow-1 (3 s) is what its dead letter above rules out; 1 s covers a quick one")
    finally:
        sp.stop()


@pytest.mark.slow
def test_sigkill_mid_message_with_at_least_once_calls_it_again(rabbitmq_url: str, rabbitmq_broker: RabbitBroker,
                                                               tmp_path: Path) -> None:
    """`delivery: at_least_once`: the interrupted call is made again after the restart, nothing is dead-lettered,
    and a message that had completed before the kill is still not run again."""
    out = tmp_path / "out"
    sp = start_sless(tmp_path / "data", {"SLESS_RABBITMQ_URL": rabbitmq_url, **EVENT_ENV})
    try:
        tenant = subscriber(sp, "events-sigkill-again", out, broker=rabbitmq_broker, delivery="at_least_once")
        assert tenant.api("GET", "/triggers/on-inbox", expect=200).json()["delivery"] == "at_least_once"
        queue = f"{tenant.ns}.inbox"
        publish(rabbitmq_broker, queue, [{"n": 1}], lambda i: pika.BasicProperties(
            message_id="done-1", content_type="application/json", delivery_mode=2))
        until("the first message handled", lambda: len(lines(out)) == 1, 60, POLL)
        publish(rabbitmq_broker, queue, [{"sleep": 3}], lambda i: pika.BasicProperties(
            message_id="slow-1", content_type="application/json", delivery_mode=2))
        until("the call to start", lambda: (out / "started-slow-1").exists(), 60, POLL)
        (out / "started-slow-1").unlink()
        sp = _restart(sp)
        until("the interrupted message called again", lambda: (out / "started-slow-1").exists(), 60, POLL)
        until("both of its calls to end", lambda: [line["id"] for line in lines(out)].count("slow-1") == 2, 60,
              POLL)
        publish(rabbitmq_broker, queue, [{"n": 2}], lambda i: pika.BasicProperties(
            message_id="after", content_type="application/json", delivery_mode=2))
        until("the next message", lambda: [line["id"] for line in lines(out)][-1:] == ["after"], 60, POLL)
        assert [line["id"] for line in lines(out)].count("done-1") == 1  # completed: never run again
        assert queue_counts(rabbitmq_broker, f"{queue}.dlq")[0] == 0
        # The call made again is recorded as the message's second delivery (the first one's record died with the
        # process); a message delivered once is attempt 1.
        restarted = Tenant(sp.url, tenant.sub)  # the restarted process listens on another port
        until("the second delivery recorded as attempt 2", lambda: 2 in event_attempts(restarted), 30, POLL)
        assert set(event_attempts(restarted)) == {1, 2}
    finally:
        sp.stop()


@pytest.mark.slow
def test_sigkill_mid_stream_loses_nothing_and_repeats_nothing(rabbitmq_url: str, rabbitmq_broker: RabbitBroker,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "out"
    sp = start_sless(tmp_path / "data", {"SLESS_RABBITMQ_URL": rabbitmq_url, **EVENT_ENV})
    total = 120
    try:
        tenant = subscriber(sp, "events-sigkill-stream", out, broker=rabbitmq_broker)
        queue = f"{tenant.ns}.inbox"
        publish(rabbitmq_broker, queue, [{"n": i, "sleep": 0.2} for i in range(total)])
        until("part of the stream", lambda: len(lines(out)) >= 30, 60, POLL)
        sp = _restart(sp)
        ids = {f"m{i}" for i in range(total)}
        dead: dict[str, str] = {}

        def settled() -> bool:
            dead.update({p.message_id: p.headers["x-sless-kind"] for p, _ in take_all(rabbitmq_broker, f"{queue}.dlq")})
            return {line["id"] for line in lines(out)} | set(dead) >= ids
        until("every message to be handled or dead-lettered", settled, 120, POLL)

        def once_each() -> bool:
            seen = [line["id"] for line in lines(out)]
            return len(seen) == len(set(seen))

        holds("no message ran twice", once_each, for_sec=1.0,
              why="a message redelivered after the kill runs as the consumer gets it and writes its line when its "
              "0.2 s sleep ends; every message is accounted for, so one left over would show within 1 s")
        assert set(dead.values()) <= {"interrupted"}, dead
        assert len(dead) <= EventsConfig.prefetch  # at most the prefetch window was in flight at the kill
        assert queue_counts(rabbitmq_broker, queue)[0] == 0
    finally:
        sp.stop()
