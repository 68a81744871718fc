"""Secret bodies, references and the standalone store's encryption at rest (a real SQLite file and key file)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sless_api.domain.errors import Conflict, NotFound
from sless_api.domain.secrets import SecretMeta, check_references, parse_secret_body, secrets_version
from sless_api.stores.secrets.local import LocalSecretStore, SecretKeyError
from sless_core.errors import ValidationError
from sless_core.models import FunctionSpec, SecretRef, validate_secret_refs

NS, OTHER = "sless-0123456789abcdef", "sless-fedcba9876543210"
PLAIN = "plain-value-3e8a1c"


def store(tmp_path: Path) -> LocalSecretStore:
    return LocalSecretStore(tmp_path / "secrets.db", tmp_path / "secrets.key")


def test_values_are_encrypted_at_rest_and_read_back(tmp_path: Path) -> None:
    s = store(tmp_path)
    meta = s.create(NS, "db", {"password": PLAIN, "user": "app"})
    assert (meta.keys, meta.version) == (("password", "user"), 1)
    assert s.values(NS, "db") == {"password": PLAIN, "user": "app"}
    s.close()
    for path in tmp_path.iterdir():
        assert PLAIN.encode() not in path.read_bytes(), path
    assert (tmp_path / "secrets.key").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "secrets.db").stat().st_mode & 0o777 == 0o600
    again = store(tmp_path)  # the same key file: the same values
    assert again.values(NS, "db")["password"] == PLAIN


def test_versions_revisions_and_errors(tmp_path: Path) -> None:
    s = store(tmp_path)
    first = s.create(NS, "db", {"a": "1"})
    with pytest.raises(Conflict):
        s.create(NS, "db", {"a": "2"})
    second = s.replace(NS, "db", {"b": "2"})
    assert second.version == 2 and second.keys == ("b",) and second.revision != first.revision
    assert s.list(NS) == [second] and s.list(OTHER) == []
    with pytest.raises(NotFound):
        s.get(OTHER, "db")
    with pytest.raises(NotFound):
        s.replace(OTHER, "db", {"a": "1"})
    s.delete(NS, "db")
    with pytest.raises(NotFound):
        s.delete(NS, "db")
    assert s.create(NS, "db", {"a": "1"}).revision not in (first.revision, second.revision)


def test_a_ciphertext_moved_to_another_tenants_row_does_not_decrypt(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.create(NS, "db", {"a": PLAIN})
    s.create(OTHER, "db", {"a": "theirs"})
    db = sqlite3.connect(tmp_path / "secrets.db")
    nonce, sealed = db.execute("SELECT nonce, ciphertext FROM secrets WHERE namespace = ?", (NS,)).fetchone()
    db.execute("UPDATE secrets SET nonce = ?, ciphertext = ? WHERE namespace = ?", (nonce, sealed, OTHER))
    db.commit()
    with pytest.raises(RuntimeError, match="does not decrypt"):
        s.values(OTHER, "db")


def test_a_damaged_key_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secrets.key").write_bytes(b"short")
    with pytest.raises(SecretKeyError, match="exactly 32 bytes"):
        store(tmp_path)


def test_a_key_file_readable_by_others_is_tightened(tmp_path: Path) -> None:
    store(tmp_path).close()
    (tmp_path / "secrets.key").chmod(0o644)
    store(tmp_path).close()
    assert (tmp_path / "secrets.key").stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("refs", [
    [{"name": "db", "key": "k"}],
    [{"name": "db", "key": "k", "env": "A", "file": "a"}],
    [{"name": "db", "key": "k", "env": "A", "extra": 1}],
    [{"name": "DB", "key": "k", "env": "A"}],
    [{"name": "db", "key": "a/b", "env": "A"}],
    [{"name": "db", "key": ".x", "env": "A"}],
    [{"name": "db", "key": "k", "file": ".."}],
    [{"name": "db", "key": "k", "file": "a/b"}],
    [{"name": "db", "key": "k", "env": "PATH"}],
    [{"name": "db", "key": "k", "env": "SLESS_X"}],
    [{"name": "db", "key": "k", "env": "A"}, {"name": "db", "key": "j", "env": "A"}],
    [{"name": "db", "key": "k", "file": "f"}, {"name": "other", "key": "k", "file": "f"}],
    "db",
    [["db", "k", "A"]],
])
def test_bad_references_are_refused(refs: object) -> None:
    with pytest.raises(ValidationError):
        validate_secret_refs(refs)


def test_references_round_trip_through_the_spec() -> None:
    refs = [{"name": "db", "key": "password", "env": "DB_PASSWORD"},
            {"name": "db", "key": "tls.crt", "file": "tls.crt"}]
    spec = FunctionSpec.from_user({"name": "f", "runtime": "python3.11", "secrets": refs}, 60)
    assert spec.to_dict()["secrets"] == refs
    assert FunctionSpec.from_dict(spec.to_dict()) == spec
    assert spec.updated({"memory_mb": 256}, 60).secrets == spec.secrets


def meta(name: str, keys: tuple[str, ...], revision: str) -> SecretMeta:
    return SecretMeta(NS, name, keys, 1, revision, 0.0, 0.0)


def test_reference_checks_and_version_hash() -> None:
    refs = [SecretRef("db", "password", env="P")]
    with pytest.raises(ValidationError, match="'db' does not exist"):
        check_references(refs, {})
    with pytest.raises(ValidationError, match="no key 'password'"):
        check_references(refs, {"db": meta("db", ("user",), "r1")})
    check_references(refs, {"db": meta("db", ("password",), "r1")})
    v1 = secrets_version(refs, {"db": meta("db", ("password",), "r1")})
    assert v1 == secrets_version(refs, {"db": meta("db", ("password",), "r1")})
    assert v1 != secrets_version(refs, {"db": meta("db", ("password",), "r2")})
    assert secrets_version([], {}) == ""


def test_secret_bodies() -> None:
    assert parse_secret_body({"name": "db", "data": {"b": "2", "a": "1"}}) == ("db", {"a": "1", "b": "2"})
    assert parse_secret_body({"data": {"a": "1"}}, name="db") == ("db", {"a": "1"})
    with pytest.raises(ValidationError) as info:
        parse_secret_body({"name": "db", "data": {"a": PLAIN * 2000}})
    assert PLAIN not in info.value.message
    with pytest.raises(ValidationError):
        parse_secret_body({"name": "x", "data": {"a": "1"}}, name="db")
