"""Versions and releases: one version in every file that holds one, each recorded release is its commit, and
``scripts/release.sh`` cuts a release only when it may (run on a clone of this repository)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from sless_core.release import UNKNOWN, platform_version, semver

ROOT = Path(__file__).resolve().parents[2]


def _release_files() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release_files", ROOT / "scripts" / "release_files.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


rf = _release_files()


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.parametrize(("pep440", "spelled"), [
    ("0.1.0", "0.1.0"), ("0.2.0.dev0", "0.2.0-dev.0"), ("1.4.2rc3", "1.4.2-rc.3"), ("2.0.0b1", "2.0.0-beta.1"),
    ("2.0.0a7", "2.0.0-alpha.7"), ("10.20.30", "10.20.30")])  # fmt: skip
def test_semver_spelling_of_a_pep440_version(pep440: str, spelled: str) -> None:
    assert semver(pep440) == spelled


def test_every_file_holds_the_same_version() -> None:
    assert rf.disagreements() == []
    # the running code's version is the source tree's (the venv is reinstalled when pyproject.toml changes)
    assert platform_version() == rf.versions()[rf.PYPROJECT] != UNKNOWN


def test_each_recorded_release_is_its_commit_and_main_is_past_the_last() -> None:
    recorded = rf.releases()
    assert recorded, "RELEASES lists no release"
    ordered = [rf.parse(r.version) for r in recorded]
    assert ordered == sorted(ordered) and len(set(ordered)) == len(ordered)
    assert rf.parse(platform_version()) > ordered[-1]
    changelog = (ROOT / rf.CHANGELOG).read_text()
    for release in recorded:
        assert f"\n## {release.version} - {release.date}\n" in changelog
        _git("cat-file", "-e", f"{release.commit}^{{commit}}")  # in this clone's history
        at_release = _git("show", f"{release.commit}:pyproject.toml")
        assert f'\nversion = "{release.version}"\n' in at_release


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """This repository's history, with the work tree's release files, committed on a main of its own."""
    work = tmp_path / "repo"
    _git("clone", "-q", "--no-hardlinks", str(ROOT), str(work))
    _git("checkout", "-q", "-B", "main", cwd=work)
    for name in ("RELEASES", "CHANGELOG.md", "pyproject.toml", "charts/sless/Chart.yaml",
                 "ansible_collections/sless/platform/galaxy.yml", "scripts/release.sh", "scripts/release_files.py",
                 "core/src/sless_core/release.py"):  # fmt: skip
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, work / name)
    _git("add", "-A", cwd=work)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "state", cwd=work)
    return work


def _release(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "SLESS_PYTHON": sys.executable, "HOME": str(work),
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["bash", "scripts/release.sh", *args], cwd=work, env=env, capture_output=True, text=True,
                          check=False)  # fmt: skip


def test_release_script_cuts_records_and_moves_on(clone: Path) -> None:
    last = rf.releases()[-1]
    version = f"{rf.parse(platform_version()).base_version}"
    done = _release(clone, version, "99.0.0.dev0")
    assert done.returncode == 0, done.stderr
    after = rf.releases(clone)
    assert after[:-1] == rf.releases() and after[-1].version == version and after[-1] != last
    tagged = _git("rev-parse", f"v{version}^{{commit}}", cwd=clone)
    assert after[-1].commit == tagged == _git("rev-parse", "HEAD~2", cwd=clone)
    assert _git("log", "-1", "--format=%s", tagged, cwd=clone) == f"Release {version}"
    at_release = _git("show", f"{tagged}:charts/sless/Chart.yaml", cwd=clone)
    assert f"\nversion: {version}\n" in at_release and f'\nappVersion: "{version}"\n' in at_release
    assert f"## {version} - " in _git("show", f"{tagged}:CHANGELOG.md", cwd=clone)
    assert rf.versions(clone)[rf.PYPROJECT] == "99.0.0.dev0" and rf.disagreements(clone) == []
    assert _git("status", "--porcelain", cwd=clone) == ""
    # the same version again is refused: not newer than the last release
    again = _release(clone, version)
    assert again.returncode == 2 and "not newer than the last release" in again.stderr


@pytest.mark.parametrize(("args", "edit", "message"), [
    (("0.0.1",), None, "not newer than the last release"),
    (("99.0.0.dev3",), None, "development or local version"),
    (("not-a-version",), None, "not a PEP 440 version"),
    (("99.0.0", "98.0.0.dev0"), None, "must be a development version after"),
    (("99.0.0",), "dirty", "the work tree has changes"),
    (("99.0.0",), "no-notes", "nothing under '## Unreleased'"),
    (("99.0.0",), "chart", "the files disagree"),
])  # fmt: skip
def test_release_script_refuses(clone: Path, args: tuple[str, ...], edit: str | None, message: str) -> None:
    if edit == "dirty":
        (clone / "README.md").write_text("changed\n")
    elif edit in ("no-notes", "chart"):
        if edit == "no-notes":
            text = (clone / rf.CHANGELOG).read_text()
            head, rest = text.split(rf.UNRELEASED, 1)
            (clone / rf.CHANGELOG).write_text(head + rf.UNRELEASED + "\n\n## " + rest.split("\n## ", 1)[1])
        else:
            chart = clone / rf.CHART
            chart.write_text(chart.read_text().replace("\nversion: ", "\nversion: 7", 1))
        _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-am", "edit", cwd=clone)
    before = _git("rev-parse", "HEAD", cwd=clone), _git("tag", cwd=clone)
    refused = _release(clone, *args)
    assert refused.returncode == 2 and message in refused.stderr, refused.stderr
    assert (_git("rev-parse", "HEAD", cwd=clone), _git("tag", cwd=clone)) == before


def test_the_operator_says_which_release_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    from sless_operator.main import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"sless-operator {platform_version()}"
