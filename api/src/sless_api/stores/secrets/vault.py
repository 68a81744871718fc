"""Secrets in Vault's KV version 2 engine (``SLESS_SECRETS_BACKEND=vault``), through hvac.

Each tenant secret is one KV entry ``<mount>/<prefix>/<namespace>/<name>``; Vault keeps its versions,
and a write uses check-and-set, so a create never overwrites an entry made meanwhile and a replace never
revives one deleted meanwhile. Namespace and name are validated before they become a path.

Settings: ``SLESS_VAULT_ADDR`` (else ``VAULT_ADDR``), ``SLESS_VAULT_TOKEN`` (else ``VAULT_TOKEN``),
``SLESS_VAULT_MOUNT`` (default ``secret``), ``SLESS_VAULT_PREFIX`` (default ``sless-tenants``), read and
checked with the API's config (``secrets.factory.SecretsSettings``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import hvac
import hvac.exceptions

from sless_api.domain.errors import Conflict, NotFound, Unavailable
from sless_api.domain.secrets import SecretMeta, SecretValues
from sless_core.naming import validate_name, validate_namespace


@dataclass(frozen=True)
class VaultSettings:
    addr: str
    token: str
    mount: str = "secret"
    prefix: str = "sless-tenants"


def _time(value: object) -> float:
    if not isinstance(value, str) or not value:
        return 0.0
    text = re.sub(r"\.(\d{6})\d*", r".\1", value.replace("Z", "+00:00"))  # Vault gives nanoseconds
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return 0.0


class VaultSecretStore:
    def __init__(self, settings: VaultSettings, client: hvac.Client | None = None) -> None:
        self.settings = settings
        self.client = client or hvac.Client(url=settings.addr, token=settings.token, timeout=10)
        self.kv = self.client.secrets.kv.v2

    def close(self) -> None:
        self.client.adapter.close()

    def _path(self, namespace: str, name: str | None = None) -> str:
        base = f"{self.settings.prefix}/{validate_namespace(namespace)}"
        return base if name is None else f"{base}/{validate_name(name)}"

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, mount_point=self.settings.mount, **kwargs)
        except hvac.exceptions.InvalidPath:
            raise NotFound(f"{what} not found") from None
        except (hvac.exceptions.Forbidden, hvac.exceptions.Unauthorized):
            raise Unavailable("the secret store (Vault) refused this platform's token") from None
        except hvac.exceptions.VaultError as exc:
            if "check-and-set" in str(exc):
                raise Conflict(f"{what} was changed meanwhile") from None
            raise Unavailable(f"the secret store (Vault) failed: {type(exc).__name__}") from None
        except OSError as exc:  # requests' connection errors derive from it
            raise Unavailable(f"the secret store (Vault) is unreachable: {type(exc).__name__}") from None

    def _read(self, namespace: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """(data, metadata) of the current version; NotFound also for a deleted current version."""
        answer = self._call(f"secret {name!r}", self.kv.read_secret_version, self._path(namespace, name),
                            raise_on_deleted_version=True)
        body = answer.get("data") or {}
        return body.get("data") or {}, body.get("metadata") or {}

    def _meta(self, namespace: str, name: str) -> SecretMeta:
        data, meta = self._read(namespace, name)
        full = self._call(f"secret {name!r}", self.kv.read_secret_metadata, self._path(namespace, name))
        created = _time((full.get("data") or {}).get("created_time"))
        version = int(meta.get("version") or 0)
        return SecretMeta(namespace, name, tuple(sorted(data)), version, f"{created:.6f}:{version}", created,
                          _time(meta.get("created_time")))

    def list(self, namespace: str) -> list[SecretMeta]:
        try:
            answer = self._call("secrets", self.kv.list_secrets, self._path(namespace))
        except NotFound:
            return []
        names = sorted(k for k in (answer.get("data") or {}).get("keys") or [] if not k.endswith("/"))
        out = []
        for name in names:
            try:
                out.append(self._meta(namespace, name))
            except NotFound:
                continue  # deleted meanwhile, or only its metadata is left
        return out

    def get(self, namespace: str, name: str) -> SecretMeta:
        return self._meta(namespace, name)

    def values(self, namespace: str, name: str) -> SecretValues:
        data, _meta = self._read(namespace, name)
        return {str(k): str(v) for k, v in data.items()}

    def create(self, namespace: str, name: str, data: SecretValues) -> SecretMeta:
        try:
            self._call(f"secret {name!r}", self.kv.create_or_update_secret, self._path(namespace, name),
                       secret=dict(data), cas=0)
        except Conflict:
            raise Conflict(f"secret {name!r} already exists") from None
        return self._meta(namespace, name)

    def replace(self, namespace: str, name: str, data: SecretValues) -> SecretMeta:
        current = self._meta(namespace, name)
        self._call(f"secret {name!r}", self.kv.create_or_update_secret, self._path(namespace, name),
                   secret=dict(data), cas=current.version)
        return self._meta(namespace, name)

    def delete(self, namespace: str, name: str) -> None:
        self._meta(namespace, name)
        self._call(f"secret {name!r}", self.kv.delete_metadata_and_all_versions, self._path(namespace, name))
