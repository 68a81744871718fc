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

from sless_api.backends.settings import KubeSettings
from sless_api.domain.errors import NotFound, Unavailable
from sless_api.domain.zipsafe import ZipLimits, extract_zip, read_source_files
from sless_api.stores.code import CodeStore, StorageError, code_key, context_key, function_prefixes, zip_key
from sless_api.stores.code.versions import newest_archive, prune, stamp, unpack_archive
from sless_core import rebuild
from sless_core.buildcontext import make_build_context, make_code_archive, make_deps_context
from sless_core.models import FunctionSpec

log = logging.getLogger("sless.kube.code")
KEEP_VERSIONS = 10  # as many as status.versions keeps: a rollback finds its code
STORE_ERRORS = (StorageError, MinioException, urllib3.exceptions.HTTPError, OSError)


@dataclass(frozen=True)
class StoredCode:
    """Where an upload went, with the digests a pod or a build checks before it unpacks anything.

    Code is stored as an archive (``code_key``) that Python and Node pods fetch at start and that a Go
    function's compile Job fetches; an image is built only for dependencies (``deps_key`` and a
    code-free build context) and shared by every function of the tenant with the same manifest
    (``sless_core.rebuild``). With code fetching off, the build context holds the code: a build per change.
    """

    zip_key: str
    context_key: str = ""
    context_sha256: str = ""
    code_key: str = ""
    code_sha256: str = ""
    deps_key: str = ""

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(k for k in (self.zip_key, self.context_key, self.code_key) if k)

    def cr_fields(self) -> dict[str, str]:
        """The Function spec fields that point at this code (every one set, "" clearing an old value)."""
        return {"contextKey": self.context_key, "contextSha256": self.context_sha256, "codeKey": self.code_key,
                "codeSha256": self.code_sha256, "depsHash": self.deps_key}


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

    def _artifacts(self, code_dir: Path, spec: FunctionSpec, code_hash: str) -> dict[str, bytes | str]:
        """What to store for this code: the Go build context, or the code archive (+ a dependency context)."""
        needs = rebuild.plan(spec.runtime, code_dir)
        if not self.settings.code_fetch:  # the code in the image: a build per change
            return {"context": self._context(code_dir, spec, code_hash)}
        out: dict[str, bytes | str] = {"code": make_code_archive(code_dir), "deps_key": needs.deps_key}
        if needs.deps_key:
            manifests = rebuild.read_manifests(spec.runtime, code_dir)
            out["context"] = make_deps_context(spec.runtime, manifests, self.settings.base_image(spec.runtime),
                                               needs.deps_key)
        return out

    def _put(self, namespace: str, name: str, version: str, zip_path: Path | None,
             artifacts: dict[str, bytes | str]) -> StoredCode:
        context, code = artifacts.get("context"), artifacts.get("code")
        stored = StoredCode(
            zip_key=zip_key(namespace, name, version) if zip_path is not None else "",
            context_key=context_key(namespace, name, version) if isinstance(context, bytes) else "",
            context_sha256=hashlib.sha256(context).hexdigest() if isinstance(context, bytes) else "",
            code_key=code_key(namespace, name, version) if isinstance(code, bytes) else "",
            code_sha256=hashlib.sha256(code).hexdigest() if isinstance(code, bytes) else "",
            deps_key=str(artifacts.get("deps_key") or ""),
        )
        try:
            if zip_path is not None:
                self.store.put_file(stored.zip_key, zip_path)
            if isinstance(context, bytes):
                self.store.put_bytes(stored.context_key, context)
            if isinstance(code, bytes):
                self.store.put_bytes(stored.code_key, code)
        except STORE_ERRORS as exc:
            self.discard(stored.keys)
            raise Unavailable(f"code storage is unavailable ({type(exc).__name__}); try again") from exc
        return stored

    def store_upload(self, namespace: str, spec: FunctionSpec, zip_path: Path, code_hash: str) -> StoredCode:
        """Check and store an uploaded zip and what runs it (code archive, build context).

        Raises ``ZipRejected`` (a 400) for a bad archive; nothing is stored then.
        """
        with self._workdir() as work:
            code_dir = Path(work) / "code"
            extract_zip(zip_path, code_dir, self.limits)
            artifacts = self._artifacts(code_dir, spec, code_hash)
        return self._put(namespace, spec.name, stamp(code_hash), zip_path, artifacts)

    def rebuild_context(self, namespace: str, spec: FunctionSpec, code_hash: str) -> StoredCode:
        """New artifacts for stored code whose runtime or entrypoint changed (the Go build needs both)."""
        with self._workdir() as work:
            code_dir = self._fetch(namespace, spec.name, code_hash, Path(work))
            artifacts = self._artifacts(code_dir, spec, code_hash)
        return self._put(namespace, spec.name, stamp(code_hash), None, artifacts)

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

    def require(self, keys: list[str], version: int, name: str) -> None:
        """NotFound unless every one of KEYS (a version's code archive, build context) is still stored."""
        try:
            for key in keys:
                folder = key.rsplit("/", 1)[0] + "/"
                if key not in self.store.list(folder):
                    raise NotFound(f"the code of version {version} of function {name!r} is no longer stored")
        except STORE_ERRORS as exc:
            raise Unavailable(f"code storage is unavailable ({type(exc).__name__}); try again") from exc

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
