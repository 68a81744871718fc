"""How much code a tenant keeps on the platform's disk: the last few versions per function, under a quota.

Every upload with new code leaves an extracted version folder and an archive plus build context in the
code store. Without a bound a tenant fills the platform's disk by uploading in a loop (each zip is within
the upload limit); with a per-tenant quota it can only fill its own share. The newest few versions stay
so a rollback needs no re-upload.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sless_api.backends.settings import RetentionPolicy
from sless_api.domain.errors import PlatformError
from sless_api.stores.code import CodeStore
from sless_api.stores.code.versions import prune


class QuotaExceeded(PlatformError):
    status = 413


def tree_bytes(root: Path) -> int:
    """Bytes of the regular files under ROOT (links are not followed: they cannot inflate or escape the count)."""
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            try:
                stat = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            total += stat.st_size
    return total


def check_tenant_quota(code_root: Path, namespace: str, policy: RetentionPolicy) -> None:
    """413 when the tenant's extracted code (the new version included) is over its quota."""
    used = tree_bytes(code_root / namespace)
    if used > policy.tenant_quota_bytes:
        raise QuotaExceeded(f"the tenant's stored code ({used} bytes) would exceed its quota of "
                            f"{policy.tenant_quota_bytes} bytes: delete functions or upload smaller code",
                            used=used, quota=policy.tenant_quota_bytes)


def prune_versions(function_dir: Path, current: str, policy: RetentionPolicy) -> list[str]:
    """Remove extracted versions beyond the newest ``versions_kept`` (CURRENT always stays); returns what went."""
    if not function_dir.is_dir():
        return []
    others = [p for p in function_dir.iterdir() if p.is_dir() and p.name != current]
    others.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    removed = others[policy.versions_kept - 1:]
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
    return sorted(p.name for p in removed)


def prune_stored(store: CodeStore, namespace: str, name: str, policy: RetentionPolicy) -> int:
    """Delete archives and build contexts beyond the newest ``versions_kept``."""
    return prune(store, namespace, name, policy.versions_kept)
