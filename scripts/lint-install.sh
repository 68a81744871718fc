#!/usr/bin/env bash
# Lints the appliance install: helm lint --strict and the chart/role tests (pytest over `helm
# template`, argument_specs in sync), ansible-lint with the production profile, yamllint.
# Needs .venv (scripts/bootstrap.sh) and helm (the test bed's, from `tests/testbed/testbed build`,
# or on PATH); installs the pinned Ansible collections first (scripts/install-collections.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "[lint-install $(date +%T)] $*" >&2; }
export PATH="$PWD/.venv/bin:$PATH"
T0=$SECONDS
bash scripts/install-collections.sh
HELM=helm
if BIN=$(python3 tests/testbed/testbed build --check 2>/dev/null) && [ -x "$BIN/helm" ]; then HELM=$BIN/helm; fi
command -v "$HELM" >/dev/null || { log "no helm: run tests/testbed/testbed build, or put helm on PATH"; exit 1; }

log "helm lint --strict charts/sless"
"$HELM" lint --strict charts/sless --kube-version 1.34.4
log "yamllint"
yamllint -s -c .yamllint.yml roles playbooks inventory molecule ansible_collections requirements.yml \
  charts/sless/Chart.yaml charts/sless/values.yaml
log "ansible-lint (production profile)"
ansible-lint --strict roles playbooks inventory molecule ansible_collections
log "ansible-playbook --syntax-check"
for p in playbooks/*.yml; do ansible-playbook -i inventory/local --syntax-check "$p" >/dev/null; done
log "chart and role tests"
pytest -p no:cacheprovider -q tests/install/test_chart.py tests/install/test_roles.py
log "done in $((SECONDS - T0))s"
