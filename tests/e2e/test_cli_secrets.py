"""`sless secrets ls|set|rm` as a real command against a real `sless up`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.platform import Tenant, table_rows

pytestmark = pytest.mark.e2e

VALUE = "cli-pw-5a0f3b7e"
FILE_VALUE = "cli-file-9d41c2aa"
STDIN_VALUE = "cli-stdin-e7b61f03"


def sless_cmd(tenant: Tenant, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLESS_TOKEN": tenant.token, "SLESS_URL": tenant.url}
    return subprocess.run([sys.executable, "-m", "sless_api", *args], input=stdin, capture_output=True,
                          text=True, env=env, timeout=60, check=False)


@pytest.mark.usefixtures("sless")
def test_set_list_replace_and_remove(tenant: Tenant, tmp_path: Path) -> None:
    (tmp_path / "cert.pem").write_text(FILE_VALUE)
    made = sless_cmd(tenant, "secrets", "set", "db", f"password={VALUE}",
                     "--from-file", f"cert={tmp_path / 'cert.pem'}", "--stdin", "token", stdin=STDIN_VALUE + "\n")
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == "db: version 1, keys cert, password, token"
    listed = sless_cmd(tenant, "secrets", "ls")
    assert listed.returncode == 0 and table_rows(listed.stdout) == [["db", "v1", "cert,password,token"]]
    assert tenant.api("GET", "/secrets/db", expect=200).json()["keys"] == ["cert", "password", "token"]

    again = sless_cmd(tenant, "secrets", "set", "db", "password=other")
    assert again.returncode == 0 and "version 2, keys password" in again.stdout

    tenant.api("POST", "/functions", json={"name": "user", "runtime": "python3.11",
                                           "secrets": [{"name": "db", "key": "password", "env": "P"}]}, expect=201)
    refused = sless_cmd(tenant, "secrets", "rm", "db")
    assert refused.returncode == 1 and "HTTP 409" in refused.stderr and "user" in refused.stderr
    tenant.api("DELETE", "/functions/user", expect=204)
    assert sless_cmd(tenant, "secrets", "rm", "db").returncode == 0
    assert sless_cmd(tenant, "secrets", "ls").stdout == ""
    for result in (made, listed, again, refused):
        for value in (VALUE, FILE_VALUE, STDIN_VALUE):
            assert value not in result.stdout + result.stderr


@pytest.mark.usefixtures("sless")
def test_bad_arguments_fail_without_echoing_values(tenant: Tenant) -> None:
    no_equals = sless_cmd(tenant, "secrets", "set", "db", VALUE)
    assert no_equals.returncode == 1 and "KEY=VALUE" in no_equals.stderr and VALUE not in no_equals.stderr
    twice = sless_cmd(tenant, "secrets", "set", "db", f"a={VALUE}", "a=x")
    assert twice.returncode == 1 and "twice" in twice.stderr and VALUE not in twice.stderr
    nothing = sless_cmd(tenant, "secrets", "set", "db")
    assert nothing.returncode == 1 and "at least one" in nothing.stderr
    missing = sless_cmd(tenant, "secrets", "set", "db", "--from-file", "a=/nonexistent/file")
    assert missing.returncode == 1 and "cannot read" in missing.stderr
    bad_name = sless_cmd(tenant, "secrets", "set", "Bad_Name", f"a={VALUE}")
    assert bad_name.returncode == 1 and "HTTP 400" in bad_name.stderr and VALUE not in bad_name.stderr
    assert sless_cmd(tenant, "secrets", "rm", "absent").returncode == 1
    assert tenant.api("GET", "/secrets", expect=200).json()["items"] == []

