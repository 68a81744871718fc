"""The secret store of ``SLESS_SECRETS_BACKEND`` that lives outside Kubernetes.

``local`` (standalone's default): AES-GCM encrypted in the data dir. ``vault``: Vault KV v2. The ``kubernetes``
store (Secrets in the tenant namespace, the kubernetes backend's default) and Vault mirrored into those Secrets
belong to that backend: ``backends.kube.secrets.kube_secret_store``.
"""

from __future__ import annotations

from pathlib import Path

from sless_api.stores.secrets.settings import SecretsSettings
from sless_api.stores.secrets.store import SecretStore


def vault_store(settings: SecretsSettings) -> SecretStore:
    """Vault KV v2 as SETTINGS name it."""
    from sless_api.stores.secrets.vault import VaultSecretStore, VaultSettings

    return VaultSecretStore(VaultSettings(settings.vault_addr, settings.vault_token, settings.vault_mount,
                                          settings.vault_prefix))


def secret_store(settings: SecretsSettings, data_dir: Path) -> SecretStore:
    """The standalone backend's store: Vault when SETTINGS say so, else the encrypted file in DATA_DIR."""
    if settings.backend == "vault":
        return vault_store(settings)
    if settings.backend == "kubernetes":
        raise ValueError("SLESS_SECRETS_BACKEND=kubernetes needs SLESS_BACKEND=kubernetes")
    from sless_api.stores.secrets.local import LocalSecretStore

    return LocalSecretStore(data_dir / "secrets.db", settings.key_file or data_dir / "secrets.key")
