#!/usr/bin/env bash
# Builds the test suite's OpenTelemetry Collector (tests/testbed/otelcol: the OTLP receiver, HTTP and gRPC,
# and the contrib file exporter writing OTLP JSON lines), the receiver behind the `otlp_receiver` fixture
# (tests/support/otlp.py). Every collector module is at one release (core v0.161.0 and its stable v1.67.0,
# contrib v0.161.0), pinned by the committed go.mod and go.sum. Once, into a cache outside the repository
# keyed by the release and a hash of the build inputs (this script, the module's files, the Go version),
# with a module and build cache of its own. Timings go to stderr, the binary's path to stdout. `--check`
# builds nothing: exit 0 and print the path when built, exit 3 when not. Concurrent runs wait for each
# other (flock).
set -euo pipefail
REL=v0.161.0  # the collector release of tests/testbed/otelcol/go.mod
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly
SRC=$(cd "$(dirname "$0")/otelcol" && pwd)
C=${TESTBED_CACHE:-/var/cache/sless-testbed}/otelcol
export GOMODCACHE=$C/gomod GOCACHE=$C/gobuild
HASH=$( { cat "$0"; cd "$SRC" && cat go.mod go.sum ./*.go; go env GOVERSION; } | sha256sum | cut -c1-12)
B=$C/$REL-$HASH
log() { echo "[otelcol-build $(date +%T)] $*" >&2; }
if [ -x "$B/otelcol" ]; then echo "$B/otelcol"; exit 0; fi
if [ "${1:-}" = --check ]; then exit 3; fi
mkdir -p "$C"; exec 9>"$C/build.lock"
if ! flock -n 9; then log "another build runs; waiting for it"; flock 9; fi
if [ -x "$B/otelcol" ]; then echo "$B/otelcol"; exit 0; fi
rm -rf "$B.partial"; mkdir -p "$B.partial"
NICE=(nice -n "${TESTBED_NICE:-10}")  # the machine is shared: builds yield to tests
T0=$SECONDS
log "start: OpenTelemetry Collector $REL (OTLP receiver, file exporter) from $SRC"
cd "$SRC"
"${NICE[@]}" go mod download >&2
log "modules in $((SECONDS - T0))s"
"${NICE[@]}" go build -trimpath -ldflags "-s -w" -o "$B.partial/otelcol" .
"$B.partial/otelcol" components >/dev/null  # it runs, and its components resolve
rm -rf "$B"; mv "$B.partial" "$B"
log "otelcol built in $((SECONDS - T0))s into $B ($(du -h "$B/otelcol" | cut -f1))"
echo "$B/otelcol"
