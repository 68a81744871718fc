"""The secret store a backend uses, from ``SLESS_SECRETS_BACKEND``.

``local`` (standalone's default): AES-GCM encrypted in the data dir. ``kubernetes`` (the kubernetes
backend's default): Secrets in the tenant namespace. ``vault``: Vault KV v2; with the kubernetes backend
each write is mirrored into the tenant's Secret, which is what function pods read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sless_api.secrets.settings import SecretsSettings
from sless_api.secrets.store import SecretStore


def secret_store(settings: SecretsSettings, platform_backend: str, data_dir: Path, kube: Any = None) -> SecretStore:
    """The store SETTINGS choose for PLATFORM_BACKEND (``standalone`` or ``kubernetes``); ``kube``: the
    platform's client."""
    if settings.backend == "vault":
        from sless_api.secrets.vault import VaultSecretStore, VaultSettings

        vault = VaultSecretStore(VaultSettings(settings.vault_addr, settings.vault_token, settings.vault_mount,
                                               settings.vault_prefix))
        if platform_backend != "kubernetes":
            return vault
        from sless_api.secrets.kube import KubeSecretStore, MirroredSecretStore

        return MirroredSecretStore(vault, KubeSecretStore(kube))
    if settings.backend == "kubernetes":
        from sless_api.secrets.kube import KubeSecretStore

        return KubeSecretStore(kube)
    from sless_api.secrets.local import LocalSecretStore

    return LocalSecretStore(data_dir / "secrets.db", settings.key_file or data_dir / "secrets.key")
