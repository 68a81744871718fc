#!/usr/bin/env bash
# One command per Molecule scenario, against the Kubernetes test bed on this machine:
#   molecule/run.sh default            # install, idempotence, verify, uninstall  (molecule test)
#   molecule/run.sh e2e                # the platform against the test bed + real services
#   molecule/run.sh e2e-real           # the platform as pods on the real node, then the stress functions on it
#                                      #   (root; take the node's lock: flock /tmp/sless-realnode.lock molecule/run.sh e2e-real)
#   molecule/run.sh stress             # stress functions on the standalone platform
#   molecule/run.sh functions          # the hello examples deployed by playbook (sless.platform collection)
#   molecule/run.sh default converge   # any other molecule verb
# Needs the project's .venv (scripts/bootstrap.sh). Builds, once, the test bed's binaries
# (tests/testbed/testbed build) and Vault (tests/install/build-vault.sh); both are cached.
set -euo pipefail
cd "$(dirname "$0")/.."
SCENARIO=${1:-default}
shift || true
log() { echo "[molecule-run $(date +%T)] $*" >&2; }
export PATH="$PWD/.venv/bin:$PATH"
T0=$SECONDS
bash scripts/install-collections.sh
if [ "$SCENARIO" = e2e-real ]; then  # + the real node's binaries and images (the platform image follows the code)
  SLESS_TESTBED_BIN=$(python3 tests/testbed/testbed build --real-node)
else
  SLESS_TESTBED_BIN=$(python3 tests/testbed/testbed build)
fi
export SLESS_TESTBED_BIN PATH="$SLESS_TESTBED_BIN:$PATH"
if [ "$SCENARIO" != stress ] && [ "$SCENARIO" != functions ]; then
  bash tests/install/build-vault.sh >/dev/null
fi
export ANSIBLE_CONFIG="$PWD/ansible.cfg"
# The scenario's world (test bed, Vault, S3, the stress functions' PostgreSQL) lives in its state folder, outside
# Molecule's ephemeral one (which Molecule prunes). Its destroy stops it, but not when the uninstall before fails;
# then Vault and S3 would keep their fixed ports and the next scenario could not start. So what a scenario left
# is stopped here, before it runs and after.
export SLESS_MOLECULE_STATE_ROOT=${SLESS_MOLECULE_STATE_ROOT:-/tmp/sless-molecule}
sweep() {
  local state=$SLESS_MOLECULE_STATE_ROOT/$SCENARIO
  [ -d "$state" ] || return 0
  log "stopping what scenario $SCENARIO left in $state"
  [ ! -f "$state/stress/stress.json" ] || python3 molecule/stress/stress.py down --state "$state/stress" || true
  [ ! -f "$state/vault/vault.json" ] || python3 tests/install/vaultbed.py down --state "$state/vault" || true
  [ ! -f "$state/s3/s3.json" ] || python3 tests/install/s3bed.py down --state "$state/s3" || true
  [ ! -f "$state/testbed/env.json" ] || python3 tests/testbed/testbed down --state "$state/testbed" || true
  rm -rf "$state"
}
sweep
log "molecule ${*:-test} -s $SCENARIO"
set +e
molecule "${@:-test}" -s "$SCENARIO"
code=$?
set -e
case "${1:-test}" in test|destroy) sweep ;; esac  # other verbs (converge, verify) keep the world for the next
log "scenario $SCENARIO: exit $code in $((SECONDS - T0))s"
exit "$code"
