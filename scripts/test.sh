#!/usr/bin/env bash
# The README's test command: installs and starts everything the tests need on a fresh Debian machine,
# runs the linters, then every test (all markers: pg, rabbitmq, s3, k8s, e2e, slow, and realnode as root;
# SLESS_SKIP_REALNODE=1 leaves the real node out).
# and then the Molecule scenarios (default, e2e, stress with a 15 s storm, functions, and as root e2e-real: the
# platform as pods on the real node, the stress functions too; SLESS_SKIP_MOLECULE=1 skips them,
# SLESS_MOLECULE_SCENARIOS names others).
# Without arguments three lanes run at once (lane A: pytest but the real node and the runtimes; lane B: the
# real-node tests, then the runtimes' contract tests; lane C: the Molecule scenarios, then the Ansible collection's
# and `sless init`'s tests). Extra arguments go to one pytest run instead, e.g. `scripts/test.sh -m "not k8s" -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "[test $(date +%T)] $*" >&2; }
T0=$SECONDS
log "test services (PostgreSQL, RabbitMQ, wrk, S3 server)"
bash scripts/install-test-services.sh
# Every sandboxed function process of `sless up` holds an inotify instance (its pasta), and so do the kubelet,
# containerd and KEDA's operator: three lanes of tests on one machine run past the kernel's default of 128 per user
# (KEDA's operator then stops with "couldn't initialize inotify: too many open files"). Raised for the machine, as
# node set-ups such as kind's do.
if [ "$(id -u)" = 0 ] && [ "$(cat /proc/sys/fs/inotify/max_user_instances)" -lt 8192 ]; then
  sysctl -qw fs.inotify.max_user_instances=8192 || log "cannot raise fs.inotify.max_user_instances (tests may run out)"
fi
REALNODE=0
if [ "$(id -u)" = 0 ] && [ "${SLESS_TESTBED_EXISTING:-0}" != 1 ] && [ "${SLESS_SKIP_REALNODE:-0}" != 1 ]; then
  REALNODE=1
  log "real-node packages (containerd, runc, CNI plugins, ipset, debootstrap, buildah)"
  bash scripts/install-realnode.sh
fi
log "python environment"
bash scripts/bootstrap.sh
# Vault builds beside the other builds (its own Go caches): a cold build spends minutes downloading modules,
# which overlap the test bed's compiling. Its output is shown when it is awaited.
vault_log=$(mktemp)
log "Vault server for the install tests: building in the background (once per version)"
t_vault=$SECONDS
bash tests/install/build-vault.sh >"$vault_log" 2>&1 &
vault_build=$!
# KEDA (operator and metrics adapter, host processes on the test bed for the tests that take the `keda` fixture)
# builds the same way, with Go caches of its own: ~6 min cold, beside the test bed's build instead of after it.
keda_log=$(mktemp)
keda_build=
if [ "${SLESS_TESTBED_EXISTING:-0}" != 1 ]; then
  log "KEDA for the test bed: building in the background (once per version)"
  t_keda=$SECONDS
  bash tests/testbed/build-keda.sh >"$keda_log" 2>&1 &
  keda_build=$!
fi
# The OpenTelemetry Collector behind the `otlp_receiver` fixture (OTLP receiver, file exporter) builds the same way.
otelcol_log=$(mktemp)
log "OpenTelemetry Collector for the otlp_receiver fixture: building in the background (once per version)"
t_otelcol=$SECONDS
bash tests/testbed/build-otelcol.sh >"$otelcol_log" 2>&1 &
otelcol_build=$!
if [ "${SLESS_TESTBED_EXISTING:-0}" != 1 ]; then
  log "Kubernetes test bed binaries (cold build happens once per version; timings follow)"
  t=$SECONDS; tests/testbed/build.sh >/dev/null; log "test bed binaries ready in $((SECONDS - t))s"
