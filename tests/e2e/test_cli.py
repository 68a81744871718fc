"""The `sless` CLI as a user runs it (a process against `sless up`): functions, triggers, jobs, source, logs."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from sless_core.release import platform_version
from tests.support.platform import REPO, SlessProcess, Tenant, sless_cli, table_rows

pytestmark = pytest.mark.e2e

EXAMPLE = REPO / "examples" / "hello-python"


sless = sless_cli


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout)


@pytest.fixture
def deployed(tenant: Tenant) -> Tenant:
    sless(tenant, "deploy", str(EXAMPLE), "--name", "hello")
    return tenant


def test_ls_rm_and_json_output(deployed: Tenant) -> None:
    [row] = table_rows(sless(deployed, "ls").stdout)
    assert row[:3] == ["hello", "python3.11", "Ready"]
    [item] = as_json(sless(deployed, "ls", "-o", "json"))["items"]
    assert item["name"] == "hello" and item["phase"] == "Ready"
    sless(deployed, "rm", "hello")
    assert as_json(sless(deployed, "ls", "--output", "json"))["items"] == []
    assert sless(deployed, "ls").stdout == ""
    failed = sless(deployed, "rm", "hello", expect=1)
    assert "HTTP 404" in failed.stderr


def test_triggers_are_added_listed_toggled_and_removed(deployed: Tenant) -> None:
    added = as_json(sless(deployed, "trigger", "add", "nightly", "--function", "hello", "--type", "cron",
                          "--schedule", "0 3 * * *", "--disabled", "-o", "json"))
    assert (added["type"], added["schedule"], added["enabled"]) == ("cron", "0 3 * * *", False)
    rows = table_rows(sless(deployed, "trigger", "ls").stdout)
    assert ["nightly", "cron", "hello", "disabled", "-", "0", "3", "*", "*", "*"] in rows, rows
    [http] = [r for r in rows if r[0] == "hello"]
    assert http[1:5] == ["http", "hello", "enabled", "public"] and http[5] == deployed.fn_url("hello"), "URL in full"
    assert table_rows(sless(deployed, "trigger", "enable", "nightly").stdout)[0][3] == "enabled"
    assert table_rows(sless(deployed, "trigger", "disable", "nightly").stdout)[0][3] == "disabled"
    only = as_json(sless(deployed, "trigger", "ls", "--function", "hello", "-o", "json"))["items"]
    assert sorted(t["name"] for t in only) == ["hello", "nightly"]  # deploy made the http one
    sless(deployed, "trigger", "rm", "nightly")
    assert [t["name"] for t in as_json(sless(deployed, "trigger", "ls", "-o", "json"))["items"]] == ["hello"]


def test_scale_from_sless_json_then_changed_shown_and_removed(tenant: Tenant, tmp_path: Path) -> None:
    """``"scale"`` in sless.json is the function's; ``sless scale`` changes only the flags given, ``--off`` removes
    it; ``sless get`` and ``sless ls`` show it; the warm process (min 1) answers calls."""
    folder = tmp_path / "elastic"
    folder.mkdir()
    (folder / "handler.py").write_text("def handle(event):\n    return 'up'\n")
    (folder / "sless.json").write_text(json.dumps({"runtime": "python3.11", "scale": {"min": 1, "max": 3}}))
    sless(tenant, "deploy", str(folder))
    defaults = {"target": 10, "idle_sec": 300}
    assert tenant.api("GET", "/functions/elastic", expect=200).json()["scale"] == {"min": 1, "max": 3, **defaults}
    assert requests.get(tenant.fn_url("elastic"), timeout=60).text == "up"
    assert table_rows(sless(tenant, "ls").stdout)[0][:4] == ["elastic", "python3.11", "Ready", "scale:1-3"]

    shown = sless(tenant, "scale", "elastic", "--max", "6", "--idle-sec", "60").stdout.strip()
    assert shown == "elastic: 1..6 replicas, target 10 calls in flight per replica, back to 1 after 60s without calls"
    changed = as_json(sless(tenant, "scale", "elastic", "--target", "2", "-o", "json"))["scale"]
    assert changed == {"min": 1, "max": 6, "target": 2, "idle_sec": 60}, "only the given flags change"
    assert "scale:           1..6 replicas, target 2" in sless(tenant, "get", "elastic").stdout
    assert sless(tenant, "scale", "elastic").stdout.startswith("elastic: 1..6 replicas"), "no flag: shown"

    bad = sless(tenant, "scale", "elastic", "--min", "7", expect=1).stderr
    assert "HTTP 400" in bad and "scale.min (7) must not exceed scale.max (6)" in bad
    assert len(bad.strip().splitlines()) == 1
    assert "HTTP 400" in sless(tenant, "scale", "elastic", "--idle-sec", "1", expect=1).stderr
    assert "give it alone" in sless(tenant, "scale", "elastic", "--off", "--max", "2", expect=1).stderr
    assert "HTTP 404" in sless(tenant, "scale", "nothing-here", "--max", "2", expect=1).stderr

    assert sless(tenant, "scale", "elastic", "--off").stdout.strip() == "elastic: fixed replicas (no scale)"
    assert tenant.api("GET", "/functions/elastic", expect=200).json()["scale"] is None
    assert table_rows(sless(tenant, "ls").stdout)[0][3] == "fixed"
    fresh = as_json(sless(tenant, "scale", "elastic", "--max", "2", "-o", "json"))["scale"]
    assert fresh == {"min": 0, "max": 2, **defaults}, "a function without scale gets the defaults for the rest"


def test_bad_trigger_input_is_one_line_from_the_api(deployed: Tenant) -> None:
    failed = sless(deployed, "trigger", "add", "bad", "--function", "hello", "--type", "cron", "--schedule",
                   "61 * * * *", expect=1)
    assert failed.stderr.startswith("sless: POST ") and "HTTP 400" in failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1


def test_jobs_run_rerun_list_and_get(deployed: Tenant) -> None:
    first = as_json(sless(deployed, "job", "run", "once", "--function", "hello", "--event", '{"name": "cli"}',
                          "--wait", "120", "-o", "json"))
    assert (first["run_id"], first["phase"]) == (1, "Succeeded") and "cli" in first["message"]
    again = as_json(sless(deployed, "job", "run", "once", "--wait", "120", "-o", "json"))
    assert (again["run_id"], again["phase"]) == (2, "Succeeded")
    [listed] = as_json(sless(deployed, "job", "ls", "-o", "json"))["items"]
    assert (listed["name"], listed["run_id"]) == ("once", 2)
    row = table_rows(sless(deployed, "job", "get", "once").stdout)[0]
    assert row[:4] == ["once", "hello", "2", "Succeeded"]
    sless(deployed, "job", "rm", "once")
    assert as_json(sless(deployed, "job", "ls", "-o", "json"))["items"] == []


def test_job_mistakes_are_explained(deployed: Tenant) -> None:
    assert "--function is needed" in sless(deployed, "job", "run", "new-job", expect=1).stderr
    assert "--event is not JSON" in sless(deployed, "job", "run", "j", "--function", "hello", "--event", "{",
                                          expect=1).stderr
    sless(deployed, "job", "run", "j", "--function", "hello")
    assert "runs hello, not other" in sless(deployed, "job", "run", "j", "--function", "other", expect=1).stderr


def test_source_prints_or_writes_the_uploaded_files(deployed: Tenant, tmp_path: Path) -> None:
    printed = sless(deployed, "source", "hello").stdout
    assert "==> handler.py <==" in printed and (EXAMPLE / "handler.py").read_text().strip() in printed
    sless(deployed, "source", "hello", "--out", str(tmp_path / "copy"))
    assert (tmp_path / "copy" / "handler.py").read_bytes() == (EXAMPLE / "handler.py").read_bytes()


def test_logs_show_calls_with_request_ids_and_follow_new_ones(deployed: Tenant, sless: SlessProcess) -> None:
    requests.get(deployed.fn_url("hello"), headers={"X-Request-Id": "cli-before"}, timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lines = json.loads(sless_cli(deployed, "logs", "hello", "-o", "json"))["items"]  # the API's answer
        if any(line["request_id"] == "cli-before" for line in lines):
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"no record of the call: {lines}")
    env = {**os.environ, "SLESS_TOKEN": deployed.token, "SLESS_URL": deployed.url}
    follower = subprocess.Popen([sys.executable, "-m", "sless_api", "logs", "hello", "--follow", "--interval",
                                 "0.2", "--limit", "1", "-o", "json"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                                text=True)  # fmt: skip
    try:
        assert follower.stdout is not None
        first = json.loads(follower.stdout.readline())  # the one recent record: --follow streams JSON lines
        assert first["request_id"] == "cli-before", first
        requests.get(deployed.fn_url("hello"), headers={"X-Request-Id": "cli-followed"}, timeout=30)
        ready, _, _ = select.select([follower.stdout], [], [], 30)
        assert ready, "--follow printed nothing for a new call within 30 s"
        assert json.loads(follower.stdout.readline())["request_id"] == "cli-followed"
    finally:
        follower.kill()
        follower.wait(10)


def test_logs_id_prints_what_one_call_wrote(tenant: Tenant) -> None:
    tenant.deploy("talker", "python3.11", {"handler.py": (
        "import sys\ndef handle(event):\n    print('said', event['_query'].get('w'))\n"
        "    print('warned', file=sys.stderr)\n    return 1\n")})
    requests.get(tenant.fn_url("talker"), params={"w": "one"}, headers={"X-Request-Id": "talk-1"}, timeout=30)
    requests.get(tenant.fn_url("talker"), params={"w": "two"}, headers={"X-Request-Id": "talk-2"}, timeout=30)
    deadline = time.monotonic() + 30
    records: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline and len(records) < 2:
        records = {line["request_id"]: line for line in json.loads(sless_cli(
            tenant, "logs", "talker", "-o", "json"))["items"]}
        time.sleep(0.2)
    first = records["talk-1"]
    table = sless_cli(tenant, "logs", "talker")
    assert any(row.split()[0] == str(first["id"]) and "cold" in row.split() for row in table.splitlines()), table
    done = sless(tenant, "logs", "talker", "--id", str(first["id"]))
    assert done.stdout == "said one\n" and done.stderr == "warned\n"
    raw = json.loads(sless_cli(tenant, "logs", "talker", "--id", str(first["id"]), "-o", "json"))
    assert raw["truncated"] is False and {line["text"] for line in raw["lines"]} == {"said one", "warned"}
    missing = sless(tenant, "logs", "talker", "--id", "999999999", expect=1)
    assert "no invocation" in missing.stderr and "Traceback" not in missing.stderr
    assert "invalid int" in sless(tenant, "logs", "talker", "--id", "x", expect=2).stderr


def test_logs_follow_prints_each_calls_output_under_it(tenant: Tenant) -> None:
    """--follow follows what the function writes, not only its records: each new call's lines under its row
    (stderr's marked), in JSON its ``output``; --no-output the records alone."""
    tenant.deploy("follower", "python3.11", {"handler.py": (
        "import sys\ndef handle(event):\n    print('said', event['_query'].get('w'))\n"
        "    print('warned', event['_query'].get('w'), file=sys.stderr)\n    return 1\n")})
    env = {**os.environ, "SLESS_TOKEN": tenant.token, "SLESS_URL": tenant.url}

    def follow(*extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "sless_api", "logs", "follower", "--follow", "--interval",
                                 "0.2", "--limit", "1", *extra], env=env, cwd=REPO, stdout=subprocess.PIPE,
                                text=True)  # fmt: skip

    pending: dict[int, bytes] = {}

    def read_until(proc: subprocess.Popen[str], done: Callable[[str], bool]) -> list[str]:
        """Lines as they come, read from the pipe itself (a buffered reader would hide what it read ahead
        from ``select``) until one is DONE."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        got: list[str] = []
        deadline = time.monotonic() + 30
        while not got or not done(got[-1]):
            if b"\n" in pending.get(fd, b""):
                line, pending[fd] = pending[fd].split(b"\n", 1)
                got.append(line.decode())
                continue
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"--follow printed {got} within 30 s"
            chunk = os.read(fd, 65536)
            assert chunk, f"--follow ended after {got}"
            pending[fd] = pending.get(fd, b"") + chunk
        return got

    table, as_json, bare = follow(), follow("-o", "json"), follow("--no-output")
    try:
        requests.get(tenant.fn_url("follower"), params={"w": "one"}, headers={"X-Request-Id": "follow-1"},
                     timeout=30)
        rows = read_until(table, lambda line: line == "    ! warned one")
        assert rows[0].split()[:2] == ["ID", "STARTED"] and "follow-1" in rows[1], rows  # the header, first row
        assert rows[2:] == ["    | said one", "    ! warned one"], rows
        record = json.loads(read_until(as_json, lambda line: "follow-1" in line)[-1])
        assert [(x["stream"], x["text"]) for x in record["output"]["lines"]] == [("stdout", "said one"),
                                                                                ("stderr", "warned one")]
        requests.get(tenant.fn_url("follower"), params={"w": "two"}, headers={"X-Request-Id": "follow-2"},
                     timeout=30)
        plain = read_until(bare, lambda line: "follow-2" in line)
        assert not any("said" in line or "warned" in line for line in plain), plain
    finally:
        for proc in (table, as_json, bare):
            proc.kill()
            proc.wait(10)


def sless_cli(tenant: Tenant, *argv: str) -> str:
    return sless(tenant, *argv).stdout


def test_completion_offers_verbs_sub_verbs_and_flags(tenant: Tenant) -> None:
    script = sless(tenant, "completion", "bash").stdout

    def complete(*words: str) -> list[str]:
        probe = (f'{script}\nCOMP_WORDS=({" ".join(words)}); COMP_CWORD={len(words) - 1}; _sless; '
                 'printf "%s\\n" "${COMPREPLY[@]}"')
        return subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True,
                              timeout=30).stdout.split()

    assert complete("sless", "tr") == ["trigger", "traffic"]
    assert complete("sless", "ro") == ["rollback"]
    assert complete("sless", "vers") == ["versions"]
    assert {"--split", "--clear", "--namespace"} <= set(complete("sless", "traffic", "canary", "--"))
    assert complete("sless", "trigger", "") == ["ls", "add", "enable", "disable", "rm", "--help"]
    assert "--schedule" in complete("sless", "trigger", "add", "nightly", "--s")
    assert complete("sless", "job", "run", "x", "--ev") == ["--event"]
    assert complete("sless", "sc") == ["scale"]
    assert {"--min", "--max", "--target", "--idle-sec", "--off"} <= set(complete("sless", "scale", "fn", "--"))


@pytest.mark.parametrize("argv", [("ls",), ("ls", "-o", "json"), ("completion", "bash"), ("get", "hello")])
def test_a_reader_that_leaves_early_ends_the_cli_quietly(deployed: Tenant, argv: tuple[str, ...]) -> None:
    """`sless ls | head`: the reader is gone before the CLI writes (its pipe's read end closed first, so every
    write fails), and the CLI stops as a tool killed by SIGPIPE does: status 141, nothing on stderr (it said
    'cannot reach the API (BrokenPipeError)')."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {**os.environ, "SLESS_TOKEN": deployed.token, "SLESS_URL": deployed.url}
    try:
        done = subprocess.run([sys.executable, "-m", "sless_api", *argv], env=env, cwd=REPO, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, ""), (done.returncode, done.stderr)


