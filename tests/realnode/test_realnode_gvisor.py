"""The optional gVisor sandbox on a real kubelet: a function that requires it runs under runsc.

The node's containerd has gVisor's shim as the runtime handler ``runsc`` (systrap platform; see
tests/testbed/bedlib/gvisor.py), the chart's RuntimeClass ``gvisor`` names it, and the API and the
operator run as host processes. A function that asks for ``"sandbox": "gvisor"`` answers through
``/fn`` with the kernel it sees: gVisor's own (``/proc/version`` names gVisor), while the same code
without the field sees the node's kernel. Then the administrator's setting
(``SLESS_REQUIRE_SANDBOX=gvisor``) moves that second function into gVisor as well.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest

from tests.install.helm import render
from tests.support.kube_operator import Operator, strip_finalizers
from tests.support.platform import Tenant
from tests.support.realnode import RealNode
from tests.support.realnode_operator import build_logs, build_namespace, operator_env

pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1200)]

# the kernel the function sees, and how it got there
HANDLER = """import platform


def handle(event):
    with open("/proc/version") as f:
        return {"proc_version": f.read().strip(), "release": platform.release()}
"""


def kernel(t: Tenant, name: str) -> dict[str, Any] | None:
    import requests

    try:
        resp = requests.get(t.fn_url(name), timeout=10)
    except requests.RequestException:
        return None
    return resp.json() if resp.status_code == 200 else None


def under_gvisor(answer: dict[str, Any] | None) -> bool:
    return answer is not None and "gvisor" in answer["proc_version"].lower()


def pods_of(real_node: RealNode, ns: str, function: str) -> list[dict[str, Any]]:
    found = real_node.bed.get("pods", "-n", ns, "-l", f"sless.dev/function={function}") or {}
    return [p for p in found.get("items", []) if p["metadata"].get("deletionTimestamp") is None]


def sandbox_events(real_node: RealNode, ns: str) -> str:
    """The namespace's events about pod sandboxes (where a runsc failure shows), for a failure's message."""
    out = real_node.bed.kubectl("get", "events", "-n", ns, "-o", "custom-columns=REASON:.reason,MESSAGE:.message",
                                check=False).stdout  # fmt: skip
    return "\n".join(line for line in out.splitlines() if "Sandbox" in line or "runsc" in line)[-3000:]


def test_a_function_that_requires_gvisor_runs_under_runsc(
    real_node: RealNode, s3_on_bridge: str, api_url: str, tmp_path: Path
) -> None:
    bed = real_node.bed
    if not bed.info["real_node"].get("gvisor"):
        pytest.skip("the node has no runsc handler: tests/testbed/build-gvisor.sh did not build gVisor "
                    "(see the bed's build output) or SLESS_TESTBED_GVISOR=0")  # fmt: skip
    (runtime_class,) = [o for o in render({"sandbox.runtimeClass.create": True}) if o["kind"] == "RuntimeClass"]
    bed.apply(runtime_class)
    t = Tenant(api_url, f"gvisor-{secrets.token_hex(4)}")
    t.api("POST", "/ensure", expect=201)
    resp = t.api("POST", "/functions", json={"name": "odd", "runtime": "python3.11", "sandbox": "kata"}, expect=400)
    assert resp.json()["field"] == "sandbox", resp.text
    build_ns = build_namespace(real_node)
    env = operator_env(real_node, s3_on_bridge)
    op = Operator(bed, t.ns, build_ns, tmp_path, extra_env=env).start()
    try:
        for name, extra in (("boxed", {"sandbox": "gvisor"}), ("plain", {})):
            # the pod's memory limit holds gVisor's kernel too (the sandbox runs in the pod's cgroup)
            body = {"name": name, "runtime": "python3.11", "memory_mb": 256, **extra}
            t.api("POST", "/functions", json=body, expect=201)
            t.upload(name, {"handler.py": HANDLER})
            t.api("POST", "/triggers", json={"name": name, "type": "http", "function": name}, expect=201)
        assert t.api("GET", "/functions/boxed", expect=200).json()["sandbox"] == "gvisor"
        try:
            for name in ("boxed", "plain"):
                t.wait_phase(name, ("Ready",), 600)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{sandbox_events(real_node, t.ns)}\n{build_logs(real_node, build_ns)}\n"
                                 f"{op.log_tail()}") from None  # fmt: skip

        boxed = bed.wait("boxed answers", lambda: kernel(t, "boxed"), timeout=180, interval=0.5)
        plain = bed.wait("plain answers", lambda: kernel(t, "plain"), timeout=180, interval=0.5)
        print(f"boxed sees {boxed}\nplain sees {plain}")
        assert under_gvisor(boxed), boxed
        assert not under_gvisor(plain), plain
        assert boxed["release"] != plain["release"], "gVisor reports a kernel release of its own"
        assert [p["spec"].get("runtimeClassName") for p in pods_of(real_node, t.ns, "boxed")] == ["gvisor"]
        assert [p["spec"].get("runtimeClassName") for p in pods_of(real_node, t.ns, "plain")] == [None]

        # the administrator requires gVisor for every function: the plain one rolls into it
        op.stop()
        op = Operator(bed, t.ns, build_ns, tmp_path, extra_env={**env, "SLESS_REQUIRE_SANDBOX": "gvisor"}).start()
        bed.wait("plain runs under gVisor", lambda: under_gvisor(kernel(t, "plain")), timeout=300, interval=1)
        bed.wait("plain's old pod gone", lambda: [p["spec"].get("runtimeClassName")
                                                  for p in pods_of(real_node, t.ns, "plain")] == ["gvisor"],
                 timeout=120)  # fmt: skip
    finally:
        op.stop()
        strip_finalizers(bed, t.ns)
        bed.kubectl("delete", "namespace", t.ns, build_ns, "--wait=false", "--ignore-not-found", check=False)
        bed.kubectl("delete", "runtimeclass", runtime_class["metadata"]["name"], "--ignore-not-found", check=False)
