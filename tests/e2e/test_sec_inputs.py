"""Hostile inputs on every route of `sless up`: bounded while reading, refused with a JSON error, never a 500."""

from __future__ import annotations

import contextlib
import http.client
import json
import urllib.parse
from collections.abc import Iterator

import pytest

from tests.support.attack import VICTIM_FUNCTION, VICTIM_JOB, fill, raw_request, rest_routes
from tests.support.platform import SlessProcess, Tenant

pytestmark = pytest.mark.e2e

HANDLER = {"handler.py": "def handle(event):\n    return 'ok'\n"}

HOSTILE_BODIES: dict[str, bytes] = {
    "not-json": b"{not json",
    "empty": b"",
    "deep-array": b"[" * 100_000 + b"]" * 100_000,
    "deep-object": b'{"a":' * 5_000 + b"1" + b"}" * 5_000,
    "nesting-33": b"[" * 33 + b"]" * 33,
    "nan": b'{"name": "x", "memory_mb": NaN}',
    "huge-int": b'{"name": "x", "memory_mb": ' + b"9" * 5_000 + b"}",
    "lone-surrogate": b'{"name": "\\ud800", "runtime": "python3.11"}',
    "surrogate-key": b'{"\\udfff": 1}',
    "not-utf8": b'{"name": "\xff\xfe"}',
    "nul": b'{"name": "a\\u0000b", "runtime": "python3.11", "env_vars": {"A": "x\\u0000y"}}',
    "null": b"null",
    "list": b"[1, 2]",
    "string": b'"x"',
    "wrong-types": b'{"name": ["x"], "runtime": {}, "run_id": "1", "enabled": "yes", "function": 7, '
                   b'"env_vars": [], "secrets": [{"name": "s", "key": "k", "env": 5}], "event": "x"}',
    "secret-env-not-string": b'{"name": "x", "runtime": "python3.11", '
                             b'"secrets": [{"name": "s", "key": "k", "env": ["A"]}]}',
    "run-id-huge": b'{"run_id": 99999999999999999999}',
    "run-id-over-cap": b'{"run_id": 2147483648}',
    "long-string": json.dumps({"name": "x" * 200_000}).encode(),
}
HOSTILE_QUERIES = ["limit=%C2%B2", "limit=99999999999999999999999", "limit=-1", "cursor=99999999999999999999999",
                   "cursor=%ED%A0%80", "cursor=%FF%FE", "cursor=zz%00", "limit=1&limit=2", "cursor=" + "A" * 5000]


@pytest.fixture
def owner(tenant: Tenant) -> Tenant:
    tenant.deploy(VICTIM_FUNCTION, "python3.11", HANDLER)
    tenant.api("POST", "/jobs", json={"name": VICTIM_JOB, "function": VICTIM_FUNCTION, "run_id": 0}, expect=201)
    return tenant


def routes_with_methods(ns: str) -> Iterator[tuple[str, str]]:
    for entry in rest_routes():
        if entry.template.startswith("/v1/"):
            for method in entry.methods:
                yield method, fill(entry.template, ns, entry.resource)


def test_no_input_makes_any_route_answer_500(owner: Tenant) -> None:
    auth = {"Authorization": f"Bearer {owner.token}"}
    failures: list[str] = []
    count = 0
    for method, path in routes_with_methods(owner.ns):
        cases: list[tuple[str, str, bytes]] = [(label, path, body) for label, body in HOSTILE_BODIES.items()
                                               if method in ("POST", "PUT", "PATCH")]
        cases += [(query, f"{path}?{query}", b"") for query in HOSTILE_QUERIES if method == "GET"]
        for suffix in ("%0A", "%00", "%C3%A9", "-" * 3, "a" * 300):
            if "{name}" not in path and path.endswith((VICTIM_FUNCTION, VICTIM_JOB)):
                cases.append((f"name+{suffix}", path + suffix, b""))
        for label, target, body in cases:
            answer = raw_request(owner.url, method, target, auth, body)
            count += 1
            if answer.status >= 500 or b"Traceback" in answer.body:
                failures.append(f"{method} {target[:100]} [{label}] -> {answer.status} {answer.body[:200]!r}")
                continue
            if answer.status >= 400:
                try:
                    assert json.loads(answer.body)["error"]
                except (ValueError, KeyError, AssertionError):
                    failures.append(f"{method} {target[:100]} [{label}] -> {answer.status} not a JSON error")
    assert count > 200
    assert not failures, "\n".join(failures[:40])
    # The objects survived the barrage.
    owner.api("GET", f"/functions/{VICTIM_FUNCTION}", expect=200)
    owner.api("GET", f"/jobs/{VICTIM_JOB}", expect=200)


