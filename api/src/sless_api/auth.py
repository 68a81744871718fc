"""Bearer-token authentication: verified JWTs mapped to a tenant namespace.

The original platform trusted the network and never checked the token's signature; here every token is
verified. The accepted algorithms are bound to the configured key material, never taken from the token:
HS256 is accepted only when a shared secret is configured and is always checked against that secret;
RS256/ES256 only against a configured public key or keys from a JWKS URL. That closes ``alg: none`` and
the HS/RS confusion (an HS256 token "signed" with the RSA public key PEM as its secret).

No falcon here: the API and the standalone backend both use this module. ``TokenVerifier.verify`` may
wait for a JWKS fetch (bounded by ``jwks_fetch_deadline_sec``); async callers use ``verify_async``, which
never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import jwt
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from jwt.exceptions import InvalidSubjectError

from sless_api.domain.jsonshape import is_utf8_text
from sless_core.envconfig import EnvReader
from sless_core.naming import tenant_namespace

log = logging.getLogger(__name__)

HS256 = "HS256"
RS256 = "RS256"
ES256 = "ES256"
ASYMMETRIC_ALGORITHMS = frozenset({RS256, ES256})

# Connect and per-read bound of a JWKS fetch; the whole fetch is bounded by ``jwks_fetch_deadline_sec``.
JWKS_TIMEOUT_SEC = 5.0
JWKS_MAX_BYTES = 1 << 20
# A token is a header line, not a document; anything longer is refused before any parsing.
MAX_TOKEN_CHARS = 16 * 1024
MIN_SECRET_BYTES = 32

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey


class AuthError(Exception):
    """Authentication failed. ``message`` is short and safe to return to the caller (HTTP 401)."""

    status = 401

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Claims:
    """Who is calling: the token's subject, the tenant namespace derived from it, and the raw claims."""

    sub: str
    namespace: str
    admin: bool
    claims: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class AuthConfig:
    """Key material and checks for bearer tokens. At least one of secret, public key or JWKS URL is set."""

    secret: str | None = field(default=None, repr=False)
    public_key_pem: str | None = None
    jwks_url: str | None = None
    issuer: str | None = None
    audience: str | None = None
    leeway_sec: float = 30
    # A claim that must be exactly ``true`` for the caller to act in other tenants' namespaces.
    admin_claim: str = "sless_admin"
    jwks_cache_sec: float = 300
    # An unknown ``kid`` triggers a JWKS refetch at most this often, so random kids cannot flood the server.
    jwks_min_refetch_sec: float = 10
    # A fetch (connect, headers, body) never takes longer than this, however slowly the server sends.
    jwks_fetch_deadline_sec: float = 10

    def __post_init__(self) -> None:
        if not (self.secret or self.public_key_pem or self.jwks_url):
            raise ValueError(
                "JWT verification needs a key: set SLESS_JWT_SECRET (HS256), "
                "SLESS_JWT_PUBLIC_KEY or SLESS_JWKS_URL (RS256/ES256)"
            )
        if self.leeway_sec < 0 or not math.isfinite(self.leeway_sec):
            raise ValueError("JWT leeway must be a non-negative number of seconds")
        if self.jwks_url and not self.jwks_url.startswith(("https://", "http://")):
            raise ValueError("SLESS_JWKS_URL must be an http(s) URL")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AuthConfig:
        """Read the ``SLESS_JWT_*`` / ``SLESS_JWKS_URL`` variables; empty values count as unset."""
        reader = EnvReader(env)
        public_key = reader.optional("SLESS_JWT_PUBLIC_KEY")
        if public_key is not None and "-----BEGIN" not in public_key:
            try:
                with open(public_key, encoding="ascii") as fh:
                    public_key = fh.read()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"SLESS_JWT_PUBLIC_KEY is neither PEM text nor a readable PEM file: {exc}") from exc
        return cls(
            secret=reader.optional("SLESS_JWT_SECRET"),
            public_key_pem=public_key,
            jwks_url=reader.optional("SLESS_JWKS_URL"),
            issuer=reader.optional("SLESS_JWT_ISSUER"),
            audience=reader.optional("SLESS_JWT_AUDIENCE"),
            leeway_sec=reader.number("SLESS_JWT_LEEWAY_SEC", 30.0, low=0),
        )

    @staticmethod
    def configured(env: Mapping[str, str]) -> bool:
        """Whether ENV names any key material (without it the API serves, answering 503 on /v1)."""
        reader = EnvReader(env)
        return any(reader.optional(name) for name in ("SLESS_JWT_SECRET", "SLESS_JWT_PUBLIC_KEY", "SLESS_JWKS_URL"))


