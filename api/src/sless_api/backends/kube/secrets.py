"""Secrets as Kubernetes Secrets in the tenant namespace (the kubernetes backend's store).

A tenant secret ``db`` is the Secret ``sless-secret-db``, labelled as the platform's: only labelled
Secrets are listed, so other Secrets in the namespace (an image pull secret) are neither shown nor
touched, and a name a tenant picks never collides with one the platform uses. Function pods read them
through ``secretKeyRef`` and projected volumes; the operator needs no Secret permission at all.
Writes carry the resourceVersion they read, so two concurrent replaces cannot both count as version N+1.
The API may touch Secrets only in tenant namespaces where it holds its RoleBinding (``sless_api.backends.kube.access``):
every method makes sure of it first.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import secrets as random
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from sless_api.backends.kube.client import KubeClient, KubeConflict, KubeNotFound
from sless_api.domain.errors import Conflict, NotFound
from sless_api.domain.secrets import SecretMeta, SecretValues, now
from sless_api.stores.secrets.factory import secret_store
from sless_api.stores.secrets.settings import SecretsSettings
from sless_api.stores.secrets.store import SecretStore
from sless_core import crd
from sless_core.naming import secret_object_name

LABEL_SECRET = "sless.dev/secret"  # noqa: S105  (a label key, not a secret)
VERSION = "sless.dev/secret-version"
REVISION = "sless.dev/secret-revision"
UPDATED = "sless.dev/secret-updated"


def _encode(data: SecretValues) -> dict[str, str]:
    return {k: base64.b64encode(v.encode()).decode() for k, v in sorted(data.items())}


def _body(namespace: str, name: str, data: SecretValues, version: int, resource_version: str | None = None) -> dict[
        str, Any]:
    meta: dict[str, Any] = {
        "name": secret_object_name(name), "namespace": namespace,
        "labels": {crd.LABEL_MANAGED: crd.MANAGED_BY, LABEL_SECRET: name},
        "annotations": {VERSION: str(version), REVISION: random.token_hex(8), UPDATED: f"{now():.3f}"},
    }  # fmt: skip
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta, "data": _encode(data)}


def _meta_of(obj: k8s.V1Secret) -> SecretMeta:
    meta = obj.metadata
    notes = meta.annotations or {}
    created = meta.creation_timestamp.timestamp() if meta.creation_timestamp else 0.0
    try:
        version = int(notes.get(VERSION, "1"))
        updated = float(notes.get(UPDATED, created))
    except ValueError:
        version, updated = 1, created
    name = (meta.labels or {}).get(LABEL_SECRET, "")
    return SecretMeta(meta.namespace, name, tuple(sorted(obj.data or {})), version,
                      notes.get(REVISION) or str(meta.uid), created, updated)


class KubeSecretStore:
    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube

    def close(self) -> None:
        """The client is the platform's, closed by it."""

    def _enter(self, namespace: str) -> None:
        """The API's rights in NAMESPACE (its RoleBinding); a namespace that does not exist holds no secret."""
        if not self.kube.access.ensure(namespace):
            raise KubeNotFound(f"namespace {namespace!r} not found", kind="namespaces")

    def _read(self, namespace: str, name: str) -> k8s.V1Secret:
        try:
            self._enter(namespace)
            obj = self.kube.call_sync(f"secret {name!r}", self.kube.core.read_namespaced_secret,
                                      secret_object_name(name), namespace)
        except KubeNotFound:
            raise NotFound(f"secret {name!r} not found") from None
        if (obj.metadata.labels or {}).get(LABEL_SECRET) != name:
            raise NotFound(f"secret {name!r} not found")  # a Secret of that name the platform did not make
        return obj

    def list(self, namespace: str) -> list[SecretMeta]:
        try:
            self._enter(namespace)
            found = self.kube.call_sync("secrets", self.kube.core.list_namespaced_secret, namespace,
                                        label_selector=f"{crd.LABEL_MANAGED}={crd.MANAGED_BY},{LABEL_SECRET}")
        except KubeNotFound:
            return []
        metas = [_meta_of(obj) for obj in found.items or []]
        return sorted((m for m in metas if m.name), key=lambda m: m.name)

    def get(self, namespace: str, name: str) -> SecretMeta:
        return _meta_of(self._read(namespace, name))

    def values(self, namespace: str, name: str) -> SecretValues:
        out: SecretValues = {}
        for key, value in (self._read(namespace, name).data or {}).items():
            try:
                out[key] = base64.b64decode(value).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                continue  # changed by hand into something this platform never writes
        return out

    def create(self, namespace: str, name: str, data: SecretValues) -> SecretMeta:
        self._enter(namespace)
        try:
            obj = self.kube.call_sync(f"secret {name!r}", self.kube.core.create_namespaced_secret, namespace,
                                      _body(namespace, name, data, 1))
        except KubeConflict:
            raise Conflict(f"secret {name!r} already exists") from None
        return _meta_of(obj)

    def replace(self, namespace: str, name: str, data: SecretValues) -> SecretMeta:
        current = self._read(namespace, name)
        version = _meta_of(current).version + 1
        body = _body(namespace, name, data, version, current.metadata.resource_version)
        try:
            obj = self.kube.call_sync(f"secret {name!r}", self.kube.core.replace_namespaced_secret,
                                      secret_object_name(name), namespace, body)
        except KubeConflict:
            raise Conflict(f"secret {name!r} was changed meanwhile; read it and try again") from None
        return _meta_of(obj)

    def delete(self, namespace: str, name: str) -> None:
        self._read(namespace, name)
        try:
            self.kube.call_sync(f"secret {name!r}", self.kube.core.delete_namespaced_secret,
                                secret_object_name(name), namespace)
        except KubeNotFound:
            raise NotFound(f"secret {name!r} not found") from None


