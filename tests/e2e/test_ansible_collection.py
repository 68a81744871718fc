"""The sless.platform collection's modules through ansible-playbook against a real `sless up`:
idempotence, check mode, diff mode, state absent, and the API's errors as clear task failures."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.platform import REPO, Tenant

pytestmark = pytest.mark.e2e

PLAYBOOK_BIN = Path(sys.executable).parent / "ansible-playbook"
VALUE = "ansible-pw-51c0e9b2"
HANDLER = """\
import os

def handle(event):
    return {"hello": event.get("name", "world"), "has_secret": bool(os.environ.get("DB_PASSWORD")),
            "version": VERSION}

VERSION = 1
"""


def play(tenant: Tenant, tmp: Path, tasks: list[dict[str, Any]], *flags: str, token_env: bool = True,
         **extra_vars: Any) -> subprocess.CompletedProcess[str]:
    """Run TASKS (as YAML-compatible JSON) in one play on localhost; the token from the environment."""
    book = [{"name": "sless", "hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": tasks}]
    path = tmp / f"play-{len(list(tmp.glob('play-*.yml')))}.yml"
    path.write_text(json.dumps(book))
    env = {**os.environ, "SLESS_URL": tenant.url, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": f"{REPO}:{REPO / '.ansible/collections'}", "ANSIBLE_RETRY_FILES_ENABLED": "0"}
    env.pop("SLESS_TOKEN", None)
    if token_env:
        env["SLESS_TOKEN"] = tenant.token
    argv = [str(PLAYBOOK_BIN), "-i", "localhost,", str(path), "-e", f"ansible_python_interpreter={sys.executable}",
            "-e", json.dumps(extra_vars), *flags]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False, cwd=tmp)


def recap(proc: subprocess.CompletedProcess[str]) -> dict[str, int]:
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("localhost") and "changed=" in ln)
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def deploy_tasks(source: Path, run_id: int = 1) -> list[dict[str, Any]]:
    return [
        {"name": "secret", "sless.platform.sless_secret": {"name": "db", "data": {"password": "{{ db_password }}"}},
         "no_log": True},
        {"name": "function", "sless.platform.sless_function": {
            "name": "hello", "runtime": "python3.11", "source_dir": str(source), "memory_mb": 128,
            "env_vars": {"GREETING": "hi"}, "secrets": [{"name": "db", "key": "password", "env": "DB_PASSWORD"}]}},
        {"name": "trigger", "sless.platform.sless_trigger": {"name": "hello", "type": "http", "function": "hello"}},
        {"name": "job", "sless.platform.sless_job": {"name": "once", "function": "hello", "event": {"name": "job"},
                                                     "run_id": run_id}},
    ]


def source_dir(tmp: Path, version: int = 1) -> Path:
    folder = tmp / "hello"
    folder.mkdir(exist_ok=True)
    (folder / "handler.py").write_text(HANDLER.replace("VERSION = 1", f"VERSION = {version}"))
    (folder / "__pycache__").mkdir(exist_ok=True)
    (folder / "__pycache__" / "handler.cpython-311.pyc").write_bytes(os.urandom(32))  # never part of the code
    return folder


def test_deploy_is_idempotent_and_checked_before_it_writes(tenant: Tenant, tmp_path: Path) -> None:
    folder = source_dir(tmp_path)
    tasks = deploy_tasks(folder)

    checked = play(tenant, tmp_path, tasks, "--check", "--diff", db_password=VALUE)
    assert checked.returncode == 0 and recap(checked)["changed"] == 4, checked.stdout[-3000:]
    assert VALUE not in checked.stdout + checked.stderr
    assert tenant.api("GET", "/functions/hello").status_code in (403, 404)
    assert tenant.api("GET", "/secrets/db").status_code in (403, 404)

    first = play(tenant, tmp_path, tasks, "--diff", db_password=VALUE)
    assert first.returncode == 0, first.stdout[-3000:]
    assert recap(first)["changed"] == 4, first.stdout[-3000:]
    assert VALUE not in first.stdout + first.stderr
    answer = requests.post(tenant.fn_url("hello"), json={"name": "ann"}, timeout=30).json()
    assert answer == {"hello": "ann", "has_secret": True, "version": 1}
    job = tenant.api("GET", "/jobs/once", expect=200).json()
    assert job["phase"] == "Succeeded" and json.loads(job["message"])["hello"] == "job"

    (folder / "__pycache__" / "handler.cpython-311.pyc").write_bytes(os.urandom(32))  # not source: no change
    again = play(tenant, tmp_path, tasks, db_password=VALUE)
    assert again.returncode == 0 and recap(again)["changed"] == 0, again.stdout[-3000:]

    # New code: only the function changes (upload, wait for Ready); a larger run_id runs the job again.
    source_dir(tmp_path, version=2)
    diffed = play(tenant, tmp_path, deploy_tasks(folder, run_id=2), "--diff", db_password=VALUE)
    assert diffed.returncode == 0 and recap(diffed)["changed"] == 2, diffed.stdout[-3000:]
    assert "code_hash" in diffed.stdout and "run_id" in diffed.stdout
    assert requests.post(tenant.fn_url("hello"), json={}, timeout=30).json()["version"] == 2
    assert tenant.api("GET", "/jobs/once", expect=200).json()["run_id"] == 2

    info = play(tenant, tmp_path, [{"sless.platform.sless_info": {}, "register": "everything"},
                                   {"ansible.builtin.copy": {"content": "{{ everything | to_json }}",
                                                             "dest": str(tmp_path / "info.json")}}])
    assert info.returncode == 0, info.stdout[-2000:]
    seen = json.loads((tmp_path / "info.json").read_text())
    assert [f["name"] for f in seen["functions"]] == ["hello"] and seen["secrets"][0]["keys"] == ["password"]
    assert seen["namespace"] == tenant.ns and VALUE not in json.dumps(seen)

    gone = [{"sless.platform.sless_job": {"name": "once", "state": "absent"}},
            {"sless.platform.sless_trigger": {"name": "hello", "state": "absent"}},
            {"sless.platform.sless_function": {"name": "hello", "state": "absent"}},
            {"sless.platform.sless_secret": {"name": "db", "state": "absent"}}]
    removed = play(tenant, tmp_path, gone, "--diff")
    assert removed.returncode == 0 and recap(removed)["changed"] == 4, removed.stdout[-3000:]
    assert play(tenant, tmp_path, gone).returncode == 0
    assert recap(play(tenant, tmp_path, gone))["changed"] == 0
    tenant.api("GET", "/functions/hello", expect=404)


def test_trigger_methods_and_cors_are_idempotent_as_stated(tenant: Tenant, tmp_path: Path) -> None:
    """The API normalises methods and fills in cors defaults: a playbook stating part of them is not changed again."""
    tenant.api("POST", "/ensure", expect=(200, 201))
    tenant.api("POST", "/functions", json={"name": "f", "runtime": "python3.11"}, expect=201)
    task = {"sless.platform.sless_trigger": {"name": "web", "type": "http", "function": "f", "methods": ["post", "GET"],
                                            "cors": {"origins": ["https://app.example.com"], "headers": ["X-Token"]}}}
    first = play(tenant, tmp_path, [task])
    assert first.returncode == 0 and recap(first)["changed"] == 1, first.stdout[-3000:]
    made = tenant.api("GET", "/triggers/web", expect=200).json()
    assert made["methods"] == ["GET", "POST"]
    assert made["cors"]["headers"] == ["x-token"] and made["cors"]["max_age"] == 600
    assert recap(play(tenant, tmp_path, [task]))["changed"] == 0
    task["sless.platform.sless_trigger"]["cors"]["max_age"] = 60
    assert recap(play(tenant, tmp_path, [task]))["changed"] == 1
    assert tenant.api("GET", "/triggers/web", expect=200).json()["cors"]["max_age"] == 60


def test_check_mode_changes_nothing_and_reports_the_change(tenant: Tenant, tmp_path: Path) -> None:
    tenant.api("POST", "/ensure", expect=(200, 201))
    tenant.api("POST", "/functions", json={"name": "fn", "runtime": "python3.11", "memory_mb": 128}, expect=201)
    tasks = [{"sless.platform.sless_function": {"name": "fn", "memory_mb": 256, "wait": False}},
             {"sless.platform.sless_secret": {"name": "s", "data": {"k": VALUE}}}]
    checked = play(tenant, tmp_path, tasks, "--check", "--diff")
    assert checked.returncode == 0 and recap(checked)["changed"] == 2, checked.stdout[-3000:]
    assert "memory_mb" in checked.stdout and VALUE not in checked.stdout
    assert tenant.api("GET", "/functions/fn", expect=200).json()["memory_mb"] == 128
    tenant.api("GET", "/secrets/s", expect=404)


def test_function_scale_is_set_idempotent_changed_and_removed(tenant: Tenant, tmp_path: Path) -> None:
    """``scale``: only the stated sub-options are compared, so the same task twice changes nothing; the others
    keep their values; ``enabled: false`` removes it; a bad value fails the task with the API's message."""
    tenant.api("POST", "/ensure", expect=(200, 201))
    tenant.api("POST", "/functions", json={"name": "fn", "runtime": "python3.11"}, expect=201)

    def task(scale: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"sless.platform.sless_function": {"name": "fn", "wait": False, "scale": scale}}]

    def scale_now() -> Any:
        return tenant.api("GET", "/functions/fn", expect=200).json()["scale"]

    checked = play(tenant, tmp_path, task({"max": 4, "idle_sec": 60}), "--check", "--diff")
    assert checked.returncode == 0 and recap(checked)["changed"] == 1, checked.stdout[-3000:]
    assert '"scale"' in checked.stdout and scale_now() is None
    for changed in (1, 0):
        ran = play(tenant, tmp_path, task({"max": 4, "idle_sec": 60}))
        assert ran.returncode == 0 and recap(ran)["changed"] == changed, ran.stdout[-3000:]
    assert scale_now() == {"min": 0, "max": 4, "target": 10, "idle_sec": 60}
    ran = play(tenant, tmp_path, task({"target": 2}))
    assert recap(ran)["changed"] == 1 and scale_now() == {"min": 0, "max": 4, "target": 2, "idle_sec": 60}
    assert recap(play(tenant, tmp_path, task({"max": 4})))["changed"] == 0, "equal on what is stated"

    bad = play(tenant, tmp_path, task({"min": 9}))
    assert bad.returncode == 2 and "scale.min (9) must not exceed scale.max (4)" in bad.stdout, bad.stdout[-2000:]
    both = play(tenant, tmp_path, task({"enabled": False, "max": 3}))
    assert both.returncode == 2 and "removes scaling" in both.stdout

    for changed in (1, 0):
        ran = play(tenant, tmp_path, task({"enabled": False}))
        assert ran.returncode == 0 and recap(ran)["changed"] == changed, ran.stdout[-3000:]
    assert scale_now() is None


