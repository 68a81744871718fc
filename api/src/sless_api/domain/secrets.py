"""What a secret is: its validated body, the metadata reads may show, and the version functions follow.

A secret's values never leave the platform through the API: ``SecretMeta`` (what GET returns) has its
keys and version only, and every validation message names keys, never values.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sless_api.domain.records import iso
from sless_core.errors import ValidationError
from sless_core.models import SecretRef, validate_secret_key
from sless_core.naming import validate_name

MAX_KEYS = 64
#: One value: what one environment string holds comfortably (and a file of a certificate or two).
MAX_VALUE_BYTES = 32 * 1024
#: All of one secret's keys and values (Kubernetes allows 1 MiB per Secret; env space is smaller).
MAX_SECRET_BYTES = 256 * 1024

#: A secret's data as the stores keep it (key -> value); never rendered into a response.
SecretValues = dict[str, str]


@dataclass(frozen=True)
class SecretMeta:
    """What may be shown of a secret: never its values.

    ``version`` counts writes (1 at creation); ``revision`` is an opaque token that changes with every
    write, also across a delete and re-create (where the version starts again at 1): functions follow it.
    """

    namespace: str
    name: str
    keys: tuple[str, ...]
    version: int
    revision: str
    created_at: float
    updated_at: float

    def to_api(self) -> dict[str, Any]:
        return {"name": self.name, "namespace": self.namespace, "keys": list(self.keys), "version": self.version,
                "created_at": iso(self.created_at), "updated_at": iso(self.updated_at)}


def parse_secret_body(body: object, name: str | None = None) -> tuple[str, SecretValues]:
    """``{name, data: {key: value}}`` checked: the name, 1..MAX_KEYS keys, string values within bounds.

    ``name``: the name in the path (PUT); the body may repeat it, not contradict it.
    """
    if not isinstance(body, dict):
        raise ValidationError("the request body must be a JSON object {name, data}")
    unknown = sorted(set(body) - {"name", "data"})
    if unknown:
        raise ValidationError(f"unknown field(s): {', '.join(unknown)}", field=unknown[0])
    if name is not None and body.get("name", name) != name:
        raise ValidationError("name in the body differs from the name in the path", field="name")
    secret_name = validate_name(body.get("name", name))
    data = body.get("data")
    if not isinstance(data, dict) or not data:
        raise ValidationError("data must be a non-empty object of key: string value", field="data")
    if len(data) > MAX_KEYS:
        raise ValidationError(f"data has more than {MAX_KEYS} keys", field="data")
    total = 0
    for key, value in data.items():
        validate_secret_key(key, "data")
        if not isinstance(value, str):
            raise ValidationError(f"data[{key}] must be a string (got {type(value).__name__})", field="data")
        size = len(value.encode("utf-8"))
        if size > MAX_VALUE_BYTES:
            raise ValidationError(f"data[{key}] is longer than {MAX_VALUE_BYTES} bytes", field="data")
        if "\x00" in value:  # an environment string cannot hold it
            raise ValidationError(f"data[{key}] must not contain a NUL character", field="data")
        total += len(key) + size
    if total > MAX_SECRET_BYTES:
        raise ValidationError(f"data is larger than {MAX_SECRET_BYTES} bytes in all", field="data")
    return secret_name, {k: data[k] for k in sorted(data)}


def check_references(refs: Iterable[SecretRef], metas: Mapping[str, SecretMeta]) -> None:
    """Every reference names a stored secret and one of its keys, else a 400 naming the first that does not."""
    for ref in refs:
        meta = metas.get(ref.name)
        if meta is None:
            raise ValidationError(f"secret {ref.name!r} does not exist (create it first: POST .../secrets)",
                                  field="secrets")
        if ref.key not in meta.keys:
            raise ValidationError(f"secret {ref.name!r} has no key {ref.key!r}", field="secrets")


def secrets_version(refs: Iterable[SecretRef], metas: Mapping[str, SecretMeta]) -> str:
    """A short hash of the revisions of the secrets REFS use ("" when none): it changes when one of
    them is written, so whatever carries it (a process version, a pod-template annotation) restarts."""
    names = sorted({ref.name for ref in refs})
    if not names:
        return ""
    revisions = {n: metas[n].revision if n in metas else "" for n in names}
    return hashlib.sha256(json.dumps(revisions, sort_keys=True).encode()).hexdigest()[:16]


def uses_secret(refs: Iterable[SecretRef], name: str) -> bool:
    return any(ref.name == name for ref in refs)


def now() -> float:
    return time.time()
