#!/usr/bin/env bash
# Builds gVisor for the real node's optional sandbox (the `gvisor` RuntimeClass, containerd
# handler `runsc`): runsc itself and its containerd shim (containerd-shim-runsc-v1, runtime type
# io.containerd.runsc.v1). Both come from gVisor's Go module: gVisor's `go` branch is the
# Go-buildable one (its main branch needs Bazel), published as pseudo-versions of
# gvisor.dev/gvisor; the version below is the newest one the module proxy serves here, with one
# patch to the shim for roots without CAP_SYS_RESOURCE (see below). Once,
# into a cache outside the repository keyed by that version, the Go version and this script's
# hash, with a module and build cache of its own (gVisor's dependencies do not overlap the
# Kubernetes ones much, and its cold build runs beside build-realnode.sh's). Timings go to
# stderr, the binary folder to stdout. `--check` builds nothing: exit 0 and print the folder
# when built, exit 3 when not. Concurrent runs wait for each other (flock).
set -euo pipefail
GVISOR=${TESTBED_GVISOR:-v0.0.0-20260905035102-160fafc42237}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
C=${TESTBED_CACHE:-/var/cache/sless-testbed}
export GOMODCACHE=$C/gvisor/gomod GOCACHE=$C/gvisor/gobuild
GOV=$(go env GOVERSION)
HASH=$(sha256sum "$0" | cut -c1-8)
B=$C/gvisor-bin/$GVISOR-$GOV-$HASH
ALL=(runsc containerd-shim-runsc-v1)
log() { echo "[gvisor-build $(date +%T)] $*" >&2; }
complete() { for b in "${ALL[@]}"; do [ -x "$B/$b" ] || return 1; done; }
if complete; then echo "$B"; exit 0; fi
if [ "${1:-}" = --check ]; then exit 3; fi
mkdir -p "$C"; exec 9>"$C/gvisor-build.lock"
if ! flock -n 9; then log "another build runs; waiting for it"; flock 9; fi
if complete; then echo "$B"; exit 0; fi
rm -rf "$B.partial"; mkdir -p "$B.partial"; W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
NICE=(nice -n "${TESTBED_NICE:-10}")  # the machine is shared: builds yield to tests
T0=$SECONDS
log "start: gVisor $GVISOR (runsc, containerd-shim-runsc-v1)"
# a throw-away wrapper module, as for the node's other tools (go install refuses replace lines)
cd "$W" && go mod init testbed.local/gvisor >/dev/null 2>&1
"${NICE[@]}" go get "gvisor.dev/gvisor@$GVISOR" >&2
log "modules in $((SECONDS - T0))s"
# One change to the module, for machines whose root lacks CAP_SYS_RESOURCE (this VM kind): the shim's
# start lowers its own oom_score_adj to -999 and gives up when that is refused ("failed to set OOM Score
# on shim: write /proc/<pid>/oom_score_adj: permission denied"), so no pod sandbox ever starts. The
# patched copy goes on without it when the kernel refuses, as containerd's restrict_oom_score_adj does
# for runc's shim; everything else is the module as published.
cp -r "$GOMODCACHE/gvisor.dev/gvisor@$GVISOR" "$W/gvisor-src" && chmod -R u+w "$W/gvisor-src"
F=$W/gvisor-src/pkg/shim/v1/manager.go
OLD='if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil {'
grep -qF "$OLD" "$F" || { log "the shim's OOM score call is not where the patch expects it: $F"; exit 1; }
sed -i "s|$OLD|if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil \&\& !os.IsPermission(err) {|" "$F"
grep -qF '!os.IsPermission(err) {' "$F" || { log "patching $F failed"; exit 1; }
go mod edit -replace "gvisor.dev/gvisor=./gvisor-src"
# one `go build` for both: they share most packages, so the two cores compile each package once
"${NICE[@]}" go build -trimpath -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$GVISOR" \
  -o "$B.partial/" gvisor.dev/gvisor/runsc gvisor.dev/gvisor/shim
mv "$B.partial/shim" "$B.partial/containerd-shim-runsc-v1"
rm -rf "$B"; mv "$B.partial" "$B"
log "gVisor built in $((SECONDS - T0))s into $B"; du -sh "$B"/* >&2
echo "$B"