def chunked(sless: SlessProcess, method: str, path: str, headers: dict[str, str], chunks: Iterator[bytes]) -> int:
    """Send a chunked body (no Content-Length); returns the status, or 413 if the server hung up early."""
    parsed = urllib.parse.urlparse(sless.url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
    try:
        conn.putrequest(method, path)
        for key, value in {**headers, "Transfer-Encoding": "chunked"}.items():
            conn.putheader(key, value)
        conn.endheaders()
        for chunk in chunks:
            try:
                conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):
                break
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.send(b"0\r\n\r\n")
        resp = conn.getresponse()
        body = resp.read()
        if resp.status >= 400:
            assert json.loads(body)["error"]
        return resp.status
    finally:
        conn.close()


def test_a_chunked_json_body_is_bounded_while_reading(sless: SlessProcess, owner: Tenant) -> None:
    headers = {"Authorization": f"Bearer {owner.token}", "Content-Type": "application/json"}
    eight_mib = (b" " * (64 * 1024) for _ in range(128))
    status = chunked(sless, "POST", f"/v1/namespaces/{owner.ns}/functions", headers, eight_mib)
    assert status == 413
    owner.api("GET", "/functions", expect=200)


def test_multipart_fields_beside_the_zip_are_bounded(sless: SlessProcess, owner: Tenant) -> None:
    boundary = "sless-boundary"
    big = b"x" * (200 * 1024)
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\n".encode() + big +
            f"\r\n--{boundary}--\r\n".encode())
    answer = raw_request(owner.url, "POST", f"/v1/namespaces/{owner.ns}/functions/{VICTIM_FUNCTION}/upload",
                         {"Authorization": f"Bearer {owner.token}",
                          "Content-Type": f"multipart/form-data; boundary={boundary}"}, body)
    assert answer.status == 413, answer.body[:200]
    many = b"".join(f"--{boundary}\r\nContent-Disposition: form-data; name=\"f{i}\"\r\n\r\nv\r\n".encode()
                    for i in range(40)) + f"--{boundary}--\r\n".encode()
    answer = raw_request(owner.url, "POST", f"/v1/namespaces/{owner.ns}/functions/{VICTIM_FUNCTION}/upload",
                         {"Authorization": f"Bearer {owner.token}",
                          "Content-Type": f"multipart/form-data; boundary={boundary}"}, many)
    assert answer.status == 400 and b"multipart" in answer.body


def test_deep_json_is_400_not_500(owner: Tenant) -> None:
    resp = owner.api("POST", "/functions", data=b"[" * 100_000 + b"]" * 100_000,
                     headers={"Content-Type": "application/json"})
    assert resp.status_code == 400 and "nesting" in resp.json()["error"]


def test_run_id_is_capped_on_patch_like_on_post(owner: Tenant) -> None:
    for run_id in (2**31, 2**63, -1):
        resp = owner.api("PATCH", f"/jobs/{VICTIM_JOB}", json={"run_id": run_id})
        assert resp.status_code == 400 and resp.json()["field"] == "run_id", resp.text
        resp = owner.api("POST", "/jobs", json={"name": "capped", "function": VICTIM_FUNCTION, "run_id": run_id})
        assert resp.status_code == 400 and resp.json()["field"] == "run_id", resp.text


def test_an_overflowing_cursor_is_400(owner: Tenant) -> None:
    for cursor in ("99999999999999999999999", "9223372036854775808", "%C2%B2"):
        resp = owner.api("GET", f"/functions/{VICTIM_FUNCTION}/invocations?cursor={cursor}")
        assert resp.status_code == 400, resp.text
