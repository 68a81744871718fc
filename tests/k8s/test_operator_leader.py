"""Two operators on one cluster take turns through a Lease: only its holder reconciles.

Real processes on the kwok test bed. The leader is SIGKILLed right after Functions were created (mid-create), or
frozen with SIGSTOP: the standby takes the Lease once it has seen it unrenewed for its duration, finishes the work,
and every Function ends with exactly one Deployment. A frozen leader that wakes up finds the Lease gone and exits.
A leader stopped with SIGTERM gives the Lease back, so the standby takes over at once.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.kube_operator import CODE_A, Operator, Sless
from tests.support.poll import until
from tests.support.testbed import Testbed

pytestmark = pytest.mark.k8s

LEASE_SEC = 6


@pytest.fixture
def pair(sless_crds: Testbed, tenant: str, tmp_path: Path) -> Iterator[tuple[Operator, Operator, str]]:
    """Two operators of one tenant namespace, electing a leader through a Lease in a platform namespace of their
    own; the namespace's name is the third item."""
    bed = sless_crds
    platform_ns = f"sless-system-{secrets.token_hex(4)}"
    build_ns = f"sless-build-{secrets.token_hex(4)}"
    bed.kubectl("create", "namespace", platform_ns)
    env = {"SLESS_OPERATOR_LEADER_ELECTION": "true", "SLESS_OPERATOR_LEASE_SEC": str(LEASE_SEC),
           "SLESS_PLATFORM_NAMESPACE": platform_ns}
    ops = [Operator(bed, tenant, build_ns, tmp_path / name, env) for name in ("a", "b")]
    for op in ops:
        op.log_dir.mkdir()
        op.start()
    try:
        yield ops[0], ops[1], platform_ns
    finally:
        for op in ops:
            if op.proc is not None and op.proc.poll() is None:
                os.kill(op.pid, signal.SIGCONT)
            op.stop()
        for ns in (platform_ns, build_ns):
            bed.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)


def holder(bed: Testbed, namespace: str) -> str:
    lease = bed.get("lease", "sless-operator", "-n", namespace) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def leader_of(bed: Testbed, namespace: str, ops: tuple[Operator, ...]) -> Operator | None:
    """The operator whose pid the Lease's holder names (identities are host_pid_random)."""
    held = holder(bed, namespace)
    return next((op for op in ops if op.proc is not None and f"_{op.pid}_" in held), None)


def functions(sless: Sless, names: list[str]) -> None:
    """Functions whose code is fetched at start (no build): Ready once their Deployment is (kwok)."""
    for name in names:
        key = f"code/{sless.ns}/{name}/{CODE_A[:8]}.tar.gz"
        sless.apply("Function", name, {"runtime": "python3.11", "codeHash": CODE_A, "codeKey": key,
                                       "codeSha256": CODE_A[::-1]})  # fmt: skip


def one_set_each(sless: Sless, names: list[str]) -> None:
    """Every Function Ready, with exactly one Deployment and one Service of its own."""
    for name in names:
        until(f"{name} Ready", lambda n=name: sless.status("Function", n).get("phase") == "Ready", 90, 0.3)
    for kind in ("deployments", "services"):
        found = [item["metadata"]["name"] for item in sless.labelled(kind, "sless.dev/function")]
        for name in names:
            assert found.count(name) == 1, (kind, name, found)


def test_the_standby_takes_over_a_killed_leader_mid_create(pair: tuple[Operator, Operator, str], tenant: str) -> None:
    a, b, platform_ns = pair
    bed = a.bed
    leader = until("one operator holds the Lease", lambda: leader_of(bed, platform_ns, (a, b)), 60, 0.2)
    standby = b if leader is a else a
    until("the other stands by", lambda: "standing by" in standby.log_path.read_text(errors="replace"), 30, 0.2)
    sless = Sless(bed, tenant, leader)
    names = [f"fn{i}" for i in range(6)]
    functions(sless, names)
    killed = time.monotonic()
    leader.kill()  # mid-create: the Functions were just created, their children partly or not at all
    until("the standby holds the Lease", lambda: leader_of(bed, platform_ns, (standby,)) is standby,
          LEASE_SEC * 5, 0.2)
    took = time.monotonic() - killed
    print(f"the standby took over {took:.1f}s after the leader was killed (Lease: {LEASE_SEC}s)")
    assert took >= LEASE_SEC * 0.8  # it waited for the Lease to expire: the killed leader did not give it back
    one_set_each(Sless(bed, tenant, standby), names)

    # a graceful stop gives the Lease back: a new standby takes over without waiting for it to expire
    leader.start()
    until("the restarted one stands by", lambda: "standing by" in leader.log_path.read_text(errors="replace"),
          30, 0.2)
    stopped = time.monotonic()
    assert standby.stop() == 0, standby.log_tail()
    until("the Lease handed over", lambda: leader_of(bed, platform_ns, (leader,)) is leader, LEASE_SEC * 5, 0.2)
    assert time.monotonic() - stopped < LEASE_SEC, "the stopped leader did not give the Lease back"
    more = ["after-handover"]
    functions(sless, more)
    one_set_each(sless, names + more)


def test_a_frozen_leader_is_replaced_and_steps_down_when_it_wakes(pair: tuple[Operator, Operator, str],
                                                                  tenant: str) -> None:
    a, b, platform_ns = pair
    bed = a.bed
    leader = until("one operator holds the Lease", lambda: leader_of(bed, platform_ns, (a, b)), 60, 0.2)
    standby = b if leader is a else a
    assert leader.proc is not None
    os.kill(leader.pid, signal.SIGSTOP)
    names = [f"frozen{i}" for i in range(4)]
    functions(Sless(bed, tenant, standby), names)  # created while the leader is frozen
    until("the standby holds the Lease", lambda: leader_of(bed, platform_ns, (standby,)) is standby,
          LEASE_SEC * 5, 0.2)
    one_set_each(Sless(bed, tenant, standby), names)
    os.kill(leader.pid, signal.SIGCONT)
    code = leader.proc.wait(LEASE_SEC * 3)
    assert code == 1, leader.log_tail()
    assert "stepping down" in leader.log_path.read_text(errors="replace")
    assert leader_of(bed, platform_ns, (standby,)) is standby
    leader.proc = None
    more = ["after-wake"]
    functions(Sless(bed, tenant, standby), more)
    one_set_each(Sless(bed, tenant, standby), names + more)
