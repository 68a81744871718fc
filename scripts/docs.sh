#!/usr/bin/env bash
# Builds the documentation site into site/ (or the folder given as $1) with `mkdocs build --strict`: a warning (a
# broken link or anchor, a page missing from the nav, an include whose README section is gone) fails the build.
# The pages are made from README.md, the READMEs beside the code, the OpenAPI document and the CLI's parser by
# scripts/docs.py (a MkDocs hook) as it builds. Open site/index.html, or `.venv/bin/mkdocs serve` while editing.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-site}
[ -x .venv/bin/mkdocs ] || bash scripts/bootstrap.sh
t0=$SECONDS
.venv/bin/mkdocs build --strict --clean --site-dir "$out"
echo "[docs] built $out/index.html in $((SECONDS - t0))s" >&2
