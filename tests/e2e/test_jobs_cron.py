"""One-shot jobs with run_id semantics, and cron triggers firing on schedule."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.platform import Tenant
from tests.support.poll import holds

pytestmark = pytest.mark.e2e

JOB = """
import sys

def deep(n):
    if n == 0:
        raise ValueError('asked to fail')
    return deep(n - 1)

def handle(event):
    if event.get('fail'):
        sys.stderr.write('diagnostic noise\\n' * 300)
        deep(3)
    return {'doubled': event.get('n', 0) * 2}
"""


def test_job_runs_and_reruns(tenant: Tenant) -> None:
    tenant.deploy("worker", "python3.11", {"handler.py": JOB}, http=False)
    created = tenant.api("POST", "/jobs", json={"name": "j1", "function": "worker", "event": {"n": 21},
                                                "run_id": 1}, expect=201).json()
    assert created["phase"] in ("Pending", "Running", "Succeeded")
    done = tenant.wait_job("j1")
    assert done["phase"] == "Succeeded" and json.loads(done["message"]) == {"doubled": 42}
    assert done["started_at"] and done["completed_at"]

    dup = tenant.api("POST", "/jobs", json={"name": "j1", "function": "worker", "event": {}}, expect=409).json()
    assert dup["existing"]["phase"] == "Succeeded"

    again = tenant.api("PATCH", "/jobs/j1", json={"run_id": 2}, expect=200).json()
    assert again["run_id"] == 2
    assert tenant.wait_job("j1")["phase"] == "Succeeded"
    tenant.api("PATCH", "/jobs/j1", json={"run_id": 1}, expect=400)
    tenant.api("DELETE", "/jobs/j1", expect=204)
    tenant.api("GET", "/jobs/j1", expect=404)


def test_run_id_zero_only_records(tenant: Tenant) -> None:
    tenant.deploy("worker", "python3.11", {"handler.py": JOB}, http=False)
    tenant.api("POST", "/jobs", json={"name": "rec", "function": "worker", "event": {"n": 1}, "run_id": 0},
               expect=201)
    holds("a run_id 0 job stays Recorded",
          lambda: tenant.api("GET", "/jobs/rec", expect=200).json()["phase"] == "Recorded", for_sec=1.0,
          why="a job that runs is started as it is created (a task spawned in the request) and leaves "
          "Recorded at once; 1 s covers that")
    tenant.api("PATCH", "/jobs/rec", json={"run_id": 1}, expect=200)
    assert tenant.wait_job("rec")["phase"] == "Succeeded"


def test_failed_job_keeps_the_truncated_traceback(tenant: Tenant) -> None:
    tenant.deploy("worker", "python3.11", {"handler.py": JOB}, http=False)
    tenant.api("POST", "/jobs", json={"name": "bad", "function": "worker", "event": {"fail": True}}, expect=201)
    done = tenant.wait_job("bad")
    assert done["phase"] == "Failed"
    assert done["message"].rstrip().endswith("ValueError: asked to fail")
    assert "truncated" in done["message"] and len(done["message"]) <= 2100
    # The message is the tenant's to read: where in its code, never where the platform keeps code or runtimes.
    assert 'File "./handler.py", line 6, in deep' in done["message"], done["message"]
    assert 'File "/' not in done["message"], done["message"]


def test_job_for_missing_function_is_404_and_bad_specs_400(tenant: Tenant) -> None:
    tenant.api("POST", "/jobs", json={"name": "x", "function": "ghost"}, expect=404)
    tenant.api("POST", "/functions", json={"name": "f", "runtime": "python3.11"}, expect=201)
    tenant.api("POST", "/jobs", json={"name": "x", "function": "f", "event": [1]}, expect=400)
    tenant.api("POST", "/jobs", json={"name": "x", "function": "f", "run_id": -1}, expect=400)
    tenant.api("POST", "/jobs", json={"name": "X_", "function": "f"}, expect=400)


@pytest.mark.slow
def test_cron_trigger_fires_and_can_be_disabled(tenant: Tenant) -> None:
    code = ("def handle(event):\n    print('tick at', event.get('schedule'))\n"
            "    return {'type': event.get('type'), 'schedule': event.get('schedule')}\n")
    tenant.deploy("ticker", "python3.11", {"handler.py": code}, http=False)
    tenant.api("POST", "/triggers", json={"name": "every-minute", "type": "cron", "function": "ticker",
                                          "schedule": "* * * * *"}, expect=201)
    deadline = time.monotonic() + 75
    fired = None
    while time.monotonic() < deadline:
        fired = tenant.api("GET", "/triggers/every-minute", expect=200).json()
        # last_fired_at is stamped as the tick starts ("firing the tick of ..."); the run's outcome follows
        if fired["last_fired_at"] and not fired["message"].startswith("firing"):
            break
        time.sleep(1)
    assert fired and fired["last_fired_at"], fired
    assert fired["message"] == "last run: succeeded", fired
    deadline = time.monotonic() + 10  # the invocation log writes in batches, off the call's path
    items: list[dict[str, object]] = []
    while time.monotonic() < deadline and not any(i["trigger"] == "cron" for i in items):
        items = tenant.api("GET", "/functions/ticker/invocations", expect=200).json()["items"]
        time.sleep(0.2)
    firing = next((i for i in items if i["trigger"] == "cron"), None)
    assert firing is not None and firing["status"] == 200 and firing["version"] == 1, items
    # what the firing printed is kept with its record, as a call's lines are (`sless logs ticker --id N`)
    printed = tenant.api("GET", f"/functions/ticker/invocations/{firing['id']}/logs", expect=200).json()
    assert [(x["stream"], x["text"]) for x in printed["lines"]] == [("stdout", "tick at * * * * *")], printed
    tenant.api("PATCH", "/triggers/every-minute", json={"enabled": False}, expect=200)
    assert tenant.api("GET", "/triggers/every-minute", expect=200).json()["enabled"] is False


@pytest.mark.parametrize(("runtime", "files"), [
    ("python3.11", {"handler.py": "def handle(event):\n    print('progress: half way')\n"
                                  "    return {'n': event['n']}\n"}),
    ("nodejs20", {"handler.js": "exports.handle = async (event) => {\n  console.log('progress: half way');\n"
                                "  return { n: event.n };\n};\n"}),
])
def test_a_jobs_message_is_its_result_not_what_the_handler_printed(tenant: Tenant, runtime: str,
                                                                   files: dict[str, str]) -> None:
    tenant.deploy("chatty", runtime, files, http=False)
    tenant.api("POST", "/jobs", json={"name": "talk", "function": "chatty", "event": {"n": 7}}, expect=201)
    done = tenant.wait_job("talk")
    assert done["phase"] == "Succeeded", done
    assert json.loads(done["message"]) == {"n": 7}
