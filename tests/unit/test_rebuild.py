"""The one rule of when a function version needs an image (sless_core.rebuild)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sless_core import rebuild
from sless_core.rebuild import Plan, dependency_key, manifest_files, plan, read_manifests


def write(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_no_manifest_means_no_image_for_python_and_node(tmp_path: Path) -> None:
    for runtime, handler in (("python3.11", "handler.py"), ("nodejs20", "handler.js")):
        code = write(tmp_path / runtime, {handler: "x"})
        found = plan(runtime, code)
        assert found == Plan(runtime, "") and not found.needs_image


def test_a_requirements_file_of_comments_is_no_manifest(tmp_path: Path) -> None:
    code = write(tmp_path, {"handler.py": "x", "requirements.txt": "# nothing\n\n   \n"})
    assert read_manifests("python3.11", code) == {}
    assert not plan("python3.11", code).needs_image


def test_the_key_is_runtime_plus_manifest_and_ignores_code(tmp_path: Path) -> None:
    a = write(tmp_path / "a", {"handler.py": "one", "requirements.txt": "requests==2.32.3\n"})
    b = write(tmp_path / "b", {"handler.py": "two", "other.py": "", "requirements.txt": "requests==2.32.3\n"})
    c = write(tmp_path / "c", {"handler.py": "one", "requirements.txt": "requests==2.32.4\n"})
    key_a, key_b, key_c = (plan("python3.11", d).deps_key for d in (a, b, c))
    assert key_a == key_b and len(key_a) == 64
    assert key_a != key_c
    # the same bytes for another runtime are another dependency set
    assert dependency_key("nodejs20", {"package.json": b"{}"}) != dependency_key("go1.23", {"go.mod": b"{}"})


def test_the_node_lock_file_counts_only_with_package_json() -> None:
    with_lock = manifest_files("nodejs20", {"package.json": b"{}", "package-lock.json": b"L", "index.js": b""})
    assert with_lock == {"package.json": b"{}", "package-lock.json": b"L"}
    assert manifest_files("nodejs20", {"package-lock.json": b"L"}) == {}
    assert dependency_key("nodejs20", with_lock) != dependency_key("nodejs20", {"package.json": b"{}"})


def test_names_and_bytes_are_framed_so_moving_bytes_between_files_changes_the_key() -> None:
    one = dependency_key("go1.23", {"go.mod": b"module x\n", "go.sum": b"ab"})
    two = dependency_key("go1.23", {"go.mod": b"module x\na", "go.sum": b"b"})
    assert one != two


def test_go_code_always_compiles_and_python_code_never() -> None:
    go, py = Plan("go1.23", ""), Plan("python3.11", "k" * 64)
    assert go.rebuild_for(go, code_changed=True) and go.compiles_for(go, code_changed=True)
    assert not go.rebuild_for(go, code_changed=False)
    assert not py.compiles_for(py, code_changed=True)
    assert not py.rebuild_for(py, code_changed=True)
    assert py.rebuild_for(Plan("python3.11", "j" * 64), code_changed=False)
    assert py.rebuild_for(None, code_changed=False)
    assert not Plan("nodejs20", "").rebuild_for(None, code_changed=True)


def test_symlinked_manifests_are_not_read(tmp_path: Path) -> None:
    code = write(tmp_path / "code", {"handler.py": ""})
    (tmp_path / "outside.txt").write_text("secret-package\n")
    (code / "requirements.txt").symlink_to(tmp_path / "outside.txt")
    assert read_manifests("python3.11", code) == {}


def test_an_unknown_runtime_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown runtime"):
        manifest_files("cobol", {})
    assert rebuild.MANIFESTS.keys() == {"python3.11", "nodejs20", "go1.23"}


def test_a_go_code_change_compiles_without_an_image_and_new_modules_build_one() -> None:
    """Go's image holds the toolchain and the modules: built per dependency key, never per code change."""
    bare, mods, other = Plan("go1.23", ""), Plan("go1.23", "m" * 64), Plan("go1.23", "n" * 64)
    assert not bare.needs_image and not bare.builds_image_for(None)
    assert not mods.builds_image_for(mods) and mods.compiles_for(mods, code_changed=True)
    assert mods.builds_image_for(other) and mods.compiles_for(other, code_changed=False)
    assert mods.builds_image_for(None) and mods.compiles_for(None, code_changed=False)
    assert mods.builds_image_for(Plan("python3.11", "m" * 64))
