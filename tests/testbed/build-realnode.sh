#!/usr/bin/env bash
# Builds the binaries a real test-bed node needs beyond build.sh's Kubernetes ones: CoreDNS
# (cluster DNS), the distribution registry v3 (the images' home, since no public registry is
# reachable), kaniko's executor (the platform's in-cluster image builder) and a tiny static
# pause binary (the sandbox image). Go modules only, once, into a cache outside the repository
# keyed by every version, the Go version and this script's hash; GOMODCACHE/GOCACHE are shared
# with build.sh. Timings go to stderr, the binary folder to stdout. `--check` builds nothing:
# exit 0 and print the folder when complete, exit 3 when not. Concurrent runs wait (flock).
set -euo pipefail
COREDNS=${TESTBED_COREDNS:-v1.15.0} REGISTRY=${TESTBED_REGISTRY:-v3.1.2} KANIKO=${TESTBED_KANIKO:-v1.23.2}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
C=${TESTBED_CACHE:-/var/cache/sless-testbed}
export GOMODCACHE=$C/gomod GOCACHE=$C/gobuild
GOV=$(go env GOVERSION)
HASH=$(sha256sum "$0" | cut -c1-8)
B=$C/realnode-bin/$COREDNS-$REGISTRY-$KANIKO-$GOV-$HASH
ALL=(coredns registry executor pause)
log() { echo "[realnode-build $(date +%T)] $*" >&2; }
step() { local t0=$SECONDS; log "start: $1"; shift; "$@"; log "done in $((SECONDS - t0))s"; }
complete() { for b in "${ALL[@]}"; do [ -x "$B/$b" ] || return 1; done; }
if complete; then echo "$B"; exit 0; fi
if [ "${1:-}" = --check ]; then exit 3; fi
mkdir -p "$C"; exec 9>"$C/realnode-build.lock"
if ! flock -n 9; then log "another build runs; waiting for it"; flock 9; fi
if complete; then echo "$B"; exit 0; fi
mkdir -p "$B.partial"; W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
NICE=(nice -n "${TESTBED_NICE:-10}")  # the machine is shared: builds yield to tests
# Each tool is built from a throw-away wrapper module (go install refuses modules with replace
# lines, and the proxy refuses kaniko's version list); a finished binary is kept across runs.
wrapped() {  # NAME MODULE@VERSION PACKAGE LDFLAGS
  [ -x "$B.partial/$1" ] && { log "$1 already built"; return 0; }
  mkdir -p "$W/$1" && cd "$W/$1" && go mod init "testbed.local/$1" >/dev/null 2>&1
  "${NICE[@]}" go get "$2" >&2
  "${NICE[@]}" go build -trimpath -ldflags "-s -w $4" -o "$B.partial/$1.tmp" "$3"
  mv "$B.partial/$1.tmp" "$B.partial/$1"
}
build_coredns() {
  wrapped coredns "github.com/coredns/coredns@$COREDNS" github.com/coredns/coredns \
    "-X github.com/coredns/coredns/coremain.GitCommit=$COREDNS"
}
build_registry() {
  wrapped registry "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY" \
    github.com/distribution/distribution/v3/cmd/registry \
    "-X github.com/distribution/distribution/v3/version.version=$REGISTRY"
}
build_executor() {
  wrapped executor "github.com/GoogleContainerTools/kaniko/cmd/executor@$KANIKO" \
    github.com/GoogleContainerTools/kaniko/cmd/executor \
    "-X github.com/GoogleContainerTools/kaniko/pkg/version.version=$KANIKO"
}
build_pause() {
  # the sandbox's only process: sleep until SIGTERM/SIGINT, reap children (it is PID 1)
  mkdir -p "$W/pause" && cd "$W/pause" && go mod init testbed.local/pause >/dev/null 2>&1
  cat > main.go <<'GO'
// pause holds a pod sandbox's namespaces open: it waits for a stop signal, reaps orphans.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s == syscall.SIGCHLD {
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
GO
  "${NICE[@]}" go build -trimpath -ldflags "-s -w" -o "$B.partial/pause" .
}
T0=$SECONDS
step pause build_pause
step "coredns $COREDNS" build_coredns
step "registry $REGISTRY" build_registry
step "kaniko executor $KANIKO" build_executor
rm -rf "$B"; mv "$B.partial" "$B"
log "all built in $((SECONDS - T0))s into $B"; du -sh "$B"/* >&2
echo "$B"
