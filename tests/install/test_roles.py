"""The Ansible roles' shape: defaults and meta/argument_specs.yml in sync, role-prefixed
variables, tasks/main.yml as a table of contents that starts with the preflight."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if (p / "tasks" / "main.yml").is_file())
EXPECTED = {"postgresql", "rabbitmq", "ingress_timeouts", "vault_secrets", "runtime_images", "sless"}


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _defaults(role: Path) -> dict[str, Any]:
    return _load(role / "defaults" / "main.yml") or {}


def _specs(role: Path) -> dict[str, dict[str, Any]]:
    return dict(_load(role / "meta" / "argument_specs.yml")["argument_specs"])


def test_every_role_exists() -> None:
    assert {r.name for r in ROLES} == EXPECTED


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_defaults_are_all_specified(role: Path) -> None:
    options = _specs(role)["main"]["options"]
    missing = sorted(set(_defaults(role)) - set(options))
    assert missing == [], f"{role.name}: defaults without an argument spec: {missing}"


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_spec_defaults_equal_the_defaults_file(role: Path) -> None:
    defaults = _defaults(role)
    for entry, spec in _specs(role).items():
        for name, option in spec["options"].items():
            where = f"{role.name} {entry} {name}"
            assert option.get("description"), f"{where}: no description"
            assert option.get("type"), f"{where}: no type"
            if name in defaults:
                assert not option.get("required"), f"{where}: required, yet defaults/main.yml sets it"
                assert "default" in option, f"{where}: defaults/main.yml sets it, the spec has no default"
                assert option["default"] == defaults[name], (
                    f"{where}: spec default {option['default']!r} != {defaults[name]!r}"
                )
            else:
                assert option.get("required") is True, f"{where}: neither in defaults/main.yml nor required"


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_required_options_are_documented_in_defaults(role: Path) -> None:
    text = (role / "defaults" / "main.yml").read_text()
    for spec in _specs(role).values():
        for name, option in spec["options"].items():
            if option.get("required"):
                assert f"# Required, no default: {name}" in text, f"{role.name}: {name} is not explained in defaults"


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_defaults_are_commented(role: Path) -> None:
    lines = (role / "defaults" / "main.yml").read_text().splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith((" ", "#", "-")) and ":" in line:
            block = [ln for ln in lines[:i] if ln.strip()]
            above = block[-1] if block else ""
            is_group_member = above and not above.startswith("#") and not above.startswith(" ")
            assert above.startswith("#") or is_group_member, f"{role.name}: {line.split(':')[0]} has no comment"


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_variables_carry_the_role_prefix(role: Path) -> None:
    names = set(_defaults(role))
    for spec in _specs(role).values():
        names |= set(spec["options"])
    assert all(n.startswith(f"{role.name}_") for n in names), sorted(n for n in names if not n.startswith(role.name))


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_main_is_a_table_of_contents(role: Path) -> None:
    tasks = _load(role / "tasks" / "main.yml")
    assert tasks[0] == {"name": "Preflight", "ansible.builtin.import_tasks": "preflight.yml"}
    for task in tasks:
        modules = set(task) - {"name", "when", "loop", "loop_control", "tags"}
        assert modules <= {"ansible.builtin.import_tasks", "ansible.builtin.include_tasks"}, f"{role.name}: {task}"
        target = task.get("ansible.builtin.import_tasks") or task.get("ansible.builtin.include_tasks")
        assert (role / "tasks" / target).is_file(), f"{role.name}: {target} missing"


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_preflight_asserts_before_changing_anything(role: Path) -> None:
    tasks = _load(role / "tasks" / "preflight.yml")
    assert any("ansible.builtin.assert" in t for t in tasks)
    changing = {"kubernetes.core.k8s", "kubernetes.core.helm", "ansible.builtin.apt", "ansible.builtin.lineinfile",
                "community.postgresql.postgresql_user", "community.rabbitmq.rabbitmq_user"}  # fmt: skip
    assert not any(changing & set(t) for t in tasks), f"{role.name}: preflight changes something"


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_entry_points_have_task_files(role: Path) -> None:
    for entry in _specs(role):
        assert (role / "tasks" / f"{entry}.yml").is_file(), f"{role.name}: entry point {entry} has no tasks file"


def _modules(node: Any) -> set[str]:
    """Module names used anywhere in a task list (blocks included)."""
    found: set[str] = set()
    if isinstance(node, list):
        for item in node:
            found |= _modules(item)
    elif isinstance(node, dict):
        for key in ("block", "rescue", "always"):
            found |= _modules(node.get(key))
        keys = set(node) - {"name", "when", "loop", "loop_control", "register", "vars", "no_log", "become",
                            "become_user", "changed_when", "failed_when", "notify", "environment", "tags",
                            "block", "rescue", "always", "delegate_to", "run_once", "until", "retries", "delay",
                            "listen", "check_mode", "ignore_errors"}  # fmt: skip
        found |= keys
    return found


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_modules_are_fully_qualified(role: Path) -> None:
    for path in [*(role / "tasks").glob("*.yml"), *(role / "handlers").glob("*.yml")]:
        for module in _modules(_load(path)):
            assert module.count(".") >= 2, f"{path.relative_to(ROOT)}: {module} is not a fully qualified name"


def _tasks(path: Path) -> list[dict[str, Any]]:
    """Every task of a task file, those inside blocks included, in order."""
    out: list[dict[str, Any]] = []
    for task in _load(path):
        out.extend(task.get("block", [task]))
    return out


def test_keda_comes_from_the_role_s_copy_of_its_official_chart_unless_present() -> None:
    """sless installs KEDA by default from the official chart it carries (2.20.2, the version the tests run), only where
    the cluster has no KEDA, marking its release; the real-node scenario, whose node would pull KEDA's images from
    ghcr.io, turns it off."""
    role = ROOT / "roles" / "sless"
    defaults = _defaults(role)
    assert defaults["sless_install_keda"] is True
    assert defaults["sless_keda_chart_ref"] == "{{ role_path }}/files/keda-2.20.2.tgz"
    with tarfile.open(role / "files" / "keda-2.20.2.tgz") as tgz:
        member = tgz.extractfile("keda/Chart.yaml")
        assert member is not None
        chart = yaml.safe_load(member.read())
    assert (chart["name"], chart["version"], chart["appVersion"]) == ("keda", "2.20.2", "2.20.2")
    assert "Apache License" in (role / "files" / "keda-LICENSE").read_text()
    assert "kedacore/charts" in (role / "files" / "README.md").read_text()
    [entry] = [t for t in _load(role / "tasks" / "main.yml") if t.get("ansible.builtin.import_tasks") == "keda.yml"]
    assert entry["when"] == "sless_install_keda | bool"
    tasks = _tasks(role / "tasks" / "keda.yml")
    assert tasks[0]["kubernetes.core.k8s_info"]["name"] == "scaledobjects.keda.sh"
    [install] = [t for t in tasks if "kubernetes.core.helm" in t]
    assert install["when"] == "not sless_keda_foreign | bool"
    assert install["kubernetes.core.helm"]["chart_ref"] == "{{ sless_keda_chart_ref }}"
    converge = (ROOT / "molecule" / "e2e-real" / "converge.yml").read_text()
    assert "sless_install_keda: false" in converge


def test_uninstall_removes_keda_before_any_namespace() -> None:
    """KEDA's APIService, not served, stalls every namespace deletion: the role's KEDA goes first."""
    names = [t["name"] for t in _tasks(ROOT / "roles" / "sless" / "tasks" / "uninstall.yml")]
    keda = names.index("Uninstall | helm uninstall keda (its CRDs and its APIService go with it)")
    assert keda < names.index("Uninstall | Delete the namespaces")
    assert keda < names.index("Uninstall | Delete KEDA's namespace, which the role created")


@pytest.mark.parametrize(("password", "refused"), [("-UOhm1", True), ("ok-pass", False)])
def test_rabbitmq_preflight_refuses_a_password_rabbitmqctl_would_read_as_options(tmp_path: Path, password: str,
                                                                                 refused: bool) -> None:
    """rabbitmqctl add_user took a password starting with '-' for its options and failed mid-install."""
    import os
    import subprocess
    import sys

    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars": {"rabbitmq_mode": "external", "rabbitmq_url": f"amqp://sless:{password}@127.0.0.1:5672/sless"},
             "tasks": [{"ansible.builtin.include_role": {"name": "rabbitmq", "tasks_from": "preflight"}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_LOCALHOST_WARNING": "false"}
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,",
                           str(tmp_path / "play.yml")], env=env, capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert (done.returncode != 0) == refused, done.stdout[-2000:]
    assert ("starts with '-', which rabbitmqctl takes for an option" in done.stdout) == refused, done.stdout[-2000:]
    assert password not in done.stdout
