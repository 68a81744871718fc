"""Custom resources' specs parsed with the platform's own validation (``sless_core.models``).

The CRD schema catches malformed fields at the apiserver; these checks add the rules a schema
cannot express (reserved environment names, entrypoints per runtime, ...). A spec failing them
can never work, so handlers turn ``InvalidSpec`` into ``kopf.PermanentError``.
"""

from __future__ import annotations

from typing import Any

from sless_core import crd
from sless_core.errors import ValidationError
from sless_core.models import FunctionSpec, JobSpec, TriggerSpec
from sless_operator.manifests import FunctionRef, Owner

# The CRD bounds timeoutSec; the API applies the installation's own (lower) maximum.
MAX_TIMEOUT_SEC = 3600


class InvalidSpec(Exception):
    """The spec can never work as written; retrying will not help."""


def function_spec(name: str, spec: dict[str, Any]) -> FunctionSpec:
    try:
        return FunctionSpec.from_user(crd.function_spec_from_cr(name, spec), MAX_TIMEOUT_SEC)
    except ValidationError as exc:
        raise InvalidSpec(exc.message) from exc


def own_context_key(namespace: str, name: str, key: str) -> bool:
    """Whether KEY lies under the Function's own prefix (the API's layout, ``contexts/<ns>/<fn>/<file>``):
    a Function can never have another tenant's (or another function's) code built."""
    prefix = f"contexts/{namespace}/{name}/"
    rest = key.removeprefix(prefix)
    return (key.startswith(prefix) and bool(rest) and "/" not in rest and "\\" not in rest
            and not rest.startswith(".") and rest.isprintable())  # fmt: skip


def own_code_key(namespace: str, name: str, key: str) -> bool:
    """Whether KEY is one of the Function's own code archives (``code/<ns>/<fn>/<file>``)."""
    return own_context_key(namespace, name, "contexts/" + key.removeprefix("code/")) and key.startswith("code/")


def _hex64(value: object, field: str) -> str:
    text = str(value or "")
    if text and (len(text) != 64 or any(c not in "0123456789abcdef" for c in text)):
        raise InvalidSpec(f"{field} must be 64 lowercase hex digits")
    return text


def function_ref(body: dict[str, Any]) -> FunctionRef:
    """What the manifest builders need of a Function body; raises InvalidSpec."""
    meta, spec = body["metadata"], body.get("spec") or {}
    key = str(spec.get("contextKey") or "")
    if key and not own_context_key(meta["namespace"], meta["name"], key):
        raise InvalidSpec(f"contextKey must be contexts/{meta['namespace']}/{meta['name']}/<file>: "
                          "a Function builds only its own build context")  # fmt: skip
    code_key = str(spec.get("codeKey") or "")
    if code_key and not own_code_key(meta["namespace"], meta["name"], code_key):
        raise InvalidSpec(f"codeKey must be code/{meta['namespace']}/{meta['name']}/<file>: "
                          "a Function fetches only its own code")  # fmt: skip
    code_sha256 = _hex64(spec.get("codeSha256"), "codeSha256")
    if code_key and not code_sha256:
        raise InvalidSpec("codeKey is set but codeSha256 (what the fetched archive must hash to) is not")
    return FunctionRef(
        namespace=meta["namespace"],
        name=meta["name"],
        spec=function_spec(meta["name"], spec),
        code_hash=str(spec.get("codeHash") or ""),
        context_key=str(spec.get("contextKey") or ""),
        owner=Owner.of(body),
        context_sha256=str(spec.get("contextSha256") or ""),
        secrets_version=str(spec.get(crd.SECRETS_VERSION) or ""),
        code_key=code_key,
        code_sha256=code_sha256,
        deps_hash=_hex64(spec.get("depsHash"), "depsHash"),
    )


def trigger_spec(name: str, spec: dict[str, Any]) -> TriggerSpec:
    try:
        return TriggerSpec.from_user({"name": name, **{k: v for k, v in spec.items() if v is not None}})
    except ValidationError as exc:
        raise InvalidSpec(exc.message) from exc


def job_spec(name: str, spec: dict[str, Any]) -> JobSpec:
    body = {"name": name, "function": spec.get("function"), "event": spec.get("event") or {},
            "run_id": spec.get("runId", 1)}  # fmt: skip
    try:
        return JobSpec.from_user(body)
    except ValidationError as exc:
        raise InvalidSpec(exc.message) from exc