def test_sless_up_on_a_port_in_use_says_so_and_nothing_else(tmp_path: Path) -> None:
    """The port is bound before the banner: a port in use is the one line printed, no 'serving on' before it."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLESS_")}
        done = subprocess.run([sys.executable, "-m", "sless_api", "up", "--port", str(port), "--data-dir",
                               str(tmp_path / "data")], env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.strip() == f"sless up: cannot listen on 127.0.0.1:{port}: Address already in use", done.stderr


def test_invoke_writes_a_binary_answer_byte_for_byte(tenant: Tenant, tmp_path: Path) -> None:
    """1,024 bytes of every value come out as those 1,024 bytes (they came out as 2,049: decoded and re-encoded)."""
    folder = tmp_path / "bytes"
    folder.mkdir()
    (folder / "handler.py").write_text("def handle(event):\n    return bytes(range(256)) * 4\n")
    sless(tenant, "deploy", str(folder), "--name", "bytes")
    env = {**os.environ, "SLESS_TOKEN": tenant.token, "SLESS_URL": tenant.url}
    done = subprocess.run([sys.executable, "-m", "sless_api", "invoke", "bytes"], env=env, cwd=REPO,
                          capture_output=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == bytes(range(256)) * 4


@pytest.mark.parametrize(("make", "words"), [
    (lambda d: None, "is not a folder"),  # missing
    (lambda d: d.mkdir(), "has no code to deploy"),  # empty
    (lambda d: (d.mkdir(), (d / "sless.json").write_text('{"runtime": "python3.11"}')), "has no code to deploy"),
    (lambda d: (d.mkdir(), (d / "handler.py").write_text("x = 1\n"), (d / "sless.json").write_text("{oops")),
     "is not JSON"),
    (lambda d: (d.mkdir(), (d / "handler.py").write_text("x = 1\n"), (d / "sless.json").mkdir()),
     "cannot read"),
])  # fmt: skip
def test_a_deploy_that_cannot_upload_creates_nothing(tenant: Tenant, tmp_path: Path, make: Any, words: str) -> None:
    folder = tmp_path / "code"
    make(folder)
    done = sless(tenant, "deploy", str(folder), "--name", "never", expect=1)
    assert words in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert tenant.api("GET", "/functions/never").status_code == 404


def test_a_manifest_without_a_runtime_falls_back_to_the_files(tenant: Tenant, tmp_path: Path) -> None:
    folder = tmp_path / "node"
    folder.mkdir()
    (folder / "handler.js").write_text("exports.handle = async () => ({ ok: true });\n")
    (folder / "sless.json").write_text('{"memory_mb": 256}')
    sless(tenant, "deploy", str(folder), "--name", "guessed")
    assert tenant.api("GET", "/functions/guessed", expect=200).json()["runtime"] == "nodejs20"


def test_the_cli_and_the_api_say_which_release_they_are(tenant: Tenant) -> None:
    version = platform_version()
    assert sless(tenant, "--version").stdout.strip() == f"sless {version}"
    health = requests.get(f"{tenant.url}/health", timeout=10)
    assert health.status_code == 200 and health.json() == {"status": "ok", "version": version}


def test_deploy_says_where_the_function_answers_and_json_only_when_asked(tenant: Tenant, tmp_path: Path) -> None:
    folder = tmp_path / "said"
    folder.mkdir()
    (folder / "handler.py").write_text("def handle(event):\n    return 'said'\n")
    done = sless(tenant, "deploy", str(folder))
    assert done.stdout == f"said: Ready at {tenant.fn_url('said')}\n"
    scripted = as_json(sless(tenant, "deploy", str(folder), "-o", "json"))
    assert scripted == {"name": "said", "phase": "Ready", "url": tenant.fn_url("said"), "message": scripted["message"]}


def test_invoke_says_the_http_status_of_a_failed_call(tenant: Tenant, tmp_path: Path) -> None:
    folder = tmp_path / "teapot"
    folder.mkdir()
    (folder / "handler.py").write_text(
        "def handle(event):\n    return {'statusCode': 418, 'body': 'short and stout'}\n")
    sless(tenant, "deploy", str(folder))
    done = sless(tenant, "invoke", "teapot", expect=1)
    assert done.stdout == "short and stout\n"
    assert done.stderr.startswith("sless: teapot answered HTTP 418") and done.stderr.count("\n") == 1, done.stderr
    missing = sless(tenant, "invoke", "nothing-here", expect=1)
    assert "sless: nothing-here answered HTTP 404" in missing.stderr