def load_public_key(pem: str) -> tuple[PublicKey, str]:
    """Parse a PEM public key (or certificate) and return it with the one algorithm it may verify."""
    data = pem.strip().encode("ascii")
    try:
        if b"BEGIN CERTIFICATE" in data:
            key: object = x509.load_pem_x509_certificate(data).public_key()
        else:
            key = load_pem_public_key(data)
    except ValueError as exc:
        raise ValueError(f"JWT public key is not a valid PEM public key: {exc}") from exc
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < 2048:
            raise ValueError("JWT RSA public key must be at least 2048 bits")
        return key, RS256
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1):
            raise ValueError("JWT EC public key must be on curve P-256 (ES256)")
        return key, ES256
    raise ValueError("JWT public key must be RSA (RS256) or EC P-256 (ES256)")


def bearer_token(header_value: str | None) -> str:
    """The token from an ``Authorization: Bearer <token>`` header value."""
    if not header_value or not header_value.strip():
        raise AuthError("missing bearer token")
    parts = header_value.split()
    if len(parts) != 2 or parts[0].lower() != "bearer":
        raise AuthError("expected 'Authorization: Bearer <token>'")
    return parts[1]


def issue_token(
    secret: str,
    sub: str,
    ttl_sec: int,
    issuer: str | None = None,
    audience: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """An HS256 token for ``sub`` valid for ``ttl_sec`` (``sless token``, development and tests)."""
    if not sub:
        raise ValueError("sub must be a non-empty string")
    if ttl_sec <= 0:
        raise ValueError("ttl_sec must be positive")
    now = int(time.time())
    payload: dict[str, Any] = dict(extra or {})
    payload.update({"sub": sub, "iat": now, "exp": now + int(ttl_sec)})
    if issuer is not None:
        payload["iss"] = issuer
    if audience is not None:
        payload["aud"] = audience
    return jwt.encode(payload, secret, algorithm=HS256)


class _JwksCache:
    """Signing keys from a JWKS URL: cached, refreshed on expiry or unknown kid, with refetches rate-limited.

    The lock guards the cache's fields only and is never held across network I/O: a caller whose key is
    cached and fresh returns at once, whatever a fetch is doing. At most one fetch is in flight; callers
    that need it (an unknown kid, an expired cache) wait on that one fetch, for a bounded time. The fetch
    runs in its own short-lived thread with its own event loop (aiohttp), under a total deadline, so a
    JWKS server that trickles bytes cannot hold it past ``fetch_deadline_sec`` (the per-read timeout
    alone would not stop a server sending one byte every few seconds). A key set older than
    ``REFRESH_AHEAD`` of its lifetime is refreshed in the background while the cached keys keep serving.

    A failed fetch keeps the previous keys (availability over a brief JWKS outage) and counts as an attempt,
    so a down server is retried at most once per ``min_refetch_sec`` however many requests arrive.
    """

    REFRESH_AHEAD = 0.8

    def __init__(self, url: str, cache_sec: float, min_refetch_sec: float, fetch_deadline_sec: float) -> None:
        self._url = url
        self._cache_sec = cache_sec
        self._min_refetch_sec = min_refetch_sec
        self._deadline_sec = fetch_deadline_sec
        self._lock = threading.Lock()
        self._keys: dict[str | None, list[tuple[str, PublicKey]]] = {}
        self._fetched_at: float | None = None
        self._attempted_at: float | None = None
        self._inflight: concurrent.futures.Future[None] | None = None

    @property
    def wait_sec(self) -> float:
        """How long a caller waits for an in-flight fetch: its deadline and a margin for the thread."""
        return self._deadline_sec + 1.0

    def key_for(self, kid: str | None, alg: str) -> PublicKey:
        """The key, waiting (in this thread, bounded) for a fetch when one is needed."""
        found = self.cached_or_fetch(kid, alg)
        if not isinstance(found, concurrent.futures.Future):
            return found
        with contextlib.suppress(concurrent.futures.TimeoutError):
            found.result(timeout=self.wait_sec)
        return self.resolve(kid, alg)

    async def key_for_async(self, kid: str | None, alg: str) -> PublicKey:
        """``key_for`` for the event loop: waits on the fetch without a thread of the caller's."""
        found = self.cached_or_fetch(kid, alg)
        if not isinstance(found, concurrent.futures.Future):
            return found
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(found)), self.wait_sec)
        return self.resolve(kid, alg)

    def cached_or_fetch(self, kid: str | None, alg: str) -> PublicKey | concurrent.futures.Future[None]:
        """A usable cached key, or the fetch to wait for (started here when none is in flight)."""
        with self._lock:
            now = time.monotonic()
            key = self._lookup(kid, alg)
            age = None if self._fetched_at is None else now - self._fetched_at
            if key is not None and age is not None and age < self._cache_sec:
                if age >= self._cache_sec * self.REFRESH_AHEAD and self._inflight is None and self._may_attempt(now):
                    self._start_fetch(now)
                return key
            if self._inflight is not None:
                return self._inflight
            if self._may_attempt(now):
                return self._start_fetch(now)
            if key is not None:
                return key  # stale, and a refetch was tried recently: the known key beats an outage
            raise self._missing()

    def resolve(self, kid: str | None, alg: str) -> PublicKey:
        """After a fetch (or a wait that gave up): whatever key the cache holds now, else why not."""
        with self._lock:
            key = self._lookup(kid, alg)
            if key is not None:
                return key
            raise self._missing()

    def _missing(self) -> AuthError:
        if self._fetched_at is None:
            return AuthError("signing keys are unavailable")
        return AuthError("unknown signing key")

    def _may_attempt(self, now: float) -> bool:
        return self._attempted_at is None or now - self._attempted_at >= self._min_refetch_sec

    def _lookup(self, kid: str | None, alg: str) -> PublicKey | None:
        if kid is None:
            # Without a kid only an unambiguous JWKS will do: exactly one key for this algorithm.
            candidates = [k for keys in self._keys.values() for a, k in keys if a == alg]
            return candidates[0] if len(candidates) == 1 else None
        for key_alg, key in self._keys.get(kid, []):
            if key_alg == alg:
                return key
        return None

    def _start_fetch(self, now: float) -> concurrent.futures.Future[None]:
        """Called with the lock held: record the attempt and start the one fetch thread."""
        self._attempted_at = now
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()  # a waiter giving up must not cancel it for the others
        self._inflight = future
        threading.Thread(target=self._run_fetch, args=(future,), name="sless-jwks-fetch", daemon=True).start()
        return future

    def _run_fetch(self, future: concurrent.futures.Future[None]) -> None:
        keys: dict[str | None, list[tuple[str, PublicKey]]] | None = None
        try:
            keys = asyncio.run(self._fetch())
        except (aiohttp.ClientError, TimeoutError, ValueError, UnicodeDecodeError) as exc:
            log.warning("JWKS fetch from %s failed: %s", self._url, exc or type(exc).__name__)
        except Exception:  # the waiters must be released whatever happened
            log.exception("JWKS fetch from %s failed", self._url)
        finally:
            with self._lock:
                if keys is not None:
                    self._keys = keys
                    self._fetched_at = time.monotonic()
                self._inflight = None
            future.set_result(None)

    async def _fetch(self) -> dict[str | None, list[tuple[str, PublicKey]]]:
        timeout = aiohttp.ClientTimeout(total=self._deadline_sec, sock_connect=JWKS_TIMEOUT_SEC,
                                        sock_read=JWKS_TIMEOUT_SEC)
        # The whole fetch, headers and body included, under one deadline.
        async with (
            asyncio.timeout(self._deadline_sec),
            aiohttp.ClientSession(timeout=timeout, trust_env=True) as session,
            session.get(self._url, headers={"Accept": "application/json"}) as resp,
        ):
            resp.raise_for_status()
            body = b""
            async for chunk in resp.content.iter_chunked(65536):
                body += chunk
                if len(body) > JWKS_MAX_BYTES:
                    raise ValueError("JWKS document is too large")
        doc = json.loads(body)
        if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
            raise ValueError("JWKS document has no 'keys' list")
        keys: dict[str | None, list[tuple[str, PublicKey]]] = {}
        for entry in doc["keys"]:
            parsed = _parse_jwk(entry)
            if parsed is not None:
                kid, alg, key = parsed
                keys.setdefault(kid, []).append((alg, key))
        log.info("JWKS from %s: %d usable signing keys", self._url, sum(len(v) for v in keys.values()))
        return keys


