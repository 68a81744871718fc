"""A real `sless up` verifying RS256 tokens against a JWKS server that trickles its answer.

While a token with an unknown kid waits for the (slow) key fetch, `/health` and tokens whose key is
cached keep answering at once, and the unknown kid is refused at the fetch deadline, not minutes later.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
import requests
from cryptography.hazmat.primitives.asymmetric import rsa

from sless_core.naming import tenant_namespace
from tests.support.jwks import JwksServer, rsa_jwk
from tests.support.platform import SlessProcess, start_sless
from tests.support.poll import holds

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SUB = "jwks-loop-tenant"
#: auth.py's defaults: one refetch per 10 s at most, a fetch never longer than 10 s.
MIN_REFETCH_SEC = 10.0
FETCH_DEADLINE_SEC = 10.0


@pytest.fixture(scope="module")
def key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def jwks(key: rsa.RSAPrivateKey) -> Iterator[JwksServer]:
    server = JwksServer()
    server.publish(rsa_jwk(key, "known"))
    yield server
    server.stop()


@pytest.fixture
def sless(tmp_path: Path, jwks: JwksServer) -> Iterator[SlessProcess]:
    sp = start_sless(tmp_path / "data", {"SLESS_JWKS_URL": jwks.url})
    yield sp
    sp.stop()


def rs256(key: rsa.RSAPrivateKey, kid: str) -> str:
    now = int(time.time())
    return jwt.encode({"sub": SUB, "iat": now, "exp": now + 600}, key, algorithm="RS256", headers={"kid": kid})


def timed_get(url: str, token: str | None = None) -> tuple[int, float]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    started = time.monotonic()
    resp = requests.get(url, headers=headers, timeout=60)
    return resp.status_code, time.monotonic() - started


def test_a_trickling_jwks_server_blocks_neither_health_nor_cached_keys(
    sless: SlessProcess, jwks: JwksServer, key: rsa.RSAPrivateKey
) -> None:
    known = rs256(key, "known")
    whoami = sless.url + "/v1/whoami"
    status, _ = timed_get(whoami, known)
    assert status == 200
    resp = requests.get(whoami, headers={"Authorization": f"Bearer {known}"}, timeout=10)
    assert resp.json()["namespace"] == tenant_namespace(SUB)
    assert jwks.count() == 1
    time.sleep(MIN_REFETCH_SEC + 0.5)  # an unknown kid may now trigger a refetch
    jwks.trickle_sec = 3.0
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        started = time.monotonic()
        unknown = [pool.submit(timed_get, whoami, rs256(key, f"rotated-{i}")) for i in range(3)]
        holds("the unknown kids wait for the trickling fetch", lambda: not any(f.done() for f in unknown),
              for_sec=1.0, why="a request that did not wait for the fetch (one byte every 3 s) would be answered "
              "within milliseconds; 1 s is far more, and well inside the fetch's 10 s deadline")
        health = [timed_get(sless.url + "/health") for _ in range(10)]
        cached = [timed_get(whoami, known) for _ in range(5)]
        results = [f.result() for f in unknown]
        elapsed = time.monotonic() - started
    assert all(code == 200 for code, _ in health + cached), (health, cached)
    assert max(t for _, t in health) < 0.5, health
    assert max(t for _, t in cached) < 0.5, cached
    assert all(code == 401 for code, _ in results), results
    assert elapsed < FETCH_DEADLINE_SEC + 3, elapsed  # the trickled document would take minutes
    assert jwks.count() == 2  # the three unknown kids shared one fetch
