#!/usr/bin/python
"""The tenants' secrets in Vault KV v2 (``<mount>/<prefix>/<namespace>/<name>``) into a backup folder and back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sless_backup_files import BackupError, read_json, write_json

DOCUMENTATION = r"""
---
module: sless_backup_vault
short_description: Copy the tenants' secrets from Vault KV v2 into a backup folder, or back into Vault
description:
  - The API keeps each tenant secret as the KV v2 entry C(<mount>/<prefix>/<namespace>/<name>)
    (C(SLESS_SECRETS_BACKEND=vault)).
  - V(save) walks O(prefix) and writes the current version of every entry whose namespace is a tenant namespace
    and whose name a secret name (others are skipped and named in C(skipped)) to O(path)C(/secrets.json), 0600.
  - V(restore) checks every namespace, name and value of that file first (anything else fails the task before
    Vault is written), then writes each entry whose current data differ. Entries Vault holds and the backup does
    not are left alone. Check mode checks and counts only. Values never appear in the task's result.
options:
  mode:
    description: V(save) (Vault to folder) or V(restore) (folder to Vault).
    type: str
    choices: [save, restore]
    required: true
  path:
    description: The backup's Vault folder.
    type: path
    required: true
  url:
    description: Vault's address.
    type: str
    required: true
  token:
    description: A Vault token that may list and read (V(save)) or write (V(restore)) below the prefix.
    type: str
    required: true
  ca_cert:
    description: CA bundle that verifies Vault's certificate (empty, the system's).
    type: str
    default: ""
  mount:
    description: The KV v2 engine's mount.
    type: str
    default: secret
  prefix:
    description: The folder of the tenants' entries (the API's C(SLESS_VAULT_PREFIX)).
    type: str
    default: sless-tenants
"""

RETURN = r"""
entries:
  description: How many entries the backup holds.
  returned: always
  type: int
written:
  description: V(restore), how many were written.
  returned: always
  type: int
skipped:
  description: V(save), the paths below the prefix that are not a tenant's secret (not saved).
  returned: always
  type: list
  elements: str
"""

FILE = "secrets.json"


def client(url: str, token: str, ca_cert: str) -> Any:
    import hvac

    return hvac.Client(url=url, token=token, verify=ca_cert or True, timeout=30)


def _keys(kv: Any, path: str, mount: str) -> list[str]:
    import hvac.exceptions

    try:
        answer = kv.list_secrets(path=path, mount_point=mount)
    except hvac.exceptions.InvalidPath:
        return []
    return [str(k) for k in (answer.get("data") or {}).get("keys") or []]


def _current(kv: Any, path: str, mount: str) -> dict[str, Any] | None:
    """The current version's data, None when there is none (deleted, or only metadata left)."""
    import hvac.exceptions

    try:
        answer = kv.read_secret_version(path=path, mount_point=mount, raise_on_deleted_version=True)
    except hvac.exceptions.InvalidPath:
        return None
    data = (answer.get("data") or {}).get("data")
    return dict(data) if isinstance(data, dict) else None


def save(vault: Any, mount: str, prefix: str, folder: Path) -> tuple[int, list[str]]:
    from sless_core.naming import is_function_name, is_tenant_namespace

    kv = vault.secrets.kv.v2
    entries, skipped = [], []
    for ns_key in sorted(_keys(kv, prefix, mount)):
        namespace = ns_key.rstrip("/")
        if not ns_key.endswith("/") or not is_tenant_namespace(namespace):
            skipped.append(f"{prefix}/{ns_key}")
            continue
        for name in sorted(_keys(kv, f"{prefix}/{namespace}", mount)):
            if not is_function_name(name):  # the same rule as a secret's name (validate_name)
                skipped.append(f"{prefix}/{namespace}/{name}")
                continue
            data = _current(kv, f"{prefix}/{namespace}/{name}", mount)
            if data is not None:
                entries.append({"namespace": namespace, "name": name, "data": data})
    write_json(folder / FILE, {"mount": mount, "prefix": prefix, "entries": entries})
    return len(entries), skipped


def checked(folder: Path) -> list[dict[str, Any]]:
    """The file's entries, every namespace, name and value checked."""
    from sless_core.errors import ValidationError
    from sless_core.naming import validate_name, validate_namespace

    saved = read_json(folder / FILE, "the Vault entries")
    entries = saved.get("entries") if isinstance(saved, dict) else None
    if not isinstance(entries, list):
        raise BackupError(f"{folder / FILE} lists no entries")
    out, seen = [], set()
    for entry in entries:
        if not isinstance(entry, dict):
            raise BackupError(f"{folder / FILE} holds an entry that is not an object")
        try:
            namespace = validate_namespace(entry.get("namespace"))
            name = validate_name(entry.get("name"))
        except ValidationError as exc:
            raise BackupError(f"Vault entry {entry.get('namespace')!r}/{entry.get('name')!r}: {exc}") from None
        data = entry.get("data")
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            raise BackupError(f"Vault entry {namespace}/{name}: its data are not string keys and values")
        if (namespace, name) in seen:
            raise BackupError(f"Vault entry {namespace}/{name} is listed twice")
        seen.add((namespace, name))
        out.append({"namespace": namespace, "name": name, "data": data})
    return out


def restore(vault: Any, mount: str, prefix: str, entries: list[dict[str, Any]]) -> int:
    kv = vault.secrets.kv.v2
    written = 0
    for entry in entries:
        path = f"{prefix}/{entry['namespace']}/{entry['name']}"
        if _current(kv, path, mount) == entry["data"]:
            continue
        kv.create_or_update_secret(path=path, secret=entry["data"], mount_point=mount)
        written += 1
    return written


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "mode": {"type": "str", "choices": ["save", "restore"], "required": True},
            "path": {"type": "path", "required": True},
            "url": {"type": "str", "required": True},
            "token": {"type": "str", "required": True, "no_log": True},
            "ca_cert": {"type": "str", "default": ""},
            "mount": {"type": "str", "default": "secret"},
            "prefix": {"type": "str", "default": "sless-tenants"},
        },
        supports_check_mode=True,
    )
    p = module.params
    folder, prefix = Path(p["path"]), p["prefix"].strip("/")
    try:
        vault = client(p["url"], p["token"], p["ca_cert"])
        if p["mode"] == "save":
            if module.check_mode:
                module.exit_json(changed=True, entries=0, written=0, skipped=[])
            count, skipped = save(vault, p["mount"], prefix, folder)
            module.exit_json(changed=True, entries=count, written=0, skipped=skipped)
        entries = checked(folder)
        if module.check_mode:
            module.exit_json(changed=bool(entries), entries=len(entries), written=0, skipped=[])
        written = restore(vault, p["mount"], prefix, entries)
        module.exit_json(changed=written > 0, entries=len(entries), written=written, skipped=[])
    except BackupError as exc:
        module.fail_json(msg=f"sless backup, Vault: {exc}")
    except Exception as exc:  # hvac's and requests' errors name the failure, never a value
        module.fail_json(msg=f"sless backup, Vault at {p['url']} ({p['mount']}/{prefix}): {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