class MirroredSecretStore:
    """Vault as the store of record, every write mirrored into the tenant's Kubernetes Secret
    (what function pods read); reads of keys and versions come from Vault."""

    def __init__(self, primary: Any, mirror: KubeSecretStore) -> None:
        self.primary = primary
        self.mirror = mirror

    def close(self) -> None:
        self.primary.close()

    def list(self, namespace: str) -> list[SecretMeta]:
        return list(self.primary.list(namespace))

    def get(self, namespace: str, name: str) -> SecretMeta:
        meta: SecretMeta = self.primary.get(namespace, name)
        return meta

    def values(self, namespace: str, name: str) -> SecretValues:
        data: SecretValues = self.primary.values(namespace, name)
        return data

    def _mirror(self, namespace: str, name: str, data: SecretValues) -> None:
        try:
            self.mirror.replace(namespace, name, data)
        except NotFound:
            self.mirror.create(namespace, name, data)

    def create(self, namespace: str, name: str, data: SecretValues) -> SecretMeta:
        meta: SecretMeta = self.primary.create(namespace, name, data)
        self._mirror(namespace, name, data)
        return meta

    def replace(self, namespace: str, name: str, data: SecretValues) -> SecretMeta:
        meta: SecretMeta = self.primary.replace(namespace, name, data)
        self._mirror(namespace, name, data)
        return meta

    def delete(self, namespace: str, name: str) -> None:
        self.primary.delete(namespace, name)
        with contextlib.suppress(NotFound):
            self.mirror.delete(namespace, name)



def kube_secret_store(settings: SecretsSettings, data_dir: Path, kube: KubeClient) -> SecretStore:
    """The kubernetes backend's store: Secrets in the tenant namespace, or Vault with each write mirrored into
    them (what function pods read), or the local file when SETTINGS say so."""
    if settings.backend == "kubernetes":
        return KubeSecretStore(kube)
    store = secret_store(settings, data_dir)
    return MirroredSecretStore(store, KubeSecretStore(kube)) if settings.backend == "vault" else store
