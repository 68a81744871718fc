"""`sless versions|rollback|traffic` as a user runs them (a process against a real `sless up`)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.platform import Tenant, make_zip, sless_cli, table_rows

pytestmark = pytest.mark.e2e

ONE = "def handle(event):\n    return 'one'\n"
TWO = "def handle(event):\n    return 'two'\n"


sless = sless_cli


def deploy(tenant: Tenant, folder: Path, source: str) -> None:
    """`sless deploy` of a folder holding one handler.py (a version once Ready)."""
    folder.mkdir(exist_ok=True)
    (folder / "handler.py").write_text(source)
    sless(tenant, "deploy", str(folder), "--name", "canary")


def code_hash(source: str) -> str:
    return hashlib.sha256(make_zip({"handler.py": source})).hexdigest()


def rows(done: subprocess.CompletedProcess[str]) -> list[list[str]]:
    return table_rows(done.stdout)


def split_of(tenant: Tenant) -> Any:
    return tenant.api("GET", "/functions/canary/traffic", expect=200).json()["split"]


def test_versions_split_and_rollback(tenant: Tenant, tmp_path: Path) -> None:
    folder = tmp_path / "canary"
    deploy(tenant, folder, ONE)
    deploy(tenant, folder, TWO)

    assert rows(sless(tenant, "versions", "canary")) == [
        ["v2", code_hash(TWO)[:12], rows_date(tenant, 2), "current", "-"],
        ["v1", code_hash(ONE)[:12], rows_date(tenant, 1), "-", "-"],
    ]
    listed = json.loads(sless(tenant, "versions", "canary", "-o", "json").stdout)
    assert listed == tenant.api("GET", "/functions/canary/versions", expect=200).json()
    assert [(v["version"], v["current"]) for v in listed["items"]] == [(2, True), (1, False)]

    assert sless(tenant, "traffic", "canary").stdout == "canary: no split (every call goes to the current version)\n"
    assert json.loads(sless(tenant, "traffic", "canary", "-o", "json").stdout) == {"split": None}

    # set: the table names the current version; the API holds the split in the order given
    done = sless(tenant, "traffic", "canary", "--split", "2=90", "--split", "1=10")
    assert rows(done) == [["v2", "90%", "current"], ["v1", "10%", "-"]]
    assert split_of(tenant) == [{"version": 2, "weight": 90}, {"version": 1, "weight": 10}]
    assert rows(sless(tenant, "traffic", "canary")) == [["v2", "90%", "current"], ["v1", "10%", "-"]]
    assert json.loads(sless(tenant, "traffic", "canary", "-o", "json").stdout) == {
        "split": [{"version": 2, "weight": 90}, {"version": 1, "weight": 10}]}
    assert [row[-1] for row in rows(sless(tenant, "versions", "canary"))] == ["90%", "10%"]

    # a split of one entry, then a 50/50 set as JSON
    assert rows(sless(tenant, "traffic", "canary", "--split", "2=100")) == [["v2", "100%", "current"]]
    half = json.loads(sless(tenant, "traffic", "canary", "--split", "1=50", "--split", "2=50", "-o", "json").stdout)
    assert half == {"split": [{"version": 1, "weight": 50}, {"version": 2, "weight": 50}]}

    cleared = sless(tenant, "traffic", "canary", "--clear")
    assert cleared.stdout == "canary: split cleared (every call goes to the current version)\n"
    assert split_of(tenant) is None
    assert json.loads(sless(tenant, "traffic", "canary", "--clear", "-o", "json").stdout) == {"split": None}

    # rollback waits until version 1's code is the current version (recorded as version 3)
    back = sless(tenant, "rollback", "canary", "1")
    assert back.stdout == (f"canary: version 3 is current (the code and configuration of version 1, "
                           f"code {code_hash(ONE)[:12]})\n")
    assert requests.get(tenant.fn_url("canary"), timeout=30).text == "one"
    assert [row[:4] for row in rows(sless(tenant, "versions", "canary"))] == [
        ["v3", code_hash(ONE)[:12], rows_date(tenant, 3), "current"],
        ["v2", code_hash(TWO)[:12], rows_date(tenant, 2), "-"],
        ["v1", code_hash(ONE)[:12], rows_date(tenant, 1), "-"],
    ]
    # no VERSION: the previous one; -o json prints the version that is now current, as the API lists it
    current = json.loads(sless(tenant, "rollback", "canary", "-o", "json").stdout)
    assert (current["version"], current["code_hash"], current["current"]) == (4, code_hash(TWO), True)
    assert current == tenant.api("GET", "/functions/canary/versions", expect=200).json()["items"][0]
    assert requests.get(tenant.fn_url("canary"), timeout=30).text == "two"
    # --wait 0: the API's answer at once, the rollback still under way
    started = sless(tenant, "rollback", "canary", "3", "--wait", "0")
    assert started.stdout.startswith("canary: rolling back to version 3 (")
    tenant.wait_phase("canary", ("Ready",), code_hash=code_hash(ONE))


def rows_date(tenant: Tenant, version: int) -> str:
    items = tenant.api("GET", "/functions/canary/versions", expect=200).json()["items"]
    return str(next(v["deployed_at"] for v in items if v["version"] == version))


def test_bad_input_is_one_clear_line_and_a_failing_exit_code(tenant: Tenant, other_tenant: Tenant,
                                                              tmp_path: Path) -> None:
    deploy(tenant, tmp_path / "canary", ONE)

    def fails(*argv: str, expect: int = 1) -> str:
        done = sless(tenant, *argv, expect=expect)
        assert done.stdout == ""
        return done.stderr

    # the shape of --split is checked before anything is sent
    for bad in ("1=abc", "abc", "1=", "=50", "1=-5", "1:100", "1=50%"):
        message = fails("traffic", "canary", "--split", bad)
        assert message == f"sless: --split expects VERSION=WEIGHT in whole numbers (e.g. --split 3=90), not {bad!r}\n"
    # the rest is the API's to judge: its status and its own error, on one line
    message = fails("traffic", "canary", "--split", "1=90", "--split", "2=20")
    assert message.startswith("sless: PUT /v1/namespaces/") and "HTTP 400" in message and "sum to 100" in message
    assert len(message.splitlines()) == 1
    assert "HTTP 404" in fails("traffic", "canary", "--split", "1=50", "--split", "9=50")
    assert "HTTP 400" in fails("traffic", "canary", "--split", "1=50", "--split", "1=50")
    assert "HTTP 400" in fails("traffic", "canary", "--split", "1=200")
    assert "HTTP 400" in fails("traffic", "canary", "--split", "1=10", "--split", "2=10", "--split", "3=80")
    assert split_of(tenant) is None
    assert "not allowed with argument" in fails("traffic", "canary", "--split", "1=100", "--clear", expect=2)

    missing = fails("rollback", "canary", "9")
    assert "HTTP 404" in missing and "no version 9" in missing
    assert "HTTP 409" in fails("rollback", "canary", "1")  # the current one
    assert "HTTP 409" in fails("rollback", "canary")  # no earlier version
    assert "invalid int value" in fails("rollback", "canary", "one", expect=2)
    assert "HTTP 404" in fails("versions", "absent")
    assert "HTTP 404" in fails("traffic", "absent")
    assert "NAME must be a DNS-1123 label" in fails("versions", "Bad_Name")
    assert "NAME must be a DNS-1123 label" in fails("traffic", "../canary", "--clear")

    # another tenant's function: the API's 403, said plainly, for every verb; nothing of theirs changes
    other_tenant.api("POST", "/ensure", expect=(200, 201))
    other_tenant.api("POST", "/functions", json={"name": "canary", "runtime": "python3.11"}, expect=201)
    for argv in (("versions", "canary"), ("rollback", "canary", "1"), ("traffic", "canary"),
                 ("traffic", "canary", "--split", "1=100"), ("traffic", "canary", "--clear")):
        message = fails(*argv, "--namespace", other_tenant.ns)
        assert f"/v1/namespaces/{other_tenant.ns}/functions/canary" in message
        assert message.rstrip().endswith("HTTP 403: this namespace belongs to another tenant"), message
    assert other_tenant.api("GET", "/functions/canary/traffic", expect=200).json() == {"split": None}
    assert "--namespace must be a tenant namespace" in fails("versions", "canary", "--namespace", "kube-system")
    # the caller's own namespace named explicitly is the same as the default
    assert sless(tenant, "versions", "canary", "-n", tenant.ns).stdout.split()[:4] == \
        sless(tenant, "versions", "canary").stdout.split()[:4]



CHECKED = ("import os\nassert os.environ['MODE'] == 'ok', 'MODE is ' + os.environ['MODE']\n"
           "def handle(event):\n    return 'checked'\n")


def test_a_rollback_whose_deploy_fails_exits_1_with_the_reason(tenant: Tenant) -> None:
    """Version 1 refuses to start unless its secret says "ok"; the secret changed since, so deploying version 1
    again fails (a real failed start, not a simulated one), and the CLI says so on one line."""
    ref = {"name": "mode", "key": "value", "env": "MODE"}
    tenant.api("POST", "/ensure", expect=(200, 201))
    tenant.api("POST", "/secrets", json={"name": "mode", "data": {"value": "ok"}}, expect=201)
    tenant.deploy("canary", "python3.11", {"handler.py": CHECKED}, secrets=[ref])
    tenant.upload("canary", {"handler.py": ONE})
    tenant.wait_phase("canary", ("Ready",), code_hash=code_hash(ONE))
    tenant.api("PUT", "/secrets/mode", json={"data": {"value": "broken"}}, expect=200)

    done = sless(tenant, "rollback", "canary", "1", expect=1)
    assert done.stdout == "" and done.stderr.startswith("sless: rolling canary back failed: ")
    assert len(done.stderr.splitlines()) == 1 and "MODE is broken" in done.stderr
    assert tenant.api("GET", "/functions/canary", expect=200).json()["phase"] == "Failed"
