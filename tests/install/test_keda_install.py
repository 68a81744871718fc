"""The sless role's KEDA tasks through ansible-playbook, on a kwok test bed of this module's own: a KEDA installed
any other way (here: the official chart, installed with helm by hand) is used without being touched.

The role's own install of KEDA (its copy of the chart where the cluster has none), its idempotence and its uninstall
are the Molecule scenario default's. The bed is this module's: KEDA's chart registers the external metrics
APIService, which on kwok (no container runs) is never served, and while it is not, no namespace deletion of the
cluster finishes; the session's shared bed must not see it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.testbed import Testbed, start_testbed, stop_testbed

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "roles" / "sless" / "files" / "keda-2.20.2.tgz"
PLAYBOOK = """\
- name: The sless role's KEDA tasks
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: KEDA
      ansible.builtin.include_role:
        name: sless
        tasks_from: "{{ entry }}"
"""

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    try:
        own = start_testbed(tmp_path_factory.mktemp("keda-bed") / "state")
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        if own.existing:
            pytest.skip("installs KEDA's chart: not on a cluster that is not the test's own")
        yield own
    finally:
        stop_testbed(own)


def run(bed: Testbed, work: Path, entry: str, **extra: Any) -> subprocess.CompletedProcess[str]:
    """ansible-playbook with the role's ENTRY task file (keda or uninstall) and EXTRA vars."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "play.yml").write_text(PLAYBOOK)
    assert bed.bin_dir is not None
    extra_vars = {"entry": entry, "sless_helm_binary": str(bed.bin_dir / "helm"), **extra}
    env = {**bed.env, "K8S_AUTH_KUBECONFIG": str(bed.kubeconfig), "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".ansible/collections"),
           "ANSIBLE_NOCOLOR": "1"}  # fmt: skip
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", str(work / "play.yml"),
            "-e", json.dumps(extra_vars), "-e", f"ansible_python_interpreter={sys.executable}"]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False, cwd=ROOT)


def recap(proc: subprocess.CompletedProcess[str]) -> str:
    return (proc.stdout + proc.stderr)[-3000:]


def changed(proc: subprocess.CompletedProcess[str]) -> int:
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("localhost") and "changed=" in ln)
    return int(line.split("changed=")[1].split()[0])


def helm(bed: Testbed, *args: str) -> Any:
    assert bed.bin_dir is not None
    proc = subprocess.run([str(bed.bin_dir / "helm"), *args], capture_output=True, text=True, env=bed.env,
                          timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout) if "json" in args else proc.stdout


def releases(bed: Testbed) -> list[tuple[str, str, str]]:
    return [(r["namespace"], r["name"], r["revision"]) for r in helm(bed, "list", "-A", "-o", "json")]


def test_an_existing_keda_is_used_and_left_alone(bed: Testbed, tmp_path: Path) -> None:
    """A KEDA the cluster's admin installed (the official chart, by hand, in a namespace of their choosing): the role
    installs nothing beside it, insists that sless-scaler admit the namespace it runs in, and its uninstall keeps it."""
    helm(bed, "install", "keda", str(CHART), "-n", "autoscaling", "--create-namespace", "--wait", "--timeout", "2m")
    try:
        there = {"sless_values": {"scaler": {"kedaNamespace": "autoscaling"}}}
        used = run(bed, tmp_path / "used", "keda", **there)
        assert used.returncode == 0, recap(used)
        assert changed(used) == 0, recap(used)
        assert "KEDA is installed already (not by this role): left as it is" in used.stdout
        # the default kedaNamespace (keda) would keep this KEDA out of sless-scaler: refused, nothing installed
        elsewhere = run(bed, tmp_path / "elsewhere", "keda")
        assert elsewhere.returncode != 0, recap(elsewhere)
        assert "its operator runs in autoscaling, not in keda" in elsewhere.stdout + elsewhere.stderr
        assert bed.get("namespace", "keda") is None
        kept = run(bed, tmp_path / "kept", "uninstall", **there)
        assert kept.returncode == 0, recap(kept)
        assert releases(bed) == [("autoscaling", "keda", "1")]
        values = helm(bed, "get", "values", "keda", "-n", "autoscaling", "-o", "json")
        assert values in ({}, None), values
    finally:
        helm(bed, "uninstall", "keda", "-n", "autoscaling", "--wait")
        bed.kubectl("delete", "namespace", "autoscaling", "--wait=false")
