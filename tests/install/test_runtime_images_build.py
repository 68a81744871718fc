"""The runtime_images role with a real builder (buildah) on a host that cannot reach Docker Hub.

It must fail with a message that names the setting to use (runtime_images_build_args), and the build
arguments it is given must reach the builder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def run_build(tmp_path: Path, build_args: dict[str, dict[str, str]]) -> subprocess.CompletedProcess[str]:
    assert shutil.which("buildah"), "buildah (Debian) is needed: scripts/install-test-services.sh installs it"
    play = [{
        "name": "Build one runtime image", "hosts": "localhost", "gather_facts": True,
        "vars": {"runtime_images_builder": "buildah", "runtime_images_push": False,
                 "runtime_images_prefix": "localhost/sless-role-test", "runtime_images_tag": "t1",
                 "runtime_images_runtimes": [{"name": "python3.11", "target": ""}],
                 "runtime_images_build_args": build_args},
        "tasks": [
            {"name": "Preflight", "ansible.builtin.include_role": {"name": "runtime_images",
                                                                    "tasks_from": "preflight.yml"}},
            {"name": "Build", "ansible.builtin.include_role": {"name": "runtime_images", "tasks_from": "build.yml"},
             "loop": "{{ runtime_images_runtimes }}", "loop_control": {"loop_var": "runtime_images_item"}},
        ],
    }]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(REPO / "roles"), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp")}
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", str(playbook)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_without_docker_hub_the_failure_names_the_setting(tmp_path: Path) -> None:
    done = run_build(tmp_path, {})
    assert done.returncode != 0
    assert "runtime_images_build_args.python3.11" in done.stdout, done.stdout[-3000:]
    assert "Docker Hub" in done.stdout


@pytest.mark.slow
def test_build_arguments_reach_the_builder(tmp_path: Path) -> None:
    done = run_build(tmp_path, {"python3.11": {"BASE_IMAGE": "127.0.0.1:9/sless-missing/python:3.11"}})
    assert done.returncode != 0
    assert "127.0.0.1:9/sless-missing/python" in done.stdout, done.stdout[-3000:]
    assert "runtime_images_build_args.python3.11" not in done.stdout  # it was set: no hint to set it
