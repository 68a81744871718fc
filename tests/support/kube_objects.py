"""Custom resources as the API server sends them in watch events, for the API's route-table and router tests.

Shared by test_kube_routes.py and test_routers.py: both feed the same shapes to the code that reads watches,
and a shape kept in one place changes for both at once.
"""

from __future__ import annotations

from typing import Any

NS, OTHER = "sless-0123456789abcdef", "sless-fedcba9876543210"


def fn(name: str, phase: str | None = "Ready", ns: str = NS, image: str | None = None,
       timeout: int = 30) -> dict[str, Any]:
    """A Function resource; PHASE None: the operator has not written a status yet."""
    obj: dict[str, Any] = {"metadata": {"name": name, "namespace": ns},
                           "spec": {"runtime": "python3.11", "timeoutSec": timeout}}
    if phase is not None:
        obj["status"] = {"phase": phase, **({"image": image} if image else {})}
    return obj


def trg(name: str, function: str, kind: str = "http", enabled: bool = True, auth: str = "public",
        ns: str = NS, path: str | None = None) -> dict[str, Any]:
    """A Trigger resource."""
    spec: dict[str, Any] = {"type": kind, "function": function, "enabled": enabled, "auth": auth}
    if path is not None:
        spec["path"] = path
    return {"metadata": {"name": name, "namespace": ns}, "spec": spec}
