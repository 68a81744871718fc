"""`sless env NAME`, `sless env set` and `sless env unset` as real commands against a real `sless up`: the
variables change through the API, and the function's process sees them."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests

from tests.support.platform import Tenant, sless_cli

pytestmark = pytest.mark.e2e

SHOW_ENV = '''import os

def handle(event):
    return {key: os.environ.get(key) for key in ("GREETING", "COLOR", "EQUATION")}
'''


@pytest.fixture
def shown(tenant: Tenant, tmp_path: Path) -> Tenant:
    folder = tmp_path / "shown"
    folder.mkdir()
    (folder / "handler.py").write_text(SHOW_ENV)
    (folder / "sless.json").write_text(json.dumps({"runtime": "python3.11", "env_vars": {"GREETING": "hi"}}))
    sless_cli(tenant, "deploy", str(folder))
    return tenant


def answer_becomes(tenant: Tenant, wanted: dict[str, str | None], wait: float = 120) -> None:
    """Calls the function until it answers WANTED (the new variables reach a new process once it is rolled)."""
    deadline = time.monotonic() + wait
    got = None
    while time.monotonic() < deadline:
        resp = requests.get(tenant.fn_url("shown"), timeout=60)
        got = resp.json() if resp.status_code == 200 else resp.status_code
        if got == wanted:
            return
        time.sleep(0.2)
    raise AssertionError(f"the function answered {got}, not {wanted}")


def test_set_unset_and_show(shown: Tenant) -> None:
    assert sless_cli(shown, "env", "shown").stdout == "GREETING=hi\n"
    changed = sless_cli(shown, "env", "set", "shown", "COLOR=blue", "EQUATION=a=b", "GREETING=hello").stdout
    assert changed == "COLOR=blue\nEQUATION=a=b\nGREETING=hello\n", "the value is everything after the first '='"
    assert shown.api("GET", "/functions/shown", expect=200).json()["env_vars"] == {
        "COLOR": "blue", "EQUATION": "a=b", "GREETING": "hello"}
    answer_becomes(shown, {"GREETING": "hello", "COLOR": "blue", "EQUATION": "a=b"})

    removed = sless_cli(shown, "env", "unset", "shown", "COLOR", "NEVER_SET")
    assert removed.stdout == "EQUATION=a=b\nGREETING=hello\n"
    assert "has no variable 'NEVER_SET'" in removed.stderr
    assert json.loads(sless_cli(shown, "env", "shown", "-o", "json").stdout) == {
        "name": "shown", "env_vars": {"EQUATION": "a=b", "GREETING": "hello"}}
    answer_becomes(shown, {"GREETING": "hello", "COLOR": None, "EQUATION": "a=b"})

    versions = len(shown.api("GET", "/functions/shown/versions", expect=200).json()["items"])
    same = sless_cli(shown, "env", "set", "shown", "GREETING=hello")
    assert "nothing changed" in same.stderr
    assert len(shown.api("GET", "/functions/shown/versions", expect=200).json()["items"]) == versions
    sless_cli(shown, "env", "unset", "shown", "EQUATION", "GREETING")
    assert sless_cli(shown, "env", "shown").stdout == "", "no variables: nothing printed"


@pytest.mark.parametrize(("argv", "code", "words"), [
    (("set", "shown", "NOEQUALS"), 2, "expected KEY=VALUE: argument 1 after the name ('NOEQUALS') has no '='"),
    (("set", "shown"), 2, "give at least one KEY=VALUE"),
    (("unset", "shown"), 2, "give at least one KEY"),
    (("shown", "extra"), 2, "unexpected 'extra'"),
    (("set", "shown", "1BAD=x"), 1, "HTTP 400: invalid environment variable name '1BAD'"),
    (("set", "shown", "PORT=1"), 1, "HTTP 400: environment variable 'PORT' is reserved by the platform"),
    (("set", "shown", "=x"), 1, "HTTP 400: invalid environment variable name ''"),
    (("nothing-here",), 1, "HTTP 404"),
    (("set", "../triggers/shown", "A=1"), 1, "HTTP 404: no such route"),  # never another resource
])  # fmt: skip
def test_bad_env_arguments(shown: Tenant, argv: tuple[str, ...], code: int, words: str) -> None:
    done = sless_cli(shown, "env", *argv, expect=code)
    assert words in done.stderr, done.stderr
    if code == 1:
        assert done.stderr.count("\n") == 1, done.stderr
    assert shown.api("GET", "/functions/shown", expect=200).json()["env_vars"] == {"GREETING": "hi"}


def test_another_tenants_function_is_refused(shown: Tenant, other_tenant: Tenant) -> None:
    for argv in (("env", "shown"), ("env", "set", "shown", "A=1")):
        refused = sless_cli(shown, *argv, "-n", other_tenant.ns, expect=1).stderr
        assert "HTTP 403" in refused and refused.count("\n") == 1, refused
