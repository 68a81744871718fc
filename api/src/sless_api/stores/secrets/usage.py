"""What both backends do with secrets around functions: check references, follow versions, deliver values."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sless_api.domain.errors import Conflict, NotFound
from sless_api.domain.secrets import SecretMeta, check_references, secrets_version
from sless_api.stores.secrets.store import SecretStore
from sless_core.errors import ValidationError
from sless_core.models import FunctionSpec, SecretRef

log = logging.getLogger("sless.secrets")


@dataclass(frozen=True)
class Delivery:
    """A function's secrets resolved to values: env vars, files (name -> bytes) and their version hash."""

    env: dict[str, str] = field(default_factory=dict, repr=False)
    files: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)
    version: str = ""


async def referenced(store: SecretStore, namespace: str, refs: Iterable[SecretRef]) -> dict[str, SecretMeta]:
    """The metadata of every secret REFS name that exists (missing ones are left out)."""
    out: dict[str, SecretMeta] = {}
    for name in sorted({ref.name for ref in refs}):
        try:
            out[name] = await asyncio.to_thread(store.get, namespace, name)
        except NotFound:
            continue
    return out


async def checked_version(store: SecretStore, namespace: str, refs: Sequence[SecretRef]) -> str:
    """The version hash of REFS' secrets; ValidationError (400) naming a missing secret or key."""
    metas = await referenced(store, namespace, refs)
    check_references(refs, metas)
    return secrets_version(refs, metas)


async def deliver(store: SecretStore, namespace: str, function: str, refs: Sequence[SecretRef]) -> Delivery:
    """Values for REFS. A secret or key gone since the function was accepted (changed outside the platform)
    is left out with a warning naming it, so the function starts and says what it misses."""
    if not refs:
        return Delivery()
    metas = await referenced(store, namespace, refs)
    values: dict[str, dict[str, str]] = {}
    for name in metas:
        try:
            values[name] = await asyncio.to_thread(store.values, namespace, name)
        except NotFound:
            continue
    env: dict[str, str] = {}
    files: list[tuple[str, bytes]] = []
    for ref in refs:
        value = values.get(ref.name, {}).get(ref.key)
        if value is None:
            log.warning("%s/%s: secret %r key %r is missing; not delivered", namespace, function, ref.name, ref.key)
            continue
        if ref.env is not None:
            env[ref.env] = value
        elif ref.file is not None:
            files.append((ref.file, value.encode("utf-8")))
    return Delivery(env, tuple(sorted(files)), secrets_version(refs, metas))


def refuse_if_used(name: str, specs: Iterable[FunctionSpec]) -> None:
    """409 naming the functions that still reference secret NAME (deleting it would break them)."""
    users = sorted(spec.name for spec in specs if any(ref.name == name for ref in spec.secrets))
    if users:
        raise Conflict(f"secret {name!r} is used by function(s) {', '.join(users)}: remove the references first",
                       functions=users)


async def current_version(store: SecretStore, namespace: str, refs: Sequence[SecretRef]) -> str:
    """The version hash of REFS' secrets as they are now (no check: for following changes)."""
    return secrets_version(refs, await referenced(store, namespace, refs))


def refuse_dropping_keys(name: str, keys: Iterable[str], specs: Iterable[FunctionSpec]) -> None:
    """400 when a replace of secret NAME would remove a key a function references (naming both)."""
    kept = set(keys)
    for spec in sorted(specs, key=lambda s: s.name):
        for ref in spec.secrets:
            if ref.name == name and ref.key not in kept:
                raise ValidationError(f"function {spec.name!r} uses key {ref.key!r} of secret {name!r}: keep it, "
                                      "or change the function first", field="data")
