"""Secrets of the standalone backend: the secret store's CRUD, and the restarts a changed secret needs.

A function reads its secrets when its process starts, so writing a secret restarts (redeploys) every
function that uses it; a secret still used cannot be deleted, nor lose a key a function reads.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sless_api.backends.standalone.routing import StandaloneRouter
from sless_api.backends.standalone.state import StateStore
from sless_api.stores.secrets import SecretMeta, SecretValues
from sless_api.stores.secrets.store import SecretStore
from sless_api.stores.secrets.usage import refuse_dropping_keys, refuse_if_used

log = logging.getLogger("sless.standalone")


class TenantSecrets:
    def __init__(self, state: StateStore, secrets: SecretStore, router: StandaloneRouter) -> None:
        self.state = state
        self.secrets = secrets
        self.router = router

    async def list_secrets(self, namespace: str) -> list[SecretMeta]:
        return await asyncio.to_thread(self.secrets.list, namespace)

    async def get_secret(self, namespace: str, name: str) -> SecretMeta:
        return await asyncio.to_thread(self.secrets.get, namespace, name)

    async def create_secret(self, namespace: str, name: str, data: SecretValues) -> SecretMeta:
        self.state.ensure_namespace(namespace, time.time())
        meta = await asyncio.to_thread(self.secrets.create, namespace, name, data)
        await self._secret_changed(namespace, name)
        return meta

    async def replace_secret(self, namespace: str, name: str, data: SecretValues) -> SecretMeta:
        refuse_dropping_keys(name, data, [rec.spec for rec in self.state.list_functions(namespace)])
        meta = await asyncio.to_thread(self.secrets.replace, namespace, name, data)
        await self._secret_changed(namespace, name)
        return meta

    async def delete_secret(self, namespace: str, name: str) -> None:
        await asyncio.to_thread(self.secrets.get, namespace, name)
        refuse_if_used(name, [rec.spec for rec in self.state.list_functions(namespace)])
        await asyncio.to_thread(self.secrets.delete, namespace, name)

    async def _secret_changed(self, namespace: str, name: str) -> None:
        """Every function using secret NAME gets a process of the new version (it reads values at start)."""
        for rec in self.state.list_functions(namespace):
            if any(ref.name == name for ref in rec.spec.secrets):
                log.info("%s/%s: secret %r changed: restarting", namespace, rec.spec.name, name)
                await self.router.sync(namespace, rec.spec.name)
