"""Secret delivery, checked from inside a function: the reader function, its references and the leak scan.

Shared by the e2e secrets tests on ``sless up`` and the Vault-backed ones of an installed platform, which
deliver the same references to the same function and look for the same values on disk.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import requests

from tests.support.platform import Tenant

# Answers hashes of what it received, never the values: whatever appears in a record or log came from the platform.
READER = """\
import hashlib, os

def _h(text):
    return hashlib.sha256(text.encode()).hexdigest()

def handle(event):
    with open(os.path.join(os.environ["SLESS_SECRETS_DIR"], "api-token")) as fh:
        token = fh.read()
    return {"env": _h(os.environ.get("DB_PASSWORD", "")), "file": _h(token), "pid": os.getpid()}
"""
REFS = [{"name": "db", "key": "password", "env": "DB_PASSWORD"}, {"name": "db", "key": "token", "file": "api-token"}]


def call_until(tenant: Tenant, name: str, want: dict[str, str], wait: float = 60) -> dict[str, Any]:
    """NAME's first answer holding WANT (a secret's new value reaches the function's next start)."""
    deadline, last = time.monotonic() + wait, {}
    while time.monotonic() < deadline:
        resp = requests.post(tenant.fn_url(name), json={}, timeout=30)
        if resp.status_code == 200:
            last = resp.json()
            if all(last.get(k) == v for k, v in want.items()):
                return dict(last)
        time.sleep(0.3)
    raise AssertionError(f"{name} did not answer {want} within {wait}s: {last}")


def files_containing(root: Path, values: tuple[str, ...]) -> list[str]:
    """Every file below ROOT (databases, their WAL, logs, code, the platform's own log) holding a value."""
    found = []
    needles = [v.encode() for v in values]
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                found += [f"{path}: {n.decode()}" for n in needles if n in data]
        except OSError:
            continue
    return found
