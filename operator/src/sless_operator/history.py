"""``status.versions``: every deploy of a Function that became Ready, for the API's versions and rollback.

A version keeps what is needed to deploy it again: the code hash and the spec it ran with (its
configuration and where its code and build context are), without ``replicas`` (scaling is not a
version) nor ``traffic`` (a split shares calls between versions; it is not one). The API rolls back
by writing such a spec back; once Ready, that is a new version. The newest ``KEEP`` stay (the API
keeps as many code archives).
"""

from __future__ import annotations

from typing import Any

KEEP = 10
NOT_VERSIONED = ("replicas", "codeHash", "traffic")  # scaling and a traffic split are not versions


def recorded(old: dict[str, Any], spec: dict[str, Any], code_hash: str, now: str) -> list[dict[str, Any]] | None:
    """OLD status's versions with SPEC added as the newest; None when it is the newest already."""
    history = [v for v in old.get("versions") or [] if isinstance(v, dict) and isinstance(v.get("version"), int)]
    entry_spec = {k: v for k, v in sorted(spec.items()) if k not in NOT_VERSIONED}
    newest = history[-1] if history else None
    if newest is not None and newest.get("codeHash") == code_hash and newest.get("spec") == entry_spec:
        return None
    number = int(newest["version"]) + 1 if newest is not None else 1
    return [*history, {"version": number, "codeHash": code_hash, "deployedAt": now, "spec": entry_spec}][-KEEP:]
