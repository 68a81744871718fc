"""A standalone function's code on disk and in the code store.

Each uploaded version is unpacked into ``functions/<ns>/<name>/<code hash>`` (what builds and processes
read) and kept as its zip and build context in the code store (what rollback, ``/source`` and a pruned
folder come back from). The tenant's disk quota is checked on every unpack; older versions beyond the
kept few are pruned after a good build.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from sless_api.backends.settings import RetentionPolicy
from sless_api.backends.standalone.retention import (
    QuotaExceeded,
    check_tenant_quota,
    prune_stored,
    prune_versions,
)
from sless_api.domain.errors import NotFound
from sless_api.domain.records import FunctionRecord
from sless_api.domain.versions import Version
from sless_api.domain.zipsafe import ZipLimits, extract_zip, read_source_files
from sless_api.stores.code import CodeStore, context_key, function_prefixes, zip_key
from sless_api.stores.code.versions import newest_archive, stamp, unpack_archive
from sless_core.buildcontext import make_build_context

log = logging.getLogger("sless.standalone")
BASE_IMAGES = {"python3.11": "sless/python3.11", "nodejs20": "sless/nodejs20", "go1.23": "sless/go1.23"}


class CodeFiles:
    """Blocking (disk and store I/O): callers run it in a worker thread."""

    def __init__(self, code_root: Path, work_dir: Path, store: CodeStore, zip_limits: ZipLimits,
                 retention: RetentionPolicy) -> None:
        self.code_root = code_root
        self.work_dir = work_dir
        self.store = store
        self.zip_limits = zip_limits
        self.retention = retention

    def code_dir(self, namespace: str, name: str, code_hash: str) -> Path:
        return self.code_root / namespace / name / code_hash

    def store_upload(self, rec: FunctionRecord, zip_path: Path, code_hash: str) -> None:
        """Unpack an upload (unless that version is unpacked already) and keep its zip and build context."""
        code_dir = self.code_dir(rec.namespace, rec.spec.name, code_hash)
        if not code_dir.exists():
            code_dir.parent.mkdir(parents=True, exist_ok=True)
            extract_zip(zip_path, code_dir, self.zip_limits)
            try:
                check_tenant_quota(self.code_root, rec.namespace, self.retention)
            except QuotaExceeded:
                shutil.rmtree(code_dir, ignore_errors=True)
                raise
        version = stamp(code_hash)
        self.store.put_file(zip_key(rec.namespace, rec.spec.name, version), zip_path)
        context = make_build_context(code_dir, rec.spec.runtime, rec.spec.entrypoint,
                                     BASE_IMAGES[rec.spec.runtime])
        self.store.put_bytes(context_key(rec.namespace, rec.spec.name, version), context)

    def ensure_unpacked(self, namespace: str, name: str, target: Version) -> None:
        """Unpack a version's stored zip again when its folder was pruned from the disk."""
        code_dir = self.code_dir(namespace, name, target.code_hash)
        if code_dir.is_dir():
            return
        key = newest_archive(self.store, namespace, name, target.code_hash)
        if key is None:
            raise NotFound(f"the code of version {target.version} of function {name!r} is no longer stored")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="restore-", dir=self.work_dir) as tmp:
            unpacked = unpack_archive(self.store, key, Path(tmp), self.zip_limits)
            code_dir.parent.mkdir(parents=True, exist_ok=True)
            unpacked.rename(code_dir)

    def source(self, namespace: str, name: str, code_hash: str) -> list[dict[str, Any]]:
        """The uploaded archive's files (what the function wrote into its folder at run time is not source)."""
        key = newest_archive(self.store, namespace, name, code_hash)
        if key is None:
            raise NotFound(f"the code of function {name!r} is no longer stored; upload it again")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="source-", dir=self.work_dir) as tmp:
            return read_source_files(unpack_archive(self.store, key, Path(tmp), self.zip_limits))

    def prune(self, namespace: str, name: str, current: str) -> None:
        """After a good build: older versions beyond the kept few leave the disk and the code store."""
        removed = prune_versions(self.code_root / namespace / name, current, self.retention)
        stored = prune_stored(self.store, namespace, name, self.retention)
        if removed or stored:
            log.info("%s/%s: removed %d old code versions and %d stored objects", namespace, name, len(removed),
                     stored)

    def delete(self, namespace: str, name: str) -> None:
        """Every version of a deleted function, on disk and in the store."""
        shutil.rmtree(self.code_root / namespace / name, ignore_errors=True)
        for prefix in function_prefixes(namespace, name):
            self.store.delete_prefix(prefix)