def _parse_jwk(entry: object) -> tuple[str | None, str, PublicKey] | None:
    """One JWK as (kid, alg, key), or None for keys we must not use (symmetric, encryption, other curves)."""
    if not isinstance(entry, dict):
        return None
    kty, crv = entry.get("kty"), entry.get("crv")
    if kty == "RSA":
        alg = RS256
    elif kty == "EC" and crv == "P-256":
        alg = ES256
    else:
        return None
    if entry.get("use", "sig") != "sig" or entry.get("alg", alg) != alg:
        return None
    kid = entry.get("kid")
    if kid is not None and not isinstance(kid, str):
        return None
    try:
        key = jwt.PyJWK(entry, algorithm=alg).key
    except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError, KeyError) as exc:
        log.warning("JWKS key %r ignored: %s", kid, exc)
        return None
    if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
        return None
    return kid, alg, key


class TokenVerifier:
    """Verifies bearer tokens against one ``AuthConfig``. Thread-safe; build one per process."""

    def __init__(self, config: AuthConfig) -> None:
        self.config = config
        self._secret = config.secret.encode("utf-8") if config.secret else None
        if self._secret is not None and len(self._secret) < MIN_SECRET_BYTES:
            log.warning("SLESS_JWT_SECRET is shorter than %d bytes; use a random one", MIN_SECRET_BYTES)
        self._public_key: PublicKey | None = None
        self._public_alg: str | None = None
        if config.public_key_pem:
            self._public_key, self._public_alg = load_public_key(config.public_key_pem)
        self._jwks = (
            _JwksCache(config.jwks_url, config.jwks_cache_sec, config.jwks_min_refetch_sec,
                       config.jwks_fetch_deadline_sec)
            if config.jwks_url
            else None
        )
        allowed: set[str] = set()
        if self._secret is not None:
            allowed.add(HS256)
        if self._public_alg is not None:
            allowed.add(self._public_alg)
        if self._jwks is not None:
            allowed |= ASYMMETRIC_ALGORITHMS
        self.allowed_algorithms = frozenset(allowed)

    async def verify_async(self, token: str) -> Claims:
        """``verify`` for async code: never blocks the event loop, never takes a thread of the pool.

        A cached key verifies inline (a signature check is CPU work of well under a millisecond); a key
        that needs a JWKS fetch is awaited on the cache's one in-flight fetch, bounded by its deadline.
        """
        alg, kid = self._header(token)
        if alg != HS256 and self._jwks is not None and not self._pem_serves(alg, kid):
            key: bytes | PublicKey = await self._jwks.key_for_async(kid, alg)
        else:
            key = self._key_for(alg, kid)
        return self._claims(token, key, alg)

    def verify(self, token: str) -> Claims:
        """The caller's claims if ``token`` is valid; ``AuthError`` with a short reason otherwise.

        May wait (bounded by the JWKS fetch deadline) for a key fetch: async code uses ``verify_async``.
        """
        alg, kid = self._header(token)
        return self._claims(token, self._key_for(alg, kid), alg)

    def _header(self, token: str) -> tuple[str, str | None]:
        """The token's algorithm (one this verifier accepts) and key id, from its unverified header."""
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
            raise AuthError("malformed token")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise AuthError("malformed token") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.allowed_algorithms:
            raise AuthError("token algorithm not allowed")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise AuthError("malformed token")
        return alg, kid

    def _claims(self, token: str, key: bytes | PublicKey, alg: str) -> Claims:
        payload = self._decode(token, key, alg)
        sub = payload.get("sub")
        if not isinstance(sub, str) or not sub.strip():
            raise AuthError("token subject must be a non-empty string")
        if not is_utf8_text(sub):
            raise AuthError("token subject must be UTF-8 text")
        return Claims(
            sub=sub,
            namespace=tenant_namespace(sub),
            admin=payload.get(self.config.admin_claim) is True,
            claims=payload,
        )

    def _pem_serves(self, alg: str, kid: str | None) -> bool:
        # A configured PEM key serves kid-less tokens (and any kid when there is no JWKS).
        return self._public_key is not None and alg == self._public_alg and (kid is None or self._jwks is None)

    def _key_for(self, alg: str, kid: str | None) -> bytes | PublicKey:
        if alg == HS256:
            assert self._secret is not None  # HS256 is allowed only with a secret
            return self._secret
        if self._pem_serves(alg, kid):
            assert self._public_key is not None
            return self._public_key
        if self._jwks is None:
            raise AuthError("token algorithm not allowed")
        return self._jwks.key_for(kid, alg)

    def _decode(self, token: str, key: bytes | PublicKey, alg: str) -> dict[str, Any]:
        audience = self.config.audience
        try:
            payload: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[alg],
                issuer=self.config.issuer,
                audience=audience,
                leeway=self.config.leeway_sec,
                options={"require": ["exp", "sub"], "verify_aud": audience is not None},
            )
        except jwt.ExpiredSignatureError:
            raise AuthError("token has expired") from None
        except jwt.ImmatureSignatureError:
            raise AuthError("token is not yet valid") from None
        except jwt.MissingRequiredClaimError as exc:
            raise AuthError(f"token lacks the '{exc.claim}' claim") from None
        except jwt.InvalidIssuerError:
            raise AuthError("wrong token issuer") from None
        except jwt.InvalidAudienceError:
            raise AuthError("wrong token audience") from None
        except jwt.InvalidSignatureError:
            raise AuthError("bad token signature") from None
        except InvalidSubjectError:
            raise AuthError("token subject must be a non-empty string") from None
        except jwt.InvalidAlgorithmError:
            raise AuthError("token algorithm not allowed") from None
        except jwt.PyJWTError as exc:
            log.debug("token rejected: %s", exc)
            raise AuthError("invalid token") from None
        except (ValueError, TypeError) as exc:
            # cryptography or json on hostile input; never let it become a 500.
            log.debug("token rejected: %s", exc)
            raise AuthError("invalid token") from None
        return payload
