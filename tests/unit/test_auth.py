"""Bearer-token verification: every accepted token is really signed, every rejection is a clean AuthError."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from sless_api.auth import (
    AuthConfig,
    AuthError,
    TokenVerifier,
    bearer_token,
    issue_token,
)
from sless_core.naming import tenant_namespace

SECRET = "unit-test-secret-0123456789abcdef0123456789"
SUB = "019cc268-6c6a-781e-8613-4bed4ec7cd20"
SUB_NS = "sless-ffd1f598c169b0ae"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def raw_token(header: dict[str, Any], payload: dict[str, Any], signature: bytes = b"") -> str:
    """A token assembled by hand, for shapes pyjwt refuses to produce."""
    h = b64url(json.dumps(header).encode())
    p = b64url(json.dumps(payload).encode())
    return f"{h}.{p}.{b64url(signature)}"


def claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    base: dict[str, Any] = {"sub": SUB, "iat": now, "exp": now + 600}
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def pem_public(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode("ascii")
    )


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def other_rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture
def hs() -> TokenVerifier:
    return TokenVerifier(AuthConfig(secret=SECRET))


def rejected(verifier: TokenVerifier, token: str) -> str:
    with pytest.raises(AuthError) as info:
        verifier.verify(token)
    assert info.value.status == 401
    assert token not in info.value.message or not token
    return info.value.message


# --- the namespace vector and the happy paths -------------------------------------------------------


def test_spec_namespace_vector() -> None:
    assert tenant_namespace(SUB) == SUB_NS
    assert "sless-" + hashlib.sha256(SUB.encode()).hexdigest()[:16] == SUB_NS


def test_valid_hs256_maps_sub_to_namespace(hs: TokenVerifier) -> None:
    got = hs.verify(issue_token(SECRET, SUB, 300))
    assert got.sub == SUB
    assert got.namespace == SUB_NS
    assert got.admin is False
    assert got.claims["sub"] == SUB


def test_admin_claim_must_be_exactly_true(hs: TokenVerifier) -> None:
    assert hs.verify(issue_token(SECRET, SUB, 300, extra={"sless_admin": True})).admin is True
    for value in ("true", 1, "yes", [True]):
        assert hs.verify(issue_token(SECRET, SUB, 300, extra={"sless_admin": value})).admin is False
    custom = TokenVerifier(AuthConfig(secret=SECRET, admin_claim="root"))
    assert custom.verify(issue_token(SECRET, SUB, 300, extra={"root": True})).admin is True
    assert custom.verify(issue_token(SECRET, SUB, 300, extra={"sless_admin": True})).admin is False


def test_issue_token_extra_cannot_override_subject_or_expiry(hs: TokenVerifier) -> None:
    token = issue_token(SECRET, SUB, 300, extra={"sub": "someone-else", "exp": 1})
    got = hs.verify(token)
    assert got.sub == SUB
    assert got.claims["exp"] > time.time()


def test_valid_rs256(rsa_key: rsa.RSAPrivateKey) -> None:
    verifier = TokenVerifier(AuthConfig(public_key_pem=pem_public(rsa_key)))
    assert verifier.allowed_algorithms == {"RS256"}
    got = verifier.verify(jwt.encode(claims(), rsa_key, algorithm="RS256"))
    assert got.namespace == SUB_NS


def test_valid_es256(ec_key: ec.EllipticCurvePrivateKey) -> None:
    verifier = TokenVerifier(AuthConfig(public_key_pem=pem_public(ec_key)))
    assert verifier.allowed_algorithms == {"ES256"}
    assert verifier.verify(jwt.encode(claims(), ec_key, algorithm="ES256")).sub == SUB


def test_secret_and_public_key_together(rsa_key: rsa.RSAPrivateKey) -> None:
    verifier = TokenVerifier(AuthConfig(secret=SECRET, public_key_pem=pem_public(rsa_key)))
    assert verifier.verify(issue_token(SECRET, SUB, 60)).sub == SUB
    assert verifier.verify(jwt.encode(claims(), rsa_key, algorithm="RS256")).sub == SUB


def test_algorithm_of_the_wrong_key_type(rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey) -> None:
    rsa_only = TokenVerifier(AuthConfig(public_key_pem=pem_public(rsa_key)))
    assert "algorithm" in rejected(rsa_only, jwt.encode(claims(), ec_key, algorithm="ES256"))
    assert "algorithm" in rejected(rsa_only, jwt.encode(claims(), rsa_key, algorithm="RS512"))
    assert "algorithm" in rejected(rsa_only, jwt.encode(claims(), rsa_key, algorithm="PS256"))
    hs_only = TokenVerifier(AuthConfig(secret=SECRET))
    assert "algorithm" in rejected(hs_only, jwt.encode(claims(), rsa_key, algorithm="RS256"))
    assert "algorithm" in rejected(hs_only, jwt.encode(claims(), SECRET * 2, algorithm="HS512"))


# --- forged tokens ----------------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["none", "None", "NONE", "nOnE"])
def test_alg_none_is_rejected(alg: str, hs: TokenVerifier, rsa_key: rsa.RSAPrivateKey) -> None:
    for verifier in (hs, TokenVerifier(AuthConfig(public_key_pem=pem_public(rsa_key)))):
        assert "algorithm" in rejected(verifier, raw_token({"alg": alg, "typ": "JWT"}, claims()))
        assert "algorithm" in rejected(verifier, raw_token({"alg": alg}, claims(), b"x"))


def test_header_without_alg_is_rejected(hs: TokenVerifier) -> None:
    rejected(hs, raw_token({"typ": "JWT"}, claims(), b"sig"))
    rejected(hs, raw_token({"alg": ["HS256"]}, claims(), b"sig"))


def hs256_signed_with(secret: bytes, payload: dict[str, Any]) -> str:
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64url(json.dumps(payload).encode())
    signature = hmac.new(secret, f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{b64url(signature)}"


def test_hs_rs_confusion_with_public_key_as_secret(rsa_key: rsa.RSAPrivateKey) -> None:
    pem = pem_public(rsa_key)
    forged = hs256_signed_with(pem.encode("ascii"), claims())
    # Only a public key configured: HS256 is simply not an accepted algorithm.
    assert "algorithm" in rejected(TokenVerifier(AuthConfig(public_key_pem=pem)), forged)
    # Secret and public key configured: HS256 is checked against the secret, never the PEM.
    both = TokenVerifier(AuthConfig(secret=SECRET, public_key_pem=pem))
    assert rejected(both, forged) == "bad token signature"
    # The PEM as stripped text is another common variant of the same attack.
    forged_stripped = hs256_signed_with(pem.strip().encode("ascii"), claims())
    assert rejected(both, forged_stripped) == "bad token signature"


def test_tampered_payload(hs: TokenVerifier) -> None:
    token = issue_token(SECRET, SUB, 300)
    header, _, signature = token.split(".")
    evil_payload = b64url(json.dumps(claims(sub="victim", sless_admin=True)).encode())
    assert rejected(hs, f"{header}.{evil_payload}.{signature}") == "bad token signature"


def test_bad_signature(hs: TokenVerifier, rsa_key: rsa.RSAPrivateKey, other_rsa_key: rsa.RSAPrivateKey) -> None:
    assert rejected(hs, issue_token("another-secret-0123456789abcdef0123", SUB, 300)) == "bad token signature"
    token = issue_token(SECRET, SUB, 300)
    assert rejected(hs, token[:-2] + ("AA" if not token.endswith("AA") else "BB")) in (
        "bad token signature",
        "malformed token",
        "invalid token",
    )
    rs = TokenVerifier(AuthConfig(public_key_pem=pem_public(rsa_key)))
    assert rejected(rs, jwt.encode(claims(), other_rsa_key, algorithm="RS256")) == "bad token signature"


@pytest.mark.parametrize(
    "token",
    [
        "",
        "garbage",
        "a.b.c",
        "a.b",
        "...",
        "eyJhbGciOiJIUzI1NiJ9",
        "eyJhbGciOiJIUzI1NiJ9.!!!.@@@",
        "ü.ö.ä",
        "x" * 20000,
        raw_token({"alg": "HS256"}, {"sub": SUB}).replace(".", "..", 1),
    ],
)
def test_garbage_token(hs: TokenVerifier, token: str) -> None:
    rejected(hs, token)


def test_payload_that_is_not_an_object(hs: TokenVerifier) -> None:
    header = b64url(json.dumps({"alg": "HS256"}).encode())
    body = b64url(b"[1, 2, 3]")
    signature = hmac.new(SECRET.encode(), f"{header}.{body}".encode(), hashlib.sha256).digest()
    rejected(hs, f"{header}.{body}.{b64url(signature)}")


# --- time claims ------------------------------------------------------------------------------------


def test_expired(hs: TokenVerifier) -> None:
    now = int(time.time())
    assert rejected(hs, jwt.encode(claims(iat=now - 600, exp=now - 120), SECRET, "HS256")) == "token has expired"


def test_expiry_within_leeway_is_accepted(hs: TokenVerifier) -> None:
    now = int(time.time())
    assert hs.verify(jwt.encode(claims(iat=now - 600, exp=now - 10), SECRET, "HS256")).sub == SUB
    strict = TokenVerifier(AuthConfig(secret=SECRET, leeway_sec=0))
    assert rejected(strict, jwt.encode(claims(iat=now - 600, exp=now - 10), SECRET, "HS256")) == "token has expired"


def test_future_nbf(hs: TokenVerifier) -> None:
    now = int(time.time())
    assert rejected(hs, jwt.encode(claims(nbf=now + 300), SECRET, "HS256")) == "token is not yet valid"
    assert hs.verify(jwt.encode(claims(nbf=now + 10), SECRET, "HS256")).sub == SUB


def test_future_iat(hs: TokenVerifier) -> None:
    now = int(time.time())
    assert rejected(hs, jwt.encode(claims(iat=now + 300, exp=now + 900), SECRET, "HS256")) == ("token is not yet valid")


def test_missing_exp(hs: TokenVerifier) -> None:
    assert rejected(hs, jwt.encode(claims(exp=None), SECRET, "HS256")) == "token lacks the 'exp' claim"


def test_non_numeric_exp(hs: TokenVerifier) -> None:
    rejected(hs, jwt.encode(claims(exp="tomorrow"), SECRET, "HS256"))


# --- issuer, audience, subject -----------------------------------------------------------------------


def test_issuer_checked_when_configured() -> None:
    verifier = TokenVerifier(AuthConfig(secret=SECRET, issuer="https://idp.example"))
    assert verifier.verify(issue_token(SECRET, SUB, 60, issuer="https://idp.example")).sub == SUB
    assert rejected(verifier, issue_token(SECRET, SUB, 60, issuer="https://evil.example")) == "wrong token issuer"
    assert rejected(verifier, issue_token(SECRET, SUB, 60)) == "token lacks the 'iss' claim"


def test_issuer_ignored_when_not_configured(hs: TokenVerifier) -> None:
    assert hs.verify(issue_token(SECRET, SUB, 60, issuer="anyone")).sub == SUB


def test_audience_checked_when_configured() -> None:
    verifier = TokenVerifier(AuthConfig(secret=SECRET, audience="sless"))
    assert verifier.verify(issue_token(SECRET, SUB, 60, audience="sless")).sub == SUB
    assert verifier.verify(jwt.encode(claims(aud=["other", "sless"]), SECRET, "HS256")).sub == SUB
    assert rejected(verifier, issue_token(SECRET, SUB, 60, audience="other")) == "wrong token audience"
    assert rejected(verifier, issue_token(SECRET, SUB, 60)) == "token lacks the 'aud' claim"


def test_audience_ignored_when_not_configured(hs: TokenVerifier) -> None:
    assert hs.verify(issue_token(SECRET, SUB, 60, audience="whatever")).sub == SUB


def test_missing_sub(hs: TokenVerifier) -> None:
    assert rejected(hs, jwt.encode(claims(sub=None), SECRET, "HS256")) == "token lacks the 'sub' claim"


@pytest.mark.parametrize("sub", ["", "   ", 42, ["a"], {"id": 1}])
def test_sub_must_be_a_non_empty_string(hs: TokenVerifier, sub: object) -> None:
    rejected(hs, jwt.encode(claims(sub=sub), SECRET, "HS256"))


# --- the Authorization header -----------------------------------------------------------------------


def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer abc.def.ghi") == "abc.def.ghi"
    assert bearer_token("bearer abc") == "abc"
    assert bearer_token("  Bearer   abc  ") == "abc"


@pytest.mark.parametrize(
    "value", [None, "", "   ", "abc.def.ghi", "Basic dXNlcjpwYXNz", "Bearer", "Bearer a b", "Token x"]
)
def test_bearer_token_wrong_format(value: str | None) -> None:
    with pytest.raises(AuthError):
        bearer_token(value)


# --- configuration ----------------------------------------------------------------------------------


def test_config_requires_a_key_source() -> None:
    with pytest.raises(ValueError, match="SLESS_JWT_SECRET"):
        AuthConfig.from_env({})
    with pytest.raises(ValueError, match="SLESS_JWT_SECRET"):
        AuthConfig.from_env({"SLESS_JWT_SECRET": "  ", "SLESS_JWT_ISSUER": "x"})


def test_config_from_env(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    pem = pem_public(rsa_key)
    env = {
        "SLESS_JWT_SECRET": SECRET,
        "SLESS_JWT_PUBLIC_KEY": pem,
        "SLESS_JWKS_URL": "https://idp.example/jwks.json",
        "SLESS_JWT_ISSUER": "https://idp.example",
        "SLESS_JWT_AUDIENCE": "sless",
        "SLESS_JWT_LEEWAY_SEC": "5",
    }
    config = AuthConfig.from_env(env)
    assert config.secret == SECRET
    assert config.public_key_pem == pem.strip()
    assert config.jwks_url == "https://idp.example/jwks.json"
    assert (config.issuer, config.audience, config.leeway_sec) == ("https://idp.example", "sless", 5.0)
    assert AuthConfig.from_env({"SLESS_JWT_SECRET": SECRET}).leeway_sec == 30


def test_public_key_from_a_file(tmp_path: Path, ec_key: ec.EllipticCurvePrivateKey) -> None:
    path = tmp_path / "jwt.pem"
    path.write_text(pem_public(ec_key))
    verifier = TokenVerifier(AuthConfig.from_env({"SLESS_JWT_PUBLIC_KEY": str(path)}))
    assert verifier.verify(jwt.encode(claims(), ec_key, algorithm="ES256")).sub == SUB
    with pytest.raises(ValueError, match="SLESS_JWT_PUBLIC_KEY"):
        AuthConfig.from_env({"SLESS_JWT_PUBLIC_KEY": str(tmp_path / "missing.pem")})


@pytest.mark.parametrize("leeway", ["soon", "-1", "nan"])
def test_bad_leeway(leeway: str) -> None:
    with pytest.raises(ValueError, match=r"leeway|LEEWAY"):
        AuthConfig.from_env({"SLESS_JWT_SECRET": SECRET, "SLESS_JWT_LEEWAY_SEC": leeway})


def test_unusable_public_keys(rsa_key: rsa.RSAPrivateKey) -> None:
    private_pem = rsa_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    p384 = ec.generate_private_key(ec.SECP384R1())
    for pem in (
        private_pem,
        "-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----",
        pem_public(small),
        pem_public(p384),
    ):
        with pytest.raises(ValueError, match="public key"):
            TokenVerifier(AuthConfig(public_key_pem=pem))


def test_jwks_url_must_be_http() -> None:
    with pytest.raises(ValueError, match="http"):
        AuthConfig(jwks_url="file:///etc/passwd")


def test_issue_token_validates_arguments() -> None:
    with pytest.raises(ValueError):
        issue_token(SECRET, "", 60)
    with pytest.raises(ValueError):
        issue_token(SECRET, SUB, 0)


def _signed(payload: bytes, secret: str) -> str:
    """A token whose payload is these exact bytes (PyJWT would re-encode a dict and drop the oddity)."""
    import base64
    import hashlib
    import hmac

    def b64(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    signing_input = b64(b'{"alg":"HS256","typ":"JWT"}') + b"." + b64(payload)
    signature = hmac.new(secret.encode(), signing_input, hashlib.sha256).digest()
    return (signing_input + b"." + b64(signature)).decode()


@pytest.mark.parametrize("payload", [b'{"sub": "\\udc80", "exp": 4102444800}',
                                     b'{"sub": "a\\ud800b", "exp": 4102444800}',
                                     b'{"sub": "\xff\xfe", "exp": 4102444800}'])
def test_a_subject_that_is_not_utf8_text_is_401(hs: TokenVerifier, payload: bytes) -> None:
    with pytest.raises(AuthError):
        hs.verify(_signed(payload, SECRET))
