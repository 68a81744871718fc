"""`sless invoke` (method, headers, a body from a file or stdin, --async, --callback) and `sless calls` / `sless call`
as real commands against a real `sless up`."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.platform import REPO, Tenant, sless_cli, table_rows

pytestmark = pytest.mark.e2e

ECHO = '''import base64, hashlib

def handle(event):
    body = event.get("body")
    raw = base64.b64decode(body) if event.get("isBase64Encoded") else (body or "").encode()
    return {"method": event["_method"], "x_test": event["_headers"].get("x-test"),
            "x_other": event["_headers"].get("x-other"), "content_type": event["_headers"].get("content-type"),
            "name": event.get("name"), "sha256": hashlib.sha256(raw).hexdigest() if body is not None else None}
'''
BINARY = bytes(range(256)) * 3


def run(tenant: Tenant, *argv: str, stdin: bytes = b"", expect: int = 0) -> subprocess.CompletedProcess[bytes]:
    """The ``sless`` command with bytes on stdin; asserts its exit code and that no traceback reached stderr."""
    env = {**os.environ, "SLESS_TOKEN": tenant.token, "SLESS_URL": tenant.url}
    done = subprocess.run([sys.executable, "-m", "sless_api", *argv], input=stdin, env=env, cwd=REPO,
                          capture_output=True, timeout=300, check=False)
    assert done.returncode == expect, (argv, done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert b"Traceback" not in done.stderr, done.stderr
    return done


def answer(done: subprocess.CompletedProcess[bytes]) -> Any:
    return json.loads(done.stdout)


@pytest.fixture
def echo(tenant: Tenant, tmp_path: Path) -> Tenant:
    folder = tmp_path / "echo"
    folder.mkdir()
    (folder / "handler.py").write_text(ECHO)
    sless_cli(tenant, "deploy", str(folder))
    return tenant


def test_method_headers_and_bodies_from_text_a_file_and_stdin(echo: Tenant, tmp_path: Path) -> None:
    plain = answer(run(echo, "invoke", "echo"))
    assert plain["method"] == "POST" and plain["sha256"] is None, "no data: a POST without a body, as before"
    got = answer(run(echo, "invoke", "echo", "-X", "get", "-H", "X-Test: one", "--header", "x-other:two"))
    assert (got["method"], got["x_test"], got["x_other"]) == ("GET", "one", "two")
    inline = answer(run(echo, "invoke", "echo", "--data", '{"name": "inline"}'))
    assert (inline["name"], inline["content_type"]) == ("inline", "application/json")

    (tmp_path / "event.json").write_text('{"name": "from-file"}')
    from_file = answer(run(echo, "invoke", "echo", "--data", f"@{tmp_path / 'event.json'}", "-X", "PUT"))
    assert (from_file["name"], from_file["method"], from_file["content_type"]) == ("from-file", "PUT",
                                                                                   "application/json")
    (tmp_path / "blob.bin").write_bytes(BINARY)
    digest = hashlib.sha256(BINARY).hexdigest()
    blob = answer(run(echo, "invoke", "echo", "--data", f"@{tmp_path / 'blob.bin'}"))
    assert (blob["sha256"], blob["content_type"]) == (digest, "application/octet-stream"), "byte for byte"
    piped = answer(run(echo, "invoke", "echo", "--data", "-", "-H", "Content-Type: image/png", stdin=BINARY))
    assert (piped["sha256"], piped["content_type"]) == (digest, "image/png"), "-H sets the Content-Type"


@pytest.mark.parametrize(("argv", "code", "words"), [
    (("-H", "no colon here"), 2, "--header expects 'Name: value'"),
    (("-H", "bad name: x"), 2, "--header expects"),
    (("-H", ": empty name"), 2, "--header expects"),
    (("--callback", "https://example.com/hook"), 2, "--callback needs --async"),
    (("--async", "--callback", "https://example.com/\u20ac"), 2, "--callback expects a URL in ASCII"),
    (("-H", "X-Test: \u20ac"), 2, "a header's value is ISO-8859-1 text"),
    (("-X", "GE T"), 2, "--method expects an HTTP method"),
    (("--data", "@/nonexistent/event.json"), 1, "--data @/nonexistent/event.json: cannot read"),
])  # fmt: skip
def test_bad_invoke_arguments_are_refused_before_any_call(echo: Tenant, argv: tuple[str, ...], code: int,
                                                         words: str) -> None:
    done = run(echo, "invoke", "echo", *argv, expect=code)
    assert words in done.stderr.decode() and done.stdout == b""
    if code == 1:
        assert done.stderr.decode().count("\n") == 1, done.stderr


def test_async_call_is_queued_then_listed_and_read(echo: Tenant) -> None:
    queued = run(echo, "invoke", "echo", "--async", "--data", '{"name": "later"}')
    line = queued.stdout.decode().strip()
    call_id = line.split()[1]
    assert line == f"call {call_id} queued: {echo.url}/v1/namespaces/{echo.ns}/calls/{call_id}"
    assert f"sless call {call_id}" in queued.stderr.decode()
    scripted = answer(run(echo, "invoke", "echo", "--async", "-o", "json"))
    assert scripted["state"] == "queued" and scripted["status_url"].endswith(f"/calls/{scripted['id']}")

    done = answer(run(echo, "call", call_id, "--wait", "120", "-o", "json"))
    assert (done["id"], done["state"], done["attempts"], done["result"]["status"]) == (call_id, "succeeded", 1, 200)
    assert json.loads(done["result"]["body"])["name"] == "later"
    shown = run(echo, "call", call_id).stdout.decode()
    assert "state:           succeeded" in shown and "result:          HTTP 200 application/json" in shown
    assert '"later"' in shown.split("\n\n", 1)[1], "the result's body below the fields"

    answer(run(echo, "call", scripted["id"], "--wait", "120", "-o", "json"))
    rows = table_rows(run(echo, "calls").stdout.decode())
    assert {r[0] for r in rows} == {call_id, scripted["id"]} and {tuple(r[1:4]) for r in rows} == {
        ("echo", "succeeded", "1")}
    assert rows[0][5] == "200"
    assert [r[0] for r in table_rows(run(echo, "calls", "echo", "--state", "succeeded", "--limit", "1").stdout
                                     .decode())] == [scripted["id"]], "newest first, at most --limit"
    assert run(echo, "calls", "--state", "dead").stdout == b"", "an empty listing prints nothing"
    assert run(echo, "calls", "other-function").stdout == b""
    listed = answer(run(echo, "calls", "-o", "json"))
    assert sorted(c["id"] for c in listed["items"]) == sorted([call_id, scripted["id"]])


def test_a_callback_url_goes_with_the_async_call(echo: Tenant) -> None:
    """The platform checks the callback URL when the call is queued: a loopback address is refused (400), which
    shows the header reached it."""
    done = run(echo, "invoke", "echo", "--async", "--callback", "http://127.0.0.1:9/hook", expect=1)
    assert "callback" in done.stdout.decode().lower(), done.stdout
    assert done.stderr.decode().startswith("sless: echo answered HTTP 400")


def test_bad_call_arguments_and_another_tenants_calls(echo: Tenant, other_tenant: Tenant) -> None:
    unknown = run(echo, "calls", "--state", "lost", expect=2).stderr.decode()
    assert "invalid choice: 'lost'" in unknown and "queued" in unknown
    bad_id = run(echo, "call", "not-an-id", expect=1).stderr.decode()
    assert "HTTP 400" in bad_id and "32 lowercase hex digits" in bad_id and bad_id.count("\n") == 1
    elsewhere = run(echo, "call", "../functions/echo", expect=1).stderr.decode()
    assert "HTTP 404: no such route" in elsewhere and elsewhere.count("\n") == 1, "never another resource"
    absent = run(echo, "call", "0" * 32, expect=1).stderr.decode()
    assert "HTTP 404" in absent and absent.count("\n") == 1
    for argv in (("calls",), ("call", "0" * 32)):
        refused = run(echo, *argv, "-n", other_tenant.ns, expect=1).stderr.decode()
        assert "HTTP 403" in refused and refused.count("\n") == 1, refused
    refused = run(echo, "invoke", "echo", "--async", "-n", other_tenant.ns, expect=1).stderr.decode()
    assert "answered HTTP 404" in refused or "answered HTTP 403" in refused, refused
