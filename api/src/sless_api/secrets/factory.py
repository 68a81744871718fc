"""The secret store a backend uses, from ``SLESS_SECRETS_BACKEND``.

``local`` (standalone's default): AES-GCM encrypted in the data dir. ``kubernetes`` (the kubernetes
backend's default): Secrets in the tenant namespace. ``vault``: Vault KV v2; with the kubernetes backend
each write is mirrored into the tenant's Secret, which is what function pods read.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sless_api.secrets.store import SecretStore

BACKENDS = ("local", "kubernetes", "vault")


def secret_store_from_env(env: Mapping[str, str], platform_backend: str, data_dir: Path,
                          kube: Any = None) -> SecretStore:
    """The store for PLATFORM_BACKEND (``standalone`` or ``kubernetes``); ``kube``: the platform's client."""
    default = "kubernetes" if platform_backend == "kubernetes" else "local"
    choice = (env.get("SLESS_SECRETS_BACKEND") or default).strip().lower()
    if choice not in BACKENDS:
        raise SystemExit(f"SLESS_SECRETS_BACKEND={choice!r}: use local, kubernetes or vault")
    if choice == "vault":
        from sless_api.secrets.vault import VaultSecretStore, VaultSettings

        try:
            vault = VaultSecretStore(VaultSettings.from_env(env))
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
        if platform_backend != "kubernetes":
            return vault
        from sless_api.secrets.kube import KubeSecretStore, MirroredSecretStore

        return MirroredSecretStore(vault, KubeSecretStore(kube))
    if choice == "kubernetes":
        if platform_backend != "kubernetes":
            raise SystemExit("SLESS_SECRETS_BACKEND=kubernetes needs SLESS_BACKEND=kubernetes")
        from sless_api.secrets.kube import KubeSecretStore

        return KubeSecretStore(kube)
    if platform_backend == "kubernetes":
        raise SystemExit("SLESS_SECRETS_BACKEND=local is the standalone backend's: with SLESS_BACKEND=kubernetes "
                         "use kubernetes or vault")
    from sless_api.secrets.local import LocalSecretStore

    key_file = Path(env.get("SLESS_SECRETS_KEY_FILE") or data_dir / "secrets.key")
    return LocalSecretStore(data_dir / "secrets.db", key_file)
