"""Token verification against a real JWKS server on loopback: caching, rotation, floods, outages."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from sless_api.auth import AuthConfig, AuthError, TokenVerifier
from tests.support.jwks import SUB, JwksServer, ec_jwk, rsa_jwk, token
from tests.support.poll import holds_async

SUB_NS = "sless-ffd1f598c169b0ae"


@pytest.fixture(scope="module")
def key_a() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def key_b() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def key_ec() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture
def server() -> Iterator[JwksServer]:
    srv = JwksServer()
    yield srv
    srv.stop()


def verifier_for(server: JwksServer, **overrides: Any) -> TokenVerifier:
    return TokenVerifier(AuthConfig(jwks_url=server.url, **overrides))


def test_verifies_with_kid_and_caches(
    server: JwksServer, key_a: rsa.RSAPrivateKey, key_ec: ec.EllipticCurvePrivateKey
) -> None:
    server.publish(rsa_jwk(key_a, "a"), ec_jwk(key_ec, "e"))
    verifier = verifier_for(server)
    assert verifier.allowed_algorithms == {"RS256", "ES256"}
    for _ in range(20):
        got = verifier.verify(token(key_a, "RS256", "a"))
        assert (got.sub, got.namespace) == (SUB, SUB_NS)
        assert verifier.verify(token(key_ec, "ES256", "e")).namespace == SUB_NS
    assert server.count() == 1


def test_async_verify(server: JwksServer, key_a: rsa.RSAPrivateKey) -> None:
    server.publish(rsa_jwk(key_a, "a"))
    verifier = verifier_for(server)
    got = asyncio.run(verifier.verify_async(token(key_a, "RS256", "a")))
    assert got.namespace == SUB_NS


def test_kid_must_match_key_and_algorithm(
    server: JwksServer, key_a: rsa.RSAPrivateKey, key_b: rsa.RSAPrivateKey, key_ec: ec.EllipticCurvePrivateKey
) -> None:
    server.publish(rsa_jwk(key_a, "a"), ec_jwk(key_ec, "e"))
    verifier = verifier_for(server)
    with pytest.raises(AuthError, match="bad token signature"):
        verifier.verify(token(key_b, "RS256", "a"))  # kid of a, signed by b
    with pytest.raises(AuthError, match="unknown signing key"):
        verifier.verify(token(key_a, "RS256", "e"))  # the kid names an EC key


def test_symmetric_keys_in_jwks_are_never_used(server: JwksServer, key_a: rsa.RSAPrivateKey) -> None:
    secret = "shared-secret-published-by-mistake-0123456789"
    oct_key = {
        "kty": "oct",
        "kid": "h",
        "k": jwt.utils.base64url_encode(secret.encode()).decode(),
        "alg": "HS256",
    }
    server.publish(oct_key, rsa_jwk(key_a, "a"))
    verifier = verifier_for(server)
    with pytest.raises(AuthError, match="algorithm"):
        verifier.verify(token(secret, "HS256", "h"))
    assert verifier.verify(token(key_a, "RS256", "a")).sub == SUB


def test_token_without_kid_needs_an_unambiguous_key(
    server: JwksServer, key_a: rsa.RSAPrivateKey, key_b: rsa.RSAPrivateKey
) -> None:
    server.publish(rsa_jwk(key_a, None))
    assert verifier_for(server).verify(token(key_a, "RS256", None)).sub == SUB
    server.publish(rsa_jwk(key_a, "a"), rsa_jwk(key_b, "b"))
    with pytest.raises(AuthError, match="unknown signing key"):
        verifier_for(server).verify(token(key_a, "RS256", None))


def test_rotation_refetches_once_then_succeeds(
    server: JwksServer, key_a: rsa.RSAPrivateKey, key_b: rsa.RSAPrivateKey
) -> None:
    server.publish(rsa_jwk(key_a, "a"))
    verifier = verifier_for(server, jwks_min_refetch_sec=0.2)
    assert verifier.verify(token(key_a, "RS256", "a")).sub == SUB
    assert server.count() == 1
    server.publish(rsa_jwk(key_a, "a"), rsa_jwk(key_b, "b"))
    time.sleep(0.4)  # the clock rule itself: past the 0.2 s refetch window, an unknown kid may refetch
    assert verifier.verify(token(key_b, "RS256", "b")).sub == SUB
    assert server.count() == 2
    for _ in range(10):
        verifier.verify(token(key_b, "RS256", "b"))
        verifier.verify(token(key_a, "RS256", "a"))
    assert server.count() == 2


def test_rotation_inside_the_refetch_window_waits(
    server: JwksServer, key_a: rsa.RSAPrivateKey, key_b: rsa.RSAPrivateKey
) -> None:
    server.publish(rsa_jwk(key_a, "a"))
    verifier = verifier_for(server)  # default: at most one refetch per 10 s
    verifier.verify(token(key_a, "RS256", "a"))
    server.publish(rsa_jwk(key_b, "b"))
    with pytest.raises(AuthError, match="unknown signing key"):
        verifier.verify(token(key_b, "RS256", "b"))
    assert server.count() == 1


def test_unknown_kid_flood_is_bounded(server: JwksServer, key_a: rsa.RSAPrivateKey) -> None:
    server.publish(rsa_jwk(key_a, "a"))
    verifier = verifier_for(server)
    forged = [token(key_a, "RS256", uuid.uuid4().hex) for _ in range(50)]
    failures: list[str] = []
    errors: list[BaseException] = []

    def flood() -> None:
        for _ in range(5):
            for t in forged:
                try:
                    verifier.verify(t)
                except AuthError as exc:
                    failures.append(exc.message)
                except BaseException as exc:
                    errors.append(exc)

    threads = [threading.Thread(target=flood) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert len(failures) == 8 * 5 * 50
    assert set(failures) == {"unknown signing key"}
    assert server.count() <= 2
    # The real key still works after the flood.
    assert verifier.verify(token(key_a, "RS256", "a")).sub == SUB


@pytest.mark.slow
def test_flood_refetches_at_most_once_per_interval(server: JwksServer, key_a: rsa.RSAPrivateKey) -> None:
    server.publish(rsa_jwk(key_a, "a"))
    interval = 0.5
    verifier = verifier_for(server, jwks_min_refetch_sec=interval)
    started = time.monotonic()
    attempts = 0
    while time.monotonic() - started < 2.5:
        attempts += 1
        with pytest.raises(AuthError):
            verifier.verify(token(key_a, "RS256", uuid.uuid4().hex))
    elapsed = time.monotonic() - started
    count = server.count()
    assert attempts > 20
    assert count >= 2  # an unknown kid does trigger a refetch once the window has passed
    assert count <= elapsed / interval + 2


def test_cache_expiry_drops_removed_keys(
    server: JwksServer, key_a: rsa.RSAPrivateKey, key_b: rsa.RSAPrivateKey
) -> None:
    server.publish(rsa_jwk(key_a, "a"), rsa_jwk(key_b, "b"))
    verifier = verifier_for(server, jwks_cache_sec=0.3, jwks_min_refetch_sec=0.1)
    verifier.verify(token(key_a, "RS256", "a"))
    server.publish(rsa_jwk(key_b, "b"))  # a is revoked
    time.sleep(0.5)  # the clock rule itself: past the 0.3 s cache lifetime, the keys are fetched again
    with pytest.raises(AuthError, match="unknown signing key"):
        verifier.verify(token(key_a, "RS256", "a"))
    assert verifier.verify(token(key_b, "RS256", "b")).sub == SUB
    assert server.count() >= 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_jwks_server_down_is_an_auth_error(key_a: rsa.RSAPrivateKey) -> None:
    verifier = TokenVerifier(AuthConfig(jwks_url=f"http://127.0.0.1:{free_port()}/jwks.json"))
    started = time.monotonic()
    for _ in range(3):
        with pytest.raises(AuthError, match="signing keys are unavailable"):
            verifier.verify(token(key_a, "RS256", "a"))
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    ("status", "body"),
    [(500, b"oops"), (200, b"<html>not json</html>"), (200, b'{"no": "keys"}'), (200, b"[]"), (404, b"{}")],
)
def test_bad_jwks_responses_are_auth_errors(
    server: JwksServer, key_a: rsa.RSAPrivateKey, status: int, body: bytes
) -> None:
    server.status, server.body = status, body
    with pytest.raises(AuthError, match="signing keys are unavailable"):
        verifier_for(server).verify(token(key_a, "RS256", "a"))


def test_outage_after_a_good_fetch_keeps_known_keys(server: JwksServer, key_a: rsa.RSAPrivateKey) -> None:
    server.publish(rsa_jwk(key_a, "a"))
    verifier = verifier_for(server, jwks_cache_sec=0.2, jwks_min_refetch_sec=0.1)
    verifier.verify(token(key_a, "RS256", "a"))
    server.status, server.body = 503, b"down"
    time.sleep(0.4)  # the clock rule itself: past the 0.2 s cache lifetime, the next verify refetches (and fails)
    assert verifier.verify(token(key_a, "RS256", "a")).sub == SUB  # stale but known key
    assert server.count() == 2
    # The failing server is not hammered: further requests inside the window do not refetch.
    for _ in range(20):
        verifier.verify(token(key_a, "RS256", "a"))
    assert server.count() <= 3


@pytest.mark.slow
def test_hanging_jwks_server_times_out(server: JwksServer, key_a: rsa.RSAPrivateKey) -> None:
    server.publish(rsa_jwk(key_a, "a"))
    server.delay = 8.0
    verifier = verifier_for(server)
    started = time.monotonic()
    with pytest.raises(AuthError, match="signing keys are unavailable"):
        verifier.verify(token(key_a, "RS256", "a"))
    elapsed = time.monotonic() - started
    assert 4.0 <= elapsed < 7.9


def test_trickling_jwks_fetch_is_bounded_and_blocks_neither_the_loop_nor_cached_keys(
    server: JwksServer, key_a: rsa.RSAPrivateKey, key_b: rsa.RSAPrivateKey
) -> None:
    """A JWKS server sending one byte every 3 s: the unknown kid fails at the fetch deadline, not after
    minutes; meanwhile the event loop keeps running and a token with a cached kid verifies at once."""
    server.publish(rsa_jwk(key_a, "a"))
    deadline = 4.0
    verifier = verifier_for(server, jwks_min_refetch_sec=0.1, jwks_fetch_deadline_sec=deadline)
    assert verifier.verify(token(key_a, "RS256", "a")).sub == SUB
    time.sleep(0.2)  # the clock rule itself: past the 0.1 s refetch window, the unknown kid below fetches
    server.trickle_sec = 3.0

    async def scenario() -> tuple[float, float, float, float]:
        loop = asyncio.get_running_loop()
        lags: list[float] = []

        async def heartbeat() -> None:
            while True:
                before = loop.time()
                await asyncio.sleep(0.05)
                lags.append(loop.time() - before - 0.05)

        beat = asyncio.create_task(heartbeat())
        started = time.monotonic()
        unknown = asyncio.create_task(verifier.verify_async(token(key_b, "RS256", "b")))
        await holds_async("the unknown kid still waits for the trickling fetch", lambda: not unknown.done(),
                          for_sec=0.5, why="a verification that did not wait for the fetch (or gave up before its "
                          "4 s deadline) would end within the loop's next turns, milliseconds; 0.5 s is far more")
        # A cached kid, from the loop and from a plain thread, while the fetch is in flight.
        t0 = time.monotonic()
        assert (await verifier.verify_async(token(key_a, "RS256", "a"))).sub == SUB
        cached_async = time.monotonic() - t0
        t0 = time.monotonic()
        assert (await asyncio.to_thread(verifier.verify, token(key_a, "RS256", "a"))).sub == SUB
        cached_sync = time.monotonic() - t0
        with pytest.raises(AuthError, match="unknown signing key"):
            await unknown
        failed_after = time.monotonic() - started
        beat.cancel()
        return cached_async, cached_sync, failed_after, max(lags)

    cached_async, cached_sync, failed_after, worst_lag = asyncio.run(scenario())
    assert cached_async < 0.2, cached_async
    assert cached_sync < 0.5, cached_sync
    assert deadline - 1 <= failed_after < deadline + 2, failed_after
    assert worst_lag < 0.2, worst_lag
    # The fetch hung up on the server at its deadline instead of leaving a connection behind.
    wait_until = time.monotonic() + 8
    while not server.disconnects and time.monotonic() < wait_until:
        time.sleep(0.1)
    assert server.disconnects, "the timed-out fetch kept its connection open"
    assert server.count() == 2


def test_concurrent_unknown_kid_callers_share_one_fetch(
    server: JwksServer, key_a: rsa.RSAPrivateKey, key_b: rsa.RSAPrivateKey
) -> None:
    server.publish(rsa_jwk(key_a, "a"))
    verifier = verifier_for(server, jwks_min_refetch_sec=0.1)
    verifier.verify(token(key_a, "RS256", "a"))
    server.publish(rsa_jwk(key_a, "a"), rsa_jwk(key_b, "b"))
    server.delay = 1.0
    time.sleep(0.2)  # the clock rule itself: past the 0.1 s refetch window, the unknown kid below fetches

    async def many() -> list[Any]:
        calls = [verifier.verify_async(token(key_b, "RS256", "b")) for _ in range(30)]
        return await asyncio.gather(*calls)

    results = asyncio.run(many())
    assert {r.sub for r in results} == {SUB}
    assert server.count() == 2