fi
if [ "$REALNODE" = 1 ]; then
  log "real node: CoreDNS, registry, kaniko, pause, kube-router and the images (cold build once per version; timings follow)"
  t=$SECONDS; .venv/bin/python tests/testbed/testbed build --real-node >/dev/null
  log "real node ready in $((SECONDS - t))s"
  export SLESS_REALNODE=1  # the realnode tests run a kubelet node on this machine (root)
fi
if ! wait "$vault_build"; then cat "$vault_log" >&2; log "the Vault build failed"; exit 1; fi
grep -v '^/' "$vault_log" >&2 || true  # its timings (the last line is the binary's path)
log "vault ready $((SECONDS - t_vault))s after its build started"
rm -f "$vault_log"
if [ -n "$keda_build" ]; then
  if ! wait "$keda_build"; then cat "$keda_log" >&2; log "the KEDA build failed"; exit 1; fi
  grep -v '^/' "$keda_log" >&2 || true  # its timings (the last line is the folder)
  log "KEDA ready $((SECONDS - t_keda))s after its build started"
fi
rm -f "$keda_log"
if ! wait "$otelcol_build"; then cat "$otelcol_log" >&2; log "the OpenTelemetry Collector build failed"; exit 1; fi
grep -v '^/' "$otelcol_log" >&2 || true  # its timings (the last line is the binary's path)
log "otelcol ready $((SECONDS - t_otelcol))s after its build started"
rm -f "$otelcol_log"
set +e
log "lint: ruff, mypy, import-linter"
lint=0
.venv/bin/ruff check . || lint=1
.venv/bin/mypy || lint=1
.venv/bin/lint-imports || lint=1
log "lint of the install: helm lint, yamllint, ansible-lint (production profile), chart and role tests"
bash scripts/lint-install.sh || lint=1
# default's install, idempotence and verify are e2e's too (molecule/e2e): one install and uninstall fewer
SCENARIOS=${SLESS_MOLECULE_SCENARIOS:-e2e stress functions}
# e2e-real (the platform as pods on the real node, then the stress functions on it with the same short storm)
# last: it waits for the node's lock, which lane B holds meanwhile
[ -z "${SLESS_MOLECULE_SCENARIOS:-}" ] && [ "$REALNODE" = 1 ] && SCENARIOS="$SCENARIOS e2e-real"
# run in lane B after the real-node tests (see the lanes below): the runtimes' contract tests, the tests of a real
# KEDA on a kwok bed of their own (minutes of HPA and KEDA sync periods, which would make lane A the longest), the
# role's use of an existing KEDA (a bed of its own too), the operators' leader election (Lease expiries), and three
# `sless up` suites of minutes each (a browser, schemathesis, processes scaling in after idle_sec) and the backup and
# restore round trips (a bed, Vault, S3 and PostgreSQL of their own), the role's Vault lookups (about four
# minutes of ansible-playbook runs) and the event dispatcher on kwok (RabbitMQ restarts and SIGKILLs: about two
# minutes) that lane A, the longest lane, can do without
LANE_B_TESTS=(tests/runtimes tests/k8s/test_keda_bed.py tests/k8s/test_keda_scaling.py tests/k8s/test_operator_scale.py
              tests/install/test_keda_install.py tests/k8s/test_operator_leader.py tests/e2e/test_console_browser.py
              tests/e2e/test_console_queues.py tests/e2e/test_console_routes.py tests/e2e/test_console_charts.py
              tests/e2e/test_openapi_conformance.py tests/e2e/test_standalone_scale.py
              tests/install/test_backup_restore.py tests/install/test_vault_secrets.py tests/k8s/test_events_kube.py)
# run in lane C after the Molecule scenarios, which end minutes before lanes A and B: the Ansible collection's
# modules against a `sless up` of their own, `sless init` then deploy in each runtime (a Go build included), and
# `sless up` suites of a process each that lane A, the longest lane, can do without (hostile functions, a trickling
# JWKS server, the CLI's versions and rollbacks, asynchronous calls across restarts: about four minutes)
LANE_C_TESTS=(tests/e2e/test_ansible_collection.py tests/e2e/test_cli_init.py tests/e2e/test_hostile_functions.py
              tests/e2e/test_sec_jwks_loop.py tests/e2e/test_cli_versions.py tests/e2e/test_async_calls.py)
