"""The code store contract, run against both backends: a local folder and a real S3 server."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sless_api.stores.code import (
    CodeStore,
    InvalidKeyError,
    LocalCodeStore,
    ObjectNotFoundError,
    S3CodeStore,
    StorageSettings,
    code_store,
    context_key,
    function_prefixes,
    zip_key,
)
from tests.support.services import S3Endpoint

BAD_KEYS = [
    "",
    "/etc/passwd",
    "../outside",
    "a/../../outside",
    "functions/../../x",
    "a//b",
    "a/./b",
    "a/",
    ".hidden",
    "a/.tmp-x",
    "a\\..\\b",
    "a\x00b",
    "line\nbreak",
    "x" * 2000,
]
BAD_PREFIXES = ["/", "/etc", "../", "a/../", "..", "a//", "a\\b"]


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CodeStore]:
    if request.param == "local":
        yield LocalCodeStore(tmp_path / "store")
        return
    s3: S3Endpoint = request.getfixturevalue("s3_endpoint")
    # A fresh bucket per test: isolates tests and exercises creating a missing bucket.
    yield S3CodeStore(s3.endpoint, s3.access_key, s3.secret_key, f"t-{uuid.uuid4().hex[:20]}", secure=False)


def test_round_trip_and_overwrite(store: CodeStore) -> None:
    key = zip_key("tenant-a", "hello", 1700000000)
    assert not store.exists(key)
    store.put_bytes(key, b"first")
    assert store.exists(key)
    assert store.get_bytes(key) == b"first"
    store.put_bytes(key, b"")  # empty objects are objects too
    assert store.get_bytes(key) == b""
    store.put_bytes(key, bytes(range(256)) * 10)
    assert store.get_bytes(key) == bytes(range(256)) * 10


def test_missing_key(store: CodeStore, tmp_path: Path) -> None:
    key = zip_key("tenant-a", "nothing", 1)
    assert not store.exists(key)
    with pytest.raises(ObjectNotFoundError):
        store.get_bytes(key)
    with pytest.raises(ObjectNotFoundError):
        store.get_to_file(key, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_large_file(store: CodeStore, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    data = os.urandom(20 * 1024 * 1024)
    src.write_bytes(data)
    key = context_key("tenant-a", "big", 42)
    store.put_file(key, src)
    dest = tmp_path / "copy.bin"
    store.get_to_file(key, dest)
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    assert store.get_bytes(key) == data
    assert store.list("contexts/") == [key]


def test_list_is_a_sorted_string_prefix_match(store: CodeStore) -> None:
    keys = [
        zip_key("ns1", "fn", 2),
        zip_key("ns1", "fn", 1),
        zip_key("ns1", "fn2", 1),
        context_key("ns1", "fn", 1),
        zip_key("ns2", "fn", 1),
    ]
    for key in keys:
        store.put_bytes(key, key.encode())
    assert store.list() == sorted(keys)
    assert store.list("functions/ns1/fn/") == ["functions/ns1/fn/1.zip", "functions/ns1/fn/2.zip"]
    assert store.list("functions/ns1/fn") == [
        "functions/ns1/fn/1.zip",
        "functions/ns1/fn/2.zip",
        "functions/ns1/fn2/1.zip",
    ]
    assert store.list("functions/ns3/") == []
    assert store.list("nothing-here/") == []


def test_delete_prefix(store: CodeStore) -> None:
    doomed = [zip_key("ns1", "fn", t) for t in range(5)] + [context_key("ns1", "fn", t) for t in range(3)]
    kept = [zip_key("ns1", "fn2", 1), zip_key("ns2", "fn", 1), context_key("ns1", "fn2", 1)]
    for key in doomed + kept:
        store.put_bytes(key, b"x")
    zips, contexts, code, binaries = function_prefixes("ns1", "fn")
    assert (code, binaries) == ("code/ns1/fn/", "binaries/ns1/fn/")
    assert store.delete_prefix(zips) == 5
    assert store.delete_prefix(contexts) == 3
    assert store.delete_prefix(zips) == 0
    assert store.list() == sorted(kept)
    for key in doomed:
        assert not store.exists(key)


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_escaping_keys_are_rejected(store: CodeStore, key: str, tmp_path: Path) -> None:
    src = tmp_path / "f"
    src.write_bytes(b"x")
    with pytest.raises(InvalidKeyError):
        store.put_bytes(key, b"x")
    with pytest.raises(InvalidKeyError):
        store.put_file(key, src)
    with pytest.raises(InvalidKeyError):
        store.get_bytes(key)
    with pytest.raises(InvalidKeyError):
        store.exists(key)
    with pytest.raises(InvalidKeyError):
        store.get_to_file(key, tmp_path / "out")


@pytest.mark.parametrize("prefix", BAD_PREFIXES, ids=repr)
def test_escaping_prefixes_are_rejected(store: CodeStore, prefix: str) -> None:
    with pytest.raises(InvalidKeyError):
        store.list(prefix)
    with pytest.raises(InvalidKeyError):
        store.delete_prefix(prefix)


def test_local_store_never_leaves_its_root(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.zip").write_bytes(b"secret")
    root = tmp_path / "store"
    store = LocalCodeStore(root)
    # A symlink planted inside the root must not become a way out.
    (root / "functions").mkdir()
    (root / "functions" / "evil").symlink_to(outside)
    with pytest.raises(InvalidKeyError):
        store.get_bytes("functions/evil/secret.zip")
    with pytest.raises(InvalidKeyError):
        store.put_bytes("functions/evil/new.zip", b"x")
    assert not (outside / "new.zip").exists()
    assert store.delete_prefix("functions/evil/") == 0
    assert (outside / "secret.zip").read_bytes() == b"secret"


def test_local_writes_leave_no_temporaries(tmp_path: Path) -> None:
    store = LocalCodeStore(tmp_path / "store")
    key = zip_key("ns", "fn", 1)
    for i in range(5):
        store.put_bytes(key, str(i).encode())
    assert sorted(p.name for p in (tmp_path / "store/functions/ns/fn").iterdir()) == ["1.zip"]
    assert store.list() == [key]


def test_key_helpers() -> None:
    assert zip_key("ns", "fn", 1700000000) == "functions/ns/fn/1700000000.zip"
    assert context_key("ns", "fn", "20240101T000000") == "contexts/ns/fn/20240101T000000.tar.gz"
    for bad in ("a/b", "", "..", ".x"):
        with pytest.raises(InvalidKeyError):
            zip_key(bad, "fn", 1)
        with pytest.raises(InvalidKeyError):
            context_key("ns", bad, 1)


def test_store_from_settings(tmp_path: Path) -> None:
    local = code_store(StorageSettings.from_env({}), tmp_path / "code")
    assert isinstance(local, LocalCodeStore)
    assert local.root == (tmp_path / "code").resolve()
    s3 = code_store(
        StorageSettings.from_env({
            "SLESS_S3_ENDPOINT": "https://minio.example:9000/",
            "SLESS_S3_ACCESS_KEY": "ak",
            "SLESS_S3_SECRET_KEY": "sk",
        }),
        tmp_path / "unused",
    )
    assert isinstance(s3, S3CodeStore)
    assert (s3.endpoint, s3.bucket) == ("minio.example:9000", "sless")
    assert s3.client._base_url.is_https
    assert not (tmp_path / "unused").exists()


@pytest.mark.s3
def test_store_from_settings_talks_to_s3(s3_endpoint: S3Endpoint, tmp_path: Path) -> None:
    env = s3_endpoint.env() | {"SLESS_S3_BUCKET": f"env-{uuid.uuid4().hex[:12]}"}
    store = code_store(StorageSettings.from_env(env), tmp_path / "unused")
    store.put_bytes("functions/ns/fn/1.zip", b"via env")
    assert store.get_bytes("functions/ns/fn/1.zip") == b"via env"
    assert not (tmp_path / "unused").exists()
