"""The sless.platform collection without a server: documentation equal to each module's options, the
deterministic source zip, and ansible-doc reading every module (the real ansible-doc, the collection from here)."""

from __future__ import annotations

import importlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the collection's own tree: ansible_collections.sless.platform

from ansible_collections.sless.platform.plugins.doc_fragments.api import ModuleDocFragment  # noqa: E402
from ansible_collections.sless.platform.plugins.module_utils.sless_api import subset_differs  # noqa: E402
from ansible_collections.sless.platform.plugins.module_utils.sless_code import zip_folder  # noqa: E402

COLLECTION = REPO / "ansible_collections" / "sless" / "platform"
MODULES = sorted(p.stem for p in (COLLECTION / "plugins" / "modules").glob("sless_*.py"))


def load(name: str) -> Any:
    return importlib.import_module(f"ansible_collections.sless.platform.plugins.modules.{name}")


def documented_options(module: Any) -> dict[str, Any]:
    doc = yaml.safe_load(module.DOCUMENTATION)
    assert doc["extends_documentation_fragment"] == ["sless.platform.api"]
    options = dict(yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"])
    options.update(doc["options"])
    return options


def test_the_collection_has_the_five_modules() -> None:
    assert MODULES == ["sless_function", "sless_info", "sless_job", "sless_secret", "sless_trigger"]


@pytest.mark.parametrize("name", MODULES)
def test_documentation_matches_the_argument_spec(name: str) -> None:
    module = load(name)
    spec, options = module.argument_spec(), documented_options(module)
    assert sorted(spec) == sorted(options), name
    for key, arg in spec.items():
        doc = options[key]
        assert doc["type"] == arg.get("type", "str"), (name, key)
        assert doc.get("choices") == arg.get("choices"), (name, key)
        assert doc.get("default") == arg.get("default"), (name, key)
        assert bool(doc.get("required", False)) == bool(arg.get("required", False)), (name, key)
        assert doc.get("elements") == arg.get("elements"), (name, key)
        assert doc.get("description"), (name, key)
    assert yaml.safe_load(module.EXAMPLES), name
    assert yaml.safe_load(module.RETURN), name
    assert spec["token"]["no_log"] is True


def test_secret_data_is_never_logged() -> None:
    assert load("sless_secret").argument_spec()["data"]["no_log"] is True


def test_ansible_doc_reads_every_module() -> None:
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(REPO), "ANSIBLE_NOCOLOR": "1"}
    doc = Path(sys.executable).parent / "ansible-doc"
    names = [f"sless.platform.{m}" for m in MODULES]
    proc = subprocess.run([str(doc), "-t", "module", "--json", *names], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    for name in names:
        assert name in proc.stdout


def tree(folder: Path, files: dict[str, str]) -> Path:
    for rel, content in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return folder


def test_source_zip_is_deterministic_and_skips_tool_folders(tmp_path: Path) -> None:
    one = tree(tmp_path / "one", {"handler.py": "x = 1\n", "lib/util.py": "y = 2\n"})
    two = tree(tmp_path / "two", {"lib/util.py": "y = 2\n", "handler.py": "x = 1\n"})
    os.utime(two / "handler.py", (1_000_000, 1_000_000))
    tree(two, {"__pycache__/handler.pyc": "junk", ".git/HEAD": "ref", "node_modules/m/index.js": "1"})
    data_one, hash_one = zip_folder(str(one))
    data_two, hash_two = zip_folder(str(two))
    assert data_one == data_two and hash_one == hash_two
    with zipfile.ZipFile(io.BytesIO(data_one)) as archive:
        assert archive.namelist() == ["handler.py", "lib/util.py"]
        assert all(info.date_time == (1980, 1, 1, 0, 0, 0) for info in archive.infolist())
    (two / "handler.py").write_text("x = 2\n")
    assert zip_folder(str(two))[1] != hash_one


def test_executable_bit_is_kept_and_changes_the_hash(tmp_path: Path) -> None:
    folder = tree(tmp_path / "f", {"run.sh": "echo\n"})
    plain = zip_folder(str(folder))[1]
    (folder / "run.sh").chmod(0o755)
    data, executable = zip_folder(str(folder))
    assert executable != plain
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert (archive.getinfo("run.sh").external_attr >> 16) & 0o777 == 0o755


def test_an_empty_folder_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "empty" / "__pycache__").mkdir(parents=True)
    with pytest.raises(ValueError, match="holds no files"):
        zip_folder(str(tmp_path / "empty"))


def test_only_stated_options_are_compared() -> None:
    current = {"runtime": "python3.11", "memory_mb": 128, "env_vars": {"A": "1"}}
    assert subset_differs({"memory_mb": 128}, current) == []
    assert subset_differs({"memory_mb": 256, "runtime": "python3.11"}, current) == ["memory_mb"]
    assert subset_differs({"env_vars": {"A": "2"}, "timeout_sec": None}, current) == ["env_vars"]


#: ansible-test sanity tests that install their tools into virtual environments from the network.
NEEDS_NETWORK = ("ansible-doc", "import", "pep8", "pylint", "runtime-metadata", "validate-modules", "yamllint")


@pytest.mark.slow
def test_ansible_test_sanity_offline_subset() -> None:
    """Every sanity test ansible-test can run here without the network (the docs and argument specs, which
    validate-modules would check, are checked above)."""
    skips = [arg for test in NEEDS_NETWORK for arg in ("--skip-test", test)]
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-test"), "sanity", "--local", "--python",
                           f"{sys.version_info.major}.{sys.version_info.minor}", "--color", "no", *skips],
                          cwd=COLLECTION, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert 'Running sanity test "compile"' in proc.stdout + proc.stderr


def test_function_scale_suboptions_are_documented_as_specified() -> None:
    module = load("sless_function")
    spec = module.argument_spec()["scale"]["options"]
    doc = documented_options(module)["scale"]["suboptions"]
    assert sorted(spec) == sorted(doc) == ["enabled", "idle_sec", "max", "min", "target"]
    for key, arg in spec.items():
        assert (doc[key]["type"], doc[key].get("default")) == (arg["type"], arg.get("default")), key
        assert doc[key]["description"], key


SCALE = {"min": 0, "max": 10, "target": 10, "idle_sec": 300}


def option(**given: Any) -> dict[str, Any]:
    """The scale option as AnsibleModule hands it over: every sub-option, None where not given."""
    return {"min": None, "max": None, "target": None, "idle_sec": None, "enabled": True, **given}


def test_function_scale_compares_only_the_stated_suboptions() -> None:
    wanted = load("sless_function").wanted_scale
    assert wanted(None, SCALE) == (False, None), "not stated: the function's scale is not looked at"
    assert wanted(option(max=10), SCALE) == (True, SCALE), "equal on what is stated: no change"
    assert wanted(option(max=4, idle_sec=60), SCALE) == (True, {**SCALE, "max": 4, "idle_sec": 60})
    assert wanted(option(max=4), None) == (True, {"max": 4}), "a new scale: the API fills in its defaults"
    assert wanted(option(), None) == (True, {}), "scale: {} asks for scaling with the defaults"
    assert wanted(option(enabled=False), SCALE) == (True, None)
    assert wanted(option(enabled=False), None) == (True, None)
    with pytest.raises(ValueError, match="give no max"):
        wanted(option(enabled=False, max=3), SCALE)
