#!/usr/bin/env bash
# Creates (or refreshes) the project's virtualenv at .venv with sless and its dev tools.
# Quick when nothing changed: the install is redone only when pyproject.toml changes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${SLESS_PYTHON:-python3}
log() { echo "[bootstrap] $*" >&2; }
for tool in node go; do
  command -v "$tool" >/dev/null 2>&1 || { log "missing $tool: the nodejs20 and go1.23 runtimes need Node.js 20 and Go"; exit 1; }
done
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), sys.version' || { log "need Python >= 3.11"; exit 1; }
if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -c 'import venv, ensurepip' 2>/dev/null; then
    log "installing python3-venv"; apt-get update -q && apt-get install -y -q python3-venv
  fi
  log "creating .venv"; "$PY" -m venv .venv
fi
stamp=.venv/.sless-installed
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "installing sless and its dev tools into .venv (pip)"
  t0=$SECONDS
  .venv/bin/python -m pip install -q --disable-pip-version-check -U pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
  echo "$want" > "$stamp"
  log "installed in $((SECONDS - t0))s"
fi
