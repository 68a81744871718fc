"""Which store keeps tenant secrets (``SLESS_SECRETS_BACKEND``) and its Vault settings, read with the API's config.

Apart from :mod:`.factory` (which builds the store and imports the backends' clients), so the config imports
no backend.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sless_core.envconfig import ConfigError, EnvReader

BACKENDS = ("local", "kubernetes", "vault")
VAULT_PATH = re.compile(r"[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*")


@dataclass(frozen=True)
class SecretsSettings:
    """The store of tenant secrets and its Vault settings, read once with the API's config and checked
    against the platform backend then (a wrong pairing stops the start, not the first secret write)."""

    backend: str = "local"
    key_file: Path | None = None  # local: None means <data dir>/secrets.key
    vault_addr: str = ""
    vault_token: str = field(default="", repr=False)
    vault_mount: str = "secret"
    vault_prefix: str = "sless-tenants"

    @classmethod
    def from_env(cls, env: Mapping[str, str], platform_backend: str) -> SecretsSettings:
        reader = EnvReader(env)
        default = "kubernetes" if platform_backend == "kubernetes" else "local"
        backend = reader.choice("SLESS_SECRETS_BACKEND", default, BACKENDS)
        if backend == "kubernetes" and platform_backend != "kubernetes":
            raise ConfigError("SLESS_SECRETS_BACKEND=kubernetes needs SLESS_BACKEND=kubernetes")
        if backend == "local" and platform_backend == "kubernetes":
            raise ConfigError("SLESS_SECRETS_BACKEND=local is the standalone backend's: with "
                              "SLESS_BACKEND=kubernetes use kubernetes or vault")
        key_file = reader.optional("SLESS_SECRETS_KEY_FILE")
        settings = cls(
            backend=backend,
            key_file=Path(key_file) if key_file else None,
            vault_addr=reader.optional("SLESS_VAULT_ADDR") or reader.text("VAULT_ADDR", ""),
            vault_token=reader.optional("SLESS_VAULT_TOKEN") or reader.text("VAULT_TOKEN", ""),
            vault_mount=reader.text("SLESS_VAULT_MOUNT", cls.vault_mount),
            vault_prefix=reader.text("SLESS_VAULT_PREFIX", cls.vault_prefix).strip("/"),
        )
        if backend == "vault":
            if not settings.vault_addr or not settings.vault_token:
                raise ConfigError("SLESS_SECRETS_BACKEND=vault needs SLESS_VAULT_ADDR and SLESS_VAULT_TOKEN "
                                  "(or VAULT_ADDR and VAULT_TOKEN)")
            for name, value in (("SLESS_VAULT_MOUNT", settings.vault_mount),
                                ("SLESS_VAULT_PREFIX", settings.vault_prefix)):
                if not VAULT_PATH.fullmatch(value):
                    raise ConfigError(f"{name}={value!r}: expected path segments of [A-Za-z0-9_-] separated by '/'")
        return settings
