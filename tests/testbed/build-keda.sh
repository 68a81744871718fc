#!/usr/bin/env bash
# Builds KEDA, the engine behind elastic functions on Kubernetes: its operator (which owns each
# ScaledObject's HPA and scales a Deployment between 0 and 1 itself) and its metrics adapter (the
# external.metrics.k8s.io server the HPA asks for more than one replica), from KEDA's Go module,
# with its CRDs beside them. KEDA's go.mod pins its dependencies with replace lines, which only
# hold in the main module, so it builds inside a copy of the module as published. Once, into a
# cache outside the repository keyed by KEDA's version, the Go version and this script's hash,
# with a module and build cache of its own (KEDA's scalers bring cloud SDKs the Kubernetes build
# does not share). Timings go to stderr, the folder to stdout. `--check` builds nothing: exit 0
# and print the folder when built, exit 3 when not. Concurrent runs wait for each other (flock).
set -euo pipefail
KEDA=${TESTBED_KEDA:-v2.20.2}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
C=${TESTBED_CACHE:-/var/cache/sless-testbed}
export GOMODCACHE=$C/keda/gomod GOCACHE=$C/keda/gobuild
GOV=$(go env GOVERSION)
HASH=$(sha256sum "$0" | cut -c1-8)
B=$C/keda-bin/$KEDA-$GOV-$HASH
ALL=(keda-operator keda-adapter)
log() { echo "[keda-build $(date +%T)] $*" >&2; }
complete() { for b in "${ALL[@]}"; do [ -x "$B/$b" ] || return 1; done; [ -f "$B/crds/keda.sh_scaledobjects.yaml" ] && [ -f "$B/crds/eventing.keda.sh_cloudeventsources.yaml" ]; }
if complete; then echo "$B"; exit 0; fi
if [ "${1:-}" = --check ]; then exit 3; fi
mkdir -p "$C"; exec 9>"$C/keda-build.lock"
if ! flock -n 9; then log "another build runs; waiting for it"; flock 9; fi
if complete; then echo "$B"; exit 0; fi
rm -rf "$B.partial"; mkdir -p "$B.partial"; W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
NICE=(nice -n "${TESTBED_NICE:-10}")  # the machine is shared: builds yield to tests
T0=$SECONDS
log "start: KEDA $KEDA (operator, metrics adapter)"
cd "$W" && go mod init testbed.local/keda >/dev/null 2>&1
src=$(go mod download -json "github.com/kedacore/keda/v2@$KEDA" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
cp -r "$src" "$W/keda" && chmod -R u+w "$W/keda" && cd "$W/keda"
# The adapter's own /metrics server binds every address (`:<--port>`, no flag for the host); the test bed's
# servers listen on loopback only, so it binds 127.0.0.1 (the one change to KEDA's source; checked below).
sed -i 's|metricsBindAddress := fmt.Sprintf(":%v", metricsAPIServerPort)|metricsBindAddress := fmt.Sprintf("127.0.0.1:%v", metricsAPIServerPort)|' \
  cmd/adapter/main.go
grep -q 'fmt.Sprintf("127.0.0.1:%v", metricsAPIServerPort)' cmd/adapter/main.go \
  || { log "cmd/adapter/main.go: the metrics bind address line changed; update the patch"; exit 1; }
"${NICE[@]}" go mod download >&2
log "modules in $((SECONDS - T0))s"
V=github.com/kedacore/keda/v2/version
# one `go build` for both: they share most packages, so the two cores compile each package once
"${NICE[@]}" go build -trimpath -ldflags "-s -w -X $V.Version=${KEDA#v} -X $V.GitCommit=module" \
  -o "$B.partial/" ./cmd/operator ./cmd/adapter
mv "$B.partial/operator" "$B.partial/keda-operator"; mv "$B.partial/adapter" "$B.partial/keda-adapter"
# every CRD: the operator also runs the CloudEventSource controllers (eventing.keda.sh)
mkdir "$B.partial/crds" && cp config/crd/bases/*.yaml "$B.partial/crds/"
cp pkg/scalers/externalscaler/externalscaler.proto "$B.partial/"
rm -rf "$B"; mv "$B.partial" "$B"
log "KEDA built in $((SECONDS - T0))s into $B"; du -sh "$B"/* >&2
echo "$B"