ERROR_CASES: list[tuple[dict[str, Any], str]] = [
    ({"sless.platform.sless_function": {"name": "Bad_Name", "runtime": "python3.11"}}, "must be a DNS-1123 label"),
    ({"sless.platform.sless_function": {"name": "refs", "runtime": "python3.11", "wait": False,
                                        "secrets": [{"name": "nope", "key": "k", "env": "K"}]}},
     "secret 'nope' does not exist"),
    ({"sless.platform.sless_function": {"name": "noruntime"}}, "runtime is required to create function noruntime"),
    ({"sless.platform.sless_function": {"name": "nodir", "runtime": "python3.11", "source_dir": "/nonexistent"}},
     "source_dir /nonexistent"),
    ({"sless.platform.sless_trigger": {"name": "t", "type": "http", "function": "missing"}},
     "HTTP 404: function 'missing' not found"),
    ({"sless.platform.sless_job": {"name": "j", "function": "missing"}}, "HTTP 404: function 'missing' not found"),
    ({"sless.platform.sless_secret": {"name": "s", "data": {"a/b": "x"}}}, "HTTP 400: data must be 1-63 of"),
    ({"sless.platform.sless_secret": {"name": "s"}}, "state is present but all of the following are missing: data"),
    ({"sless.platform.sless_trigger": {"name": "c", "type": "cron", "function": "f", "schedule": "nope"}},
     "is not a valid 5-field cron expression"),
    ({"sless.platform.sless_trigger": {"name": "d", "type": "http", "function": "f", "delivery": "at_least_once"}},
     "HTTP 400: delivery applies only to event triggers"),
    ({"sless.platform.sless_trigger": {"name": "d", "type": "event", "function": "f", "queue": "q",
                                       "delivery": "twice"}}, "value of delivery must be one of"),
]


