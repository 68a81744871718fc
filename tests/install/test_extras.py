"""The install tooling is an extra of its own: `pip install '.[install]'` is enough to run the playbooks."""

from __future__ import annotations

import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_ansible_core_comes_with_the_install_extra_not_only_with_dev() -> None:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("ansible-core") for req in extras["install"])
    assert not any(req.startswith("ansible-core") for req in extras["dev"])
    assert "sless[install]" in extras["dev"]  # the test tools still get it


def test_the_roles_python_needs_are_base_dependencies() -> None:
    base = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    for module in ("kubernetes", "hvac", "psycopg2-binary"):
        assert any(req.startswith(module) for req in base), module
