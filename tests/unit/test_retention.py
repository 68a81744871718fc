"""Code kept per tenant: the newest versions stay, older ones go, and a tenant over its quota is told so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sless_api.backends.settings import RetentionPolicy
from sless_api.backends.standalone.retention import (
    QuotaExceeded,
    check_tenant_quota,
    prune_stored,
    prune_versions,
    tree_bytes,
)
from sless_api.stores.code.keys import context_key, zip_key
from sless_api.stores.code.local import LocalCodeStore


def make_version(function_dir: Path, name: str, mtime: int, size: int = 10) -> Path:
    folder = function_dir / name
    folder.mkdir(parents=True)
    (folder / "handler.py").write_bytes(b"x" * size)
    os.utime(folder, (mtime, mtime))
    return folder


def test_prune_keeps_the_current_and_the_newest_others(tmp_path: Path) -> None:
    fn = tmp_path / "ns" / "fn"
    for i, name in enumerate(["a", "b", "c", "d", "e"]):
        make_version(fn, name, 1_000 + i)
    removed = prune_versions(fn, current="a", policy=RetentionPolicy(versions_kept=3))
    assert removed == ["b", "c"]
    assert sorted(p.name for p in fn.iterdir()) == ["a", "d", "e"]


def test_prune_with_one_version_kept_leaves_only_the_current(tmp_path: Path) -> None:
    fn = tmp_path / "fn"
    for i, name in enumerate(["old", "new"]):
        make_version(fn, name, 2_000 + i)
    assert prune_versions(fn, current="new", policy=RetentionPolicy(versions_kept=1)) == ["old"]
    assert prune_versions(tmp_path / "missing", current="x", policy=RetentionPolicy()) == []


def test_stored_archives_beyond_the_newest_are_deleted(tmp_path: Path) -> None:
    store = LocalCodeStore(tmp_path / "objects")
    stamps = [f"20260101T00000{i}Z-{i:012d}" for i in range(5)]
    for stamp in stamps:
        store.put_bytes(zip_key("ns", "fn", stamp), b"zip")
        store.put_bytes(context_key("ns", "fn", stamp), b"ctx")
    store.put_bytes(zip_key("ns", "other", stamps[0]), b"zip")
    assert prune_stored(store, "ns", "fn", RetentionPolicy(versions_kept=2)) == 6
    assert store.list("functions/ns/fn/") == [zip_key("ns", "fn", s) for s in stamps[-2:]]
    assert store.list("contexts/ns/fn/") == [context_key("ns", "fn", s) for s in stamps[-2:]]
    assert store.list("functions/ns/other/") == [zip_key("ns", "other", stamps[0])]


def test_quota_counts_the_tenant_only_and_not_through_links(tmp_path: Path) -> None:
    make_version(tmp_path / "tenant-a" / "fn", "v1", 1, size=600)
    make_version(tmp_path / "tenant-b" / "fn", "v1", 1, size=5_000)
    (tmp_path / "tenant-a" / "fn" / "v1" / "link").symlink_to(tmp_path / "tenant-b" / "fn" / "v1" / "handler.py")
    assert tree_bytes(tmp_path / "tenant-a") < 700
    check_tenant_quota(tmp_path, "tenant-a", RetentionPolicy(tenant_quota_bytes=1_000))
    with pytest.raises(QuotaExceeded) as err:
        check_tenant_quota(tmp_path, "tenant-b", RetentionPolicy(tenant_quota_bytes=1_000))
    assert err.value.status == 413 and err.value.details["quota"] == 1_000


def test_policy_from_the_environment() -> None:
    assert RetentionPolicy.from_env({}) == RetentionPolicy(3, 1024**3)
    assert RetentionPolicy.from_env({"SLESS_CODE_VERSIONS_KEPT": "5", "SLESS_TENANT_CODE_QUOTA_BYTES": "10"}) == \
        RetentionPolicy(5, 10)
    with pytest.raises(ValueError):
        RetentionPolicy.from_env({"SLESS_CODE_VERSIONS_KEPT": "0"})
