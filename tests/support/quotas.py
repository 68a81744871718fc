"""Wait until the test bed's controller-manager counts the platform's custom resources in quotas.

The tenant quota limits ``count/functions.sless.dev`` and its siblings. The controller-manager counts a
custom resource only once its quota controller has discovered the CRD (it looks every 30 s), and a quota
it synced before that stays uncounted until its next full resync (5 min); meanwhile the API server refuses
creates of that kind in the quota's namespace ("status unknown for quota"). On a cluster the CRDs are
installed long before the first tenant; a test session installs them and makes tenants at once, so
fixtures that apply the CRDs call :func:`wait_counted` once per test bed.
"""

from __future__ import annotations

import secrets
import time

from sless_core import crd
from tests.support.testbed import Testbed

_COUNTED: set[str] = set()
KEYS = [f"count/{plural}.{crd.GROUP}" for plural in (crd.FUNCTION_PLURAL, crd.TRIGGER_PLURAL, crd.JOB_PLURAL)]


def wait_counted(bed: Testbed, timeout: float = 90) -> None:
    """Until a fresh quota on the custom resources is counted (a quota made too early is made again)."""
    if str(bed.kubeconfig) in _COUNTED:
        return
    namespace = f"quota-probe-{secrets.token_hex(4)}"
    bed.kubectl("create", "namespace", namespace)
    deadline = time.monotonic() + timeout
    try:
        while True:
            name = f"probe-{secrets.token_hex(3)}"
            bed.apply({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": namespace},
                       "spec": {"hard": dict.fromkeys(KEYS, "1")}})  # fmt: skip
            for _ in range(8):
                used = ((bed.get("resourcequota", name, "-n", namespace) or {}).get("status") or {}).get("used") or {}
                if all(key in used for key in KEYS):
                    _COUNTED.add(str(bed.kubeconfig))
                    return
                time.sleep(0.5)
            if time.monotonic() > deadline:
                raise AssertionError(f"the controller-manager did not count {KEYS} within {timeout:.0f}s")
            bed.kubectl("delete", "resourcequota", name, "-n", namespace, "--wait=false", check=False)
    finally:
        bed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
