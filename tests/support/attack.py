"""The attacker's walk over the REST API, shared by the standalone and the kubernetes backend's tests.

Every route in the router table (not a hand-kept list: a route added later is walked too) is called with
its path spelled the ways routers and servers treat as the same resource, with no token and with bad
ones, aiming at a victim tenant's objects. Nothing may be read or written: the answer is 401 or 404,
the victim's secret never appears in an answer, and the victim's objects are unchanged afterwards.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import jwt

from sless_api.main.app import RouteEntry, Services, build_rest, route_table
from sless_api.main.config import ApiConfig
from sless_api.rest.console.resource import Console, ConsoleAsset
from sless_api.rest.http import PublicResource
from sless_api.rest.openapi import OpenApiDocument
from sless_api.rest.resources.metrics import Metrics
from sless_api.rest.resources.probes import Health, Ready
from tests.support.platform import SECRET, Tenant

# Metrics takes no tenant token: it has a scrape token of its own (tests/e2e/test_observability.py)
PUBLIC_BY_NAME = {Health, Ready, Console, ConsoleAsset, OpenApiDocument, Metrics}
VICTIM_FUNCTION = "victim"
VICTIM_JOB = "victim-job"
VICTIM_CALL = "0123456789abcdef" * 2  # the shape of a call id: the walk is refused before any lookup


def rest_routes() -> list[RouteEntry]:
    """The REST app's route table, built without a backend (resources only keep references)."""
    config = ApiConfig.from_env({}, {"SLESS_DATA_DIR": "/nonexistent"})
    services = Services(config, None, None, None, None, None)  # type: ignore[arg-type]
    return route_table(build_rest(services))


def spellings(path: str) -> list[str]:
    """PATH and the spellings of it that routers and servers may take for the same resource."""
    assert path.startswith("/v1/")
    rest = path[len("/v1"):]
    head, _, last = path.rpartition("/")
    return [
        path, "/" + path, "//" + path, "/%2Fv1" + rest, "/%2fv1" + rest, "/./v1" + rest, "/v1/." + rest,
        "/v1/x/.." + rest, path.replace("/namespaces/", "/namespaces/./", 1), f"{head}//{last}", path + "/.",
        "/v1%2F" + rest.lstrip("/"), "/%76%31" + rest, "/v1\\" + rest.lstrip("/"), path + "%00",
    ]


def bad_tokens(sub: str) -> dict[str, str | None]:
    """No token, garbage, a token signed with another secret, an expired one, ``alg: none``."""
    now = int(time.time())
    return {
        "none": None,
        "garbage": "Bearer not.a.token",
        "forged": "Bearer " + jwt.encode({"sub": sub, "exp": now + 600, "sless_admin": True},
                                         "another-secret-that-is-long-enough-for-hs", algorithm="HS256"),
        "expired": "Bearer " + jwt.encode({"sub": sub, "exp": now - 3600}, SECRET, algorithm="HS256"),
        "alg-none": "Bearer " + jwt.encode({"sub": sub, "exp": now + 600, "sless_admin": True}, None,
                                           algorithm="none"),
    }


def fill(template: str, ns: str, resource: object) -> str:
    name = VICTIM_JOB if "/jobs/" in template else VICTIM_FUNCTION
    return template.replace("{ns}", ns).replace("{name}", name).replace("{call_id}", VICTIM_CALL)


ATTACK_BODIES: dict[str, bytes] = {
    "POST": json.dumps({"name": "pwned", "runtime": "python3.11", "type": "http", "function": VICTIM_FUNCTION,
                        "event": {}}).encode(),
    "PUT": json.dumps({"env_vars": {"PWNED": "1"}}).encode(),
    "PATCH": json.dumps({"run_id": 99, "enabled": False}).encode(),
}


@dataclass
class Answer:
    status: int
    body: bytes


def raw_request(base_url: str, method: str, target: str, headers: dict[str, str], body: bytes = b"") -> Answer:
    """One request with the target sent byte for byte (no client-side normalisation)."""
    url = urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        for key, value in headers.items():
            conn.putheader(key, value)
        if body and not any(key.lower() == "content-type" for key in headers):
            conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body or None)
        resp = conn.getresponse()
        return Answer(resp.status, resp.read())
    finally:
        conn.close()


def private_routes() -> Iterator[RouteEntry]:
    """Every route but the public ones; fails when a route turns public without being named here."""
    for entry in rest_routes():
        if isinstance(entry.resource, PublicResource):
            assert type(entry.resource) in PUBLIC_BY_NAME, f"{entry.template} is public but not named as such"
            continue
        yield entry


def snapshot(victim: Tenant) -> dict[str, Any]:
    """What an attacker could change: the victim's functions, triggers and job, as the victim sees them."""
    functions = victim.api("GET", "/functions", expect=200).json()["items"]
    triggers = victim.api("GET", "/triggers", expect=200).json()["items"]
    job = victim.api("GET", f"/jobs/{VICTIM_JOB}", expect=200).json()
    return {"functions": functions, "triggers": triggers, "job": job}


def walk(base_url: str, victim: Tenant, secret_mark: str) -> int:
    """Walk every private route as an attacker; returns how many requests were made."""
    before = snapshot(victim)
    count = 0
    failures: list[str] = []
    for entry in private_routes():
        path = fill(entry.template, victim.ns, entry.resource)
        for method in entry.methods:
            for target in spellings(path):
                for label, auth in bad_tokens(victim.sub).items():
                    headers = {"Authorization": auth} if auth else {}
                    answer = raw_request(base_url, method, target, headers, ATTACK_BODIES.get(method, b""))
                    count += 1
                    if answer.status not in (401, 404):
                        failures.append(f"{method} {target} [{label}] -> {answer.status} {answer.body[:120]!r}")
                    if secret_mark.encode() in answer.body:
                        failures.append(f"{method} {target} [{label}] leaked the victim's secret")
    assert not failures, f"{len(failures)} of {count} attacks got through:\n" + "\n".join(failures[:40])
    assert snapshot(victim) == before, "the walk changed the victim's objects"
    return count
