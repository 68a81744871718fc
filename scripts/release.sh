#!/usr/bin/env bash
# Cuts a release: scripts/release.sh VERSION [NEXT_DEV_VERSION]
#
#   scripts/release.sh 0.2.0 0.3.0.dev0
#
# 1. checks: a clean work tree on main, VERSION (PEP 440, no .dev) newer than the last release in RELEASES, and
#    notes under "## Unreleased" in CHANGELOG.md;
# 2. the release commit, "Release VERSION": VERSION in pyproject.toml, the chart's version and appVersion and the
#    Ansible collection's version (their SemVer spelling), and CHANGELOG.md's notes under "## VERSION - DATE";
# 3. records it: RELEASES gains "VERSION <commit> DATE" and the tag vVERSION points at that commit (the record
#    is the file: a clone without tags still knows every release, which the upgrade test builds from);
# 4. with NEXT_DEV_VERSION (e.g. 0.3.0.dev0), a last commit moves main on to it.
# Nothing is pushed.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "release: $*" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: scripts/release.sh VERSION [NEXT_DEV_VERSION]"
version=$1 next=${2:-}
PY=${SLESS_PYTHON:-.venv/bin/python}  # has packaging (scripts/bootstrap.sh)
[ -z "$(git status --porcelain)" ] || die "the work tree has changes: commit or remove them first"
[ "$(git rev-parse --abbrev-ref HEAD)" = main ] || die "releases are cut on main"
# the checks and the version edits are one Python helper, so that they follow the same rules as the test
"$PY" scripts/release_files.py check "$version" "$next"
today=$(date -u +%F)
"$PY" scripts/release_files.py set "$version" --changelog-date "$today"
git commit -q -m "Release $version" -- pyproject.toml charts/sless/Chart.yaml \
  ansible_collections/sless/platform/galaxy.yml CHANGELOG.md
commit=$(git rev-parse HEAD)
echo "$version $commit $today" >> RELEASES
git commit -q -m "Record release $version as ${commit:0:12}" -- RELEASES
git tag -a "v$version" -m "sless $version" "$commit"
if [ -n "$next" ]; then
  "$PY" scripts/release_files.py set "$next"
  git commit -q -m "Main moves on to $next" -- pyproject.toml charts/sless/Chart.yaml \
    ansible_collections/sless/platform/galaxy.yml
fi
echo "released $version as $commit (tag v$version)"
