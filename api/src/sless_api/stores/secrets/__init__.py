"""Tenant secrets: named sets of key/value strings that functions receive as env vars or files.

Values are write-only through the API: reads show keys and versions. Each backend store keeps them
where its platform can deliver them (standalone: an encrypted local file; Kubernetes: Secrets in the
tenant namespace; either: Vault KV v2 with ``SLESS_SECRETS_BACKEND=vault``).
"""

from sless_api.domain.secrets import SecretMeta, SecretValues, parse_secret_body, secrets_version
from sless_api.stores.secrets.store import SecretStore

__all__ = ["SecretMeta", "SecretStore", "SecretValues", "parse_secret_body", "secrets_version"]