def test_api_errors_fail_the_task_with_the_apis_message(tenant: Tenant, tmp_path: Path) -> None:
    """Each bad task fails alone (one play, errors ignored, every result written out), with the API's message."""
    tenant.api("POST", "/ensure", expect=(200, 201))
    tenant.api("POST", "/functions", json={"name": "f", "runtime": "python3.11"}, expect=201)
    tasks: list[dict[str, Any]] = []
    for number, (task, _message) in enumerate(ERROR_CASES):
        tasks.append({**task, "register": f"case{number}", "ignore_errors": True})
    results = ", ".join(f"case{n}" for n in range(len(ERROR_CASES)))
    tasks.append({"ansible.builtin.copy": {"content": f"{{{{ [{results}] | to_json }}}}",
                                           "dest": str(tmp_path / "results.json")}})
    ran = play(tenant, tmp_path, tasks)
    assert ran.returncode == 0 and recap(ran)["ignored"] == len(ERROR_CASES), ran.stdout[-3000:]
    for (task, message), result in zip(ERROR_CASES, json.loads((tmp_path / "results.json").read_text()),
                                       strict=True):
        assert result["failed"] is True and message in result["msg"], (task, result)
        assert "Traceback" not in result["msg"] and "module_stderr" not in result, result
    assert "Traceback" not in ran.stdout
    for name in ("refs", "noruntime", "nodir"):
        tenant.api("GET", f"/functions/{name}", expect=404)