# Run in lane B under the real node's lock, before its tests: their iptables chains (the port guard of a sandbox
# as root) would be wiped by the real node's kube-router, which restores the whole filter table on every sync.
LANE_B_LOCKED_TESTS=(tests/integration/test_spares.py tests/integration/test_supervisor.py)
REALNODE_LOCK=/tmp/sless-realnode.lock  # one real node per machine: lane B's tests and e2e-real take turns
# Every lane and scenario also writes a log here; the results section at the end repeats what failed, so the
# last lines of the output say what went wrong even when the lanes' lines are interleaved or cut.
results=$(mktemp -d)
molecule_scenarios() {  # one after the other: they share the fixed Vault and S3 ports of molecule/shared
  [ "${SLESS_SKIP_MOLECULE:-0}" = 1 ] && return 0
  local failed=0 scenario t c lock
  for scenario in $SCENARIOS; do
    log "molecule scenario $scenario"
    t=$SECONDS
    lock=(); [ "$scenario" = e2e-real ] && lock=(flock -o "$REALNODE_LOCK")
    SLESS_STRESS_DURATION=${SLESS_STRESS_DURATION:-15} "${lock[@]}" bash molecule/run.sh "$scenario" 2>&1 \
      | tee "$results/molecule-$scenario.log"
    c=${PIPESTATUS[0]}
    [ "$c" = 0 ] || failed=1
    echo "$scenario $c $((SECONDS - t))" >> "$results/molecule.txt"
    log "molecule scenario $scenario took $((SECONDS - t))s (exit $c)"
  done
  return "$failed"
}
pytest_summary() {  # the end of a pytest log: its short summary when it has one, else its last lines
  local f=$1
  if grep -q "short test summary info" "$f"; then sed -n '/short test summary info/,$p' "$f" | tail -60
  else tail -30 "$f"; fi
}
report_results() {  # the results section: each lane's outcome, then the failures' own lines
  local scenario c secs
  log "results"
  [ -f "$results/lane-a.log" ] && { echo "lane A (pytest -m 'not realnode', without lane B's and C's):"; pytest_summary "$results/lane-a.log" | tail -25; }
  if [ -f "$results/lane-b.log" ]; then
    echo "lane B (${LANE_B_LOCKED_TESTS[*]}, then pytest -m realnode):"; pytest_summary "$results/lane-b.log" | tail -25
  fi
  if [ -f "$results/lane-b-runtimes.log" ]; then
    echo "lane B (${LANE_B_TESTS[*]}):"; pytest_summary "$results/lane-b-runtimes.log" | tail -25
  fi
  if [ -f "$results/lane-c.log" ]; then
    echo "lane C (${LANE_C_TESTS[*]}):"; pytest_summary "$results/lane-c.log" | tail -25
  fi
  [ -f "$results/molecule.txt" ] || return 0
  while read -r scenario c secs; do
    echo "molecule scenario $scenario: exit $c in ${secs}s"
    [ "$c" = 0 ] && continue
    echo "---- molecule $scenario: failed tasks and errors ----"
    sed 's/\x1b\[[0-9;]*m//g' "$results/molecule-$scenario.log" \
      | grep -E -A12 "fatal: |FAILED!|failed: |ERROR |Traceback|AssertionError" | tail -80
    echo "---- molecule $scenario: its last lines ----"
    sed 's/\x1b\[[0-9;]*m//g' "$results/molecule-$scenario.log" | tail -25
  done < "$results/molecule.txt"
}
pytest_run() {  # pytest with the given arguments; "collected no tests" (exit 5) is a failure
  local c
  .venv/bin/pytest -p no:cacheprovider --durations=30 "$@"  # the slowest tests, for balancing the lanes
  c=$?
  if [ "$c" = 5 ]; then log "pytest collected no tests ($*): that is a failure"; c=1; fi
  return "$c"
}
scenarios=0
if [ $# -gt 0 ]; then
  log "pytest $*"
  pytest_run "$@"; code=$?
  molecule_scenarios || scenarios=1
else
  # Three lanes at once: the tests mostly wait (processes, pods, builds), so the wall time is what counts.
  # Lane A: every test but the real node's and the runtimes'. Lane B ([B] lines): the real-node tests (one node
  # per machine), then the runtimes' contract tests (their own processes only: they need neither a test bed nor
  # the services; here, lane A would be the longest lane by their few minutes). Lane C ([C] lines): the Molecule
  # scenarios, one after the other, then LANE_C_TESTS. Every server binds its own free port.
  codes=$(mktemp -d)
  (
    b=0
    if [ "$REALNODE" = 1 ]; then
      log "lane B: pytest -m 'not realnode' ${LANE_B_LOCKED_TESTS[*]}, then pytest -m realnode"
      # the lock is the subshell's fd 9, closed for pytest (no node process keeps it after the tests)
      ( exec 9>"$REALNODE_LOCK"; flock 9; c=0
        pytest_run -m "not realnode" "${LANE_B_LOCKED_TESTS[@]}" 9>&- || c=1
        pytest_run -m realnode 9>&- || c=1
        exit "$c" ) 2>&1 | tee "$results/lane-b.log"
      [ "${PIPESTATUS[0]}" = 0 ] || b=1
    else
      pytest_run -m "not realnode" "${LANE_B_LOCKED_TESTS[@]}" 2>&1 | tee "$results/lane-b.log"
      [ "${PIPESTATUS[0]}" = 0 ] || b=1
    fi
    log "lane B: pytest -m 'not realnode' ${LANE_B_TESTS[*]}"
    pytest_run -m "not realnode" "${LANE_B_TESTS[@]}" 2>&1 | tee "$results/lane-b-runtimes.log"
    [ "${PIPESTATUS[0]}" = 0 ] || b=1
    echo "$b" > "$codes/realnode"
  ) 2>&1 | sed -u 's/^/[B] /' &
  lane_b=$!
  (
    m=0; molecule_scenarios || m=1
    echo "$m" > "$codes/molecule"
    log "lane C: pytest -m 'not realnode' ${LANE_C_TESTS[*]}"
    pytest_run -m "not realnode" "${LANE_C_TESTS[@]}" 2>&1 | tee "$results/lane-c.log"
    echo "${PIPESTATUS[0]}" > "$codes/lane-c"
  ) 2>&1 | sed -u 's/^/[C] /' &
  lane_c=$!
  log "lane A: pytest -m 'not realnode' without lane B's and C's"
  pytest_run -m "not realnode" "${LANE_B_TESTS[@]/#/--ignore=}" "${LANE_B_LOCKED_TESTS[@]/#/--ignore=}" \
    "${LANE_C_TESTS[@]/#/--ignore=}" 2>&1 | tee "$results/lane-a.log"
  code=${PIPESTATUS[0]}
  log "lane A done in $((SECONDS - T0))s; waiting for lanes B and C"
  wait "$lane_b"
  log "lane B done by $((SECONDS - T0))s"
  wait "$lane_c"
  [ "$(cat "$codes/realnode" 2>/dev/null)" = 0 ] || { log "lane B: the real-node or the runtimes' tests failed (see [B] lines)"; [ "$code" = 0 ] && code=1; }
  [ "$(cat "$codes/molecule" 2>/dev/null)" = 0 ] || scenarios=1
  [ "$(cat "$codes/lane-c" 2>/dev/null)" = 0 ] || { log "lane C: its tests failed (see [C] lines)"; [ "$code" = 0 ] && code=1; }
  rm -rf "$codes"
fi
report_results
rm -rf "$results"
set -e
if [ "$lint" != 0 ]; then log "lint failed (see above)"; [ "$code" = 0 ] && code=1; fi
if [ "$scenarios" != 0 ]; then log "a molecule scenario failed (see above)"; [ "$code" = 0 ] && code=1; fi
log "done in $((SECONDS - T0))s (exit $code)"
exit "$code"
