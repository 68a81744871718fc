"""Function code in object storage, for the Kubernetes backend: the zip, its build context, its source view.

An upload is unpacked (``zipsafe`` rejects hostile archives before anything is stored) only to
generate the build context; the API keeps no code on its own disk. Keys carry a sortable
timestamp and the code hash, so the newest zip of the current code is found by listing, and a
few older versions are kept for a build that may still be reading one.

Blocking I/O throughout: the platform calls this through ``asyncio.to_thread``.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3.exceptions
from minio.error import MinioException

from sless_api.buildcontext import make_build_context
from sless_api.kube.settings import KubeSettings
from sless_api.platform import NotFound, Unavailable
from sless_api.storage import CodeStore, StorageError, context_key, function_prefixes, zip_key
from sless_api.storage.versions import newest_archive, prune, stamp, unpack_archive
from sless_api.zipsafe import ZipLimits, extract_zip, read_source_files
from sless_core.models import FunctionSpec

log = logging.getLogger("sless.kube.code")
KEEP_VERSIONS = 5
STORE_ERRORS = (StorageError, MinioException, urllib3.exceptions.HTTPError, OSError)


@dataclass(frozen=True)
class StoredCode:
    """Where an upload went, and the build context's digest the build checks before it unpacks it."""

    zip_key: str
    context_key: str
    context_sha256: str

    @property
    def keys(self) -> tuple[str, str]:
        return self.zip_key, self.context_key


class CodeArchive:
    def __init__(self, store: CodeStore, settings: KubeSettings, tmp_dir: Path,
                 limits: ZipLimits | None = None) -> None:
        self.store = store
        self.settings = settings
        self.tmp_dir = tmp_dir
        self.limits = limits or ZipLimits()

    def _workdir(self) -> tempfile.TemporaryDirectory[str]:
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        return tempfile.TemporaryDirectory(prefix="sless-code-", dir=self.tmp_dir)

    def _context(self, code_dir: Path, spec: FunctionSpec, code_hash: str) -> bytes:
        return make_build_context(code_dir, spec.runtime, spec.entrypoint, self.settings.base_image(spec.runtime),
                                  code_hash=code_hash, go_run_image=self.settings.go_run_image)

    def store_upload(self, namespace: str, spec: FunctionSpec, zip_path: Path, code_hash: str) -> StoredCode:
        """Check and store an uploaded zip and its build context.

        Raises ``ZipRejected`` (a 400) for a bad archive; nothing is stored then.
        """
        with self._workdir() as work:
            code_dir = Path(work) / "code"
            extract_zip(zip_path, code_dir, self.limits)
            context = self._context(code_dir, spec, code_hash)
        version = stamp(code_hash)
        keys = zip_key(namespace, spec.name, version), context_key(namespace, spec.name, version)
        try:
            self.store.put_file(keys[0], zip_path)
            self.store.put_bytes(keys[1], context)
        except STORE_ERRORS as exc:
            self.discard(keys)
            raise Unavailable(f"code storage is unavailable ({type(exc).__name__}); try again") from exc
        return StoredCode(keys[0], keys[1], hashlib.sha256(context).hexdigest())

    def rebuild_context(self, namespace: str, spec: FunctionSpec, code_hash: str) -> tuple[str, str]:
        """A new context for stored code whose runtime or entrypoint changed (both are in the Dockerfile)."""
        with self._workdir() as work:
            code_dir = self._fetch(namespace, spec.name, code_hash, Path(work))
            context = self._context(code_dir, spec, code_hash)
        key = context_key(namespace, spec.name, stamp(code_hash))
        try:
            self.store.put_bytes(key, context)
        except STORE_ERRORS as exc:
            raise Unavailable(f"code storage is unavailable ({type(exc).__name__}); try again") from exc
        return key, hashlib.sha256(context).hexdigest()

    def source(self, namespace: str, name: str, code_hash: str) -> list[dict[str, Any]]:
        with self._workdir() as work:
            return read_source_files(self._fetch(namespace, name, code_hash, Path(work)))

    def _fetch(self, namespace: str, name: str, code_hash: str, work: Path) -> Path:
        """Download and unpack the newest stored zip of CODE_HASH into WORK/code."""
        key = self._archive_key(namespace, name, code_hash)
        try:
            return unpack_archive(self.store, key, work, self.limits)
        except STORE_ERRORS as exc:
            raise Unavailable(f"code storage is unavailable ({type(exc).__name__}); try again") from exc

    def _archive_key(self, namespace: str, name: str, code_hash: str) -> str:
        try:
            key = newest_archive(self.store, namespace, name, code_hash)
        except STORE_ERRORS as exc:
            raise Unavailable(f"code storage is unavailable ({type(exc).__name__}); try again") from exc
        if key is None:
            raise NotFound(f"the code of function {name!r} is no longer stored; upload it again")
        return key

    def prune(self, namespace: str, name: str, keep: int = KEEP_VERSIONS) -> None:
        """Delete all but the newest KEEP zips and contexts of a function (best effort)."""
        try:
            prune(self.store, namespace, name, keep)
        except STORE_ERRORS:
            log.warning("pruning old code of %s/%s failed", namespace, name, exc_info=True)

    def discard(self, keys: tuple[str, ...]) -> None:
        for key in keys:
            try:
                self.store.delete_prefix(key)
            except STORE_ERRORS:
                log.warning("could not delete %s", key, exc_info=True)

    def delete(self, namespace: str, name: str) -> None:
        for prefix in function_prefixes(namespace, name):
            self.store.delete_prefix(prefix)
