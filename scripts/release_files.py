"""The files a release changes, and the rules they follow; ``scripts/release.sh`` runs it, the tests import it.

    python3 scripts/release_files.py check VERSION [NEXT]     # may VERSION be released now (exit 2 if not)
    python3 scripts/release_files.py set VERSION [--changelog-date YYYY-MM-DD]

One version, several spellings: ``pyproject.toml`` holds it in PEP 440 (``0.2.0``, ``0.3.0.dev0``), the chart and
the Ansible collection in SemVer 2 (``0.3.0-dev.0``, ``sless_core.release.semver``). ``RELEASES`` lists each
release as ``VERSION COMMIT DATE``, oldest first. It needs ``packaging`` (in the project's venv) and nothing
of sless but ``sless_core.release``.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "core" / "src"))
from sless_core.release import semver  # noqa: E402

PYPROJECT = "pyproject.toml"
CHART = "charts/sless/Chart.yaml"
GALAXY = "ansible_collections/sless/platform/galaxy.yml"
CHANGELOG = "CHANGELOG.md"
RELEASES = "RELEASES"
UNRELEASED = "## Unreleased"
_RELEASE_LINE = re.compile(r"^(?P<version>\S+) (?P<commit>[0-9a-f]{40}) (?P<date>\d{4}-\d{2}-\d{2})$")


class ReleaseError(Exception):
    """A release that must not be cut, or files that disagree; the message says which."""


@dataclass(frozen=True)
class Release:
    version: str
    commit: str
    date: str


def releases(root: Path = ROOT) -> list[Release]:
    """RELEASES' entries, oldest first (comment lines start with ``#``)."""
    out = []
    for number, line in enumerate((root / RELEASES).read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        found = _RELEASE_LINE.match(line)
        if found is None:
            raise ReleaseError(f"{RELEASES} line {number}: want 'VERSION COMMIT DATE', got {line!r}")
        out.append(Release(found["version"], found["commit"], found["date"]))
    return out


def _field(text: str, pattern: str, where: str) -> str:
    found = re.search(pattern, text, re.MULTILINE)
    if found is None:
        raise ReleaseError(f"{where}: no version found")
    return found.group(1)


def versions(root: Path = ROOT) -> dict[str, str]:
    """Each file's version as written: pyproject (PEP 440), the chart's two and the collection's (SemVer)."""
    chart = (root / CHART).read_text()
    return {
        PYPROJECT: _field((root / PYPROJECT).read_text(), r'^version = "([^"]+)"$', PYPROJECT),
        f"{CHART} version": _field(chart, r"^version: (\S+)$", CHART),
        f"{CHART} appVersion": _field(chart, r'^appVersion: "([^"]+)"$', CHART),
        GALAXY: _field((root / GALAXY).read_text(), r"^version: (\S+)$", GALAXY),
    }


def disagreements(root: Path = ROOT) -> list[str]:
    """The files whose version is not pyproject's (in their own spelling)."""
    found = versions(root)
    want = semver(found[PYPROJECT])
    return [f"{name} is {value}, want {want}" for name, value in found.items()
            if name != PYPROJECT and value != want]  # fmt: skip


def unreleased_notes(root: Path = ROOT) -> str:
    """CHANGELOG.md's text between ``## Unreleased`` and the next heading of its level."""
    text = (root / CHANGELOG).read_text()
    if UNRELEASED not in text:
        raise ReleaseError(f"{CHANGELOG} has no '{UNRELEASED}' section")
    rest = text.split(UNRELEASED, 1)[1]
    return re.split(r"^## ", rest, maxsplit=1, flags=re.MULTILINE)[0].strip()


def parse(version: str) -> Version:
    try:
        return Version(version)
    except InvalidVersion:
        raise ReleaseError(f"{version!r} is not a PEP 440 version") from None


def check(version: str, next_dev: str = "", root: Path = ROOT) -> None:
    """Raise ReleaseError unless VERSION may be released now (and NEXT is a later development version)."""
    wanted = parse(version)
    if wanted.is_devrelease or wanted.local:
        raise ReleaseError(f"{version} is a development or local version: release a final or pre-release one")
    done = releases(root)
    if done and wanted <= parse(done[-1].version):
        raise ReleaseError(f"{version} is not newer than the last release, {done[-1].version}")
    if not unreleased_notes(root):
        raise ReleaseError(f"{CHANGELOG}: nothing under '{UNRELEASED}' to release")
    if problems := disagreements(root):
        raise ReleaseError("the files disagree before the release: " + "; ".join(problems))
    if next_dev and not (parse(next_dev).is_devrelease and parse(next_dev) > wanted):
        raise ReleaseError(f"{next_dev} must be a development version after {version} (e.g. 0.3.0.dev0)")


def _replace(path: Path, pattern: str, value: str) -> None:
    text, count = re.subn(pattern, lambda m: m.group(1) + value + m.group(2), path.read_text(), count=1,
                          flags=re.MULTILINE)  # fmt: skip
    if count != 1:
        raise ReleaseError(f"{path}: no version to set")
    path.write_text(text)


def set_version(version: str, changelog_date: str = "", root: Path = ROOT) -> None:
    """Write VERSION into every file that holds it; with a date, head CHANGELOG's notes with it."""
    parse(version)
    spelled = semver(version)
    _replace(root / PYPROJECT, r'^(version = ")[^"]+(")$', version)
    _replace(root / CHART, r"^(version: )\S+()$", spelled)
    _replace(root / CHART, r'^(appVersion: ")[^"]+(")$', spelled)
    _replace(root / GALAXY, r"^(version: )\S+()$", spelled)
    if changelog_date:
        path = root / CHANGELOG
        path.write_text(path.read_text().replace(UNRELEASED, f"{UNRELEASED}\n\n## {version} - {changelog_date}", 1))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="release_files.py")
    verbs = parser.add_subparsers(dest="verb", required=True)
    check_p = verbs.add_parser("check")
    check_p.add_argument("version")
    check_p.add_argument("next", nargs="?", default="")
    set_p = verbs.add_parser("set")
    set_p.add_argument("version")
    set_p.add_argument("--changelog-date", default="")
    args = parser.parse_args(argv)
    try:
        if args.verb == "check":
            check(args.version, args.next)
        else:
            set_version(args.version, args.changelog_date)
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
