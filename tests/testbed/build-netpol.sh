#!/usr/bin/env bash
# Builds the real node's NetworkPolicy engine: kube-router, run with only its firewall (its
# network policy controller: iptables + ipsets per policy, pod and namespace). kube-router is
# built from its Go module; v2.1.0 is the one version the module proxy serves here (it refuses
# the module's later tags and answers only v2.1.0 in the version list). Once, into a cache
# outside the repository keyed by the version, the Go version and this script's hash (apart
# from build-realnode.sh, whose key covers CoreDNS, the registry and kaniko); GOMODCACHE and
# GOCACHE are shared with build.sh. Timings go to stderr, the binary folder to stdout.
# `--check` builds nothing: exit 0 and print the folder when built, exit 3 when not.
# Concurrent runs wait for each other (flock).
set -euo pipefail
KUBE_ROUTER=${TESTBED_KUBE_ROUTER:-v2.1.0}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
C=${TESTBED_CACHE:-/var/cache/sless-testbed}
export GOMODCACHE=$C/gomod GOCACHE=$C/gobuild
GOV=$(go env GOVERSION)
HASH=$(sha256sum "$0" | cut -c1-8)
B=$C/netpol-bin/$KUBE_ROUTER-$GOV-$HASH
log() { echo "[netpol-build $(date +%T)] $*" >&2; }
if [ -x "$B/kube-router" ]; then echo "$B"; exit 0; fi
if [ "${1:-}" = --check ]; then exit 3; fi
mkdir -p "$C"; exec 9>"$C/netpol-build.lock"
if ! flock -n 9; then log "another build runs; waiting for it"; flock 9; fi
if [ -x "$B/kube-router" ]; then echo "$B"; exit 0; fi
rm -rf "$B.partial"; mkdir -p "$B.partial"; W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
NICE=(nice -n "${TESTBED_NICE:-10}")  # the machine is shared: builds yield to tests
T0=$SECONDS
log "start: kube-router $KUBE_ROUTER"
# a throw-away wrapper module: `go install pkg@version` is refused for modules with replace lines
cd "$W" && go mod init testbed.local/kube-router >/dev/null 2>&1
"${NICE[@]}" go get "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER" >&2
log "modules in $((SECONDS - T0))s"
V=github.com/cloudnativelabs/kube-router/v2/pkg/version
"${NICE[@]}" go build -trimpath -ldflags "-s -w -X $V.Version=$KUBE_ROUTER -X $V.BuildDate=module" \
  -o "$B.partial/kube-router" github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
rm -rf "$B"; mv "$B.partial" "$B"
log "kube-router built in $((SECONDS - T0))s into $B"; du -sh "$B"/* >&2
echo "$B"