def test_token_from_a_parameter_and_without_one(tenant: Tenant, other_tenant: Tenant, tmp_path: Path) -> None:
    tenant.api("POST", "/ensure", expect=(200, 201))
    with_param = play(tenant, tmp_path, [{"sless.platform.sless_secret": {
        "name": "p", "data": {"k": "v"}, "token": tenant.token}}], token_env=False)
    assert with_param.returncode == 0, with_param.stdout[-2000:]
    tenant.api("GET", "/secrets/p", expect=200)
    none = play(tenant, tmp_path, [{"sless.platform.sless_info": {}}], token_env=False)
    assert none.returncode == 2 and "no token" in none.stdout
    foreign = play(tenant, tmp_path, [{"sless.platform.sless_info": {"namespace": other_tenant.ns}}])
    assert foreign.returncode == 2 and "HTTP 403" in foreign.stdout and "another tenant" in foreign.stdout


def test_job_run_id_semantics(tenant: Tenant, tmp_path: Path) -> None:
    tenant.deploy("worker", "python3.11", {"handler.py": "def handle(event):\n    return {'n': event.get('n')}\n"},
                  http=False)
    recorded = play(tenant, tmp_path, [{"sless.platform.sless_job": {"name": "j", "function": "worker",
                                                                     "run_id": 0, "event": {"n": 1}}}])
    assert recorded.returncode == 0 and recap(recorded)["changed"] == 1
    assert tenant.api("GET", "/jobs/j", expect=200).json()["phase"] == "Recorded"
    ran = play(tenant, tmp_path, [{"sless.platform.sless_job": {"name": "j", "run_id": 1}}])
    assert ran.returncode == 0 and recap(ran)["changed"] == 1
    assert tenant.api("GET", "/jobs/j", expect=200).json()["phase"] == "Succeeded"
    same = play(tenant, tmp_path, [{"sless.platform.sless_job": {"name": "j", "function": "worker", "run_id": 1}}])
    assert same.returncode == 0 and recap(same)["changed"] == 0
    back = play(tenant, tmp_path, [{"sless.platform.sless_job": {"name": "j", "run_id": 0}}])
    assert back.returncode == 2 and "run_id can only grow" in back.stdout
    failing = play(tenant, tmp_path, [{"sless.platform.sless_job": {"name": "boom", "function": "worker",
                                                                    "event": {"n": 1}}}])
    assert failing.returncode == 0  # the function answers; a handler error would fail the task
