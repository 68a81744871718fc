#!/usr/bin/env bash
# Builds the test bed's binaries (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kubelet and kube-proxy for a real node, kwok, helm) from Go
# modules (kubelet and kube-proxy in the same `go build` to share its packages), once, into a cache outside
# the repository keyed by every version and this script's hash. Prints timings on stderr
# and the binary folder on stdout. `build.sh --check` builds nothing: exit 0 and print the
# folder when it is complete, exit 3 when not. Concurrent runs wait for each other (flock).
set -euo pipefail
K8S=${TESTBED_K8S:-v1.34.4} ETCD=${TESTBED_ETCD:-v3.6.14} KWOK=${TESTBED_KWOK:-v0.8.0} HELM=${TESTBED_HELM:-v3.19.0}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
C=${TESTBED_CACHE:-/var/cache/sless-testbed}
export GOMODCACHE=$C/gomod GOCACHE=$C/gobuild
GOV=$(go env GOVERSION)
HASH=$(sha256sum "$0" | cut -c1-8)
B=$C/bin/$K8S-$ETCD-$KWOK-$HELM-$GOV-$HASH
log() { echo "[testbed-build $(date +%T)] $*" >&2; }
step() { local t0=$SECONDS; log "start: $1"; shift; "$@"; log "done in $((SECONDS - t0))s"; }
if [ -x "$B/helm" ]; then echo "$B"; exit 0; fi
if [ "${1:-}" = --check ]; then exit 3; fi
mkdir -p "$C"; exec 9>"$C/build.lock"
if ! flock -n 9; then log "another build runs; waiting for it"; flock 9; fi
if [ -x "$B/helm" ]; then echo "$B"; exit 0; fi
rm -rf "$B.partial"; mkdir -p "$B.partial"; W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
build_k8s() {
  mkdir "$W/k" && cd "$W/k" && go mod init testbed.local/k8s >/dev/null 2>&1
  local mod; mod=$(go mod download -json "k8s.io/kubernetes@$K8S" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  grep '^godebug' "$mod" >> go.mod || true
  for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/.*#\1#p' "$mod"); do
    go mod edit -replace="$m=$m@v0.${K8S#v1.}"; done
  local P="kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy"
  go get $(for p in $P; do echo "k8s.io/kubernetes/cmd/$p@$K8S"; done) >&2
  local MIN; MIN=$(echo "${K8S#v}" | cut -d. -f2); local LD="-s -w"
  for v in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LD="$LD -X $v.gitVersion=$K8S -X $v.gitMajor=1 -X $v.gitMinor=$MIN -X $v.gitTreeState=clean"; done
  go build -trimpath -tags selinux,notest -ldflags "$LD" -o "$B.partial/" $(for p in $P; do echo "k8s.io/kubernetes/cmd/$p"; done)
}
build_etcd() {
  mkdir "$W/e" && cd "$W/e" && go mod init testbed.local/etcd >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@$ETCD" >&2
  go build -trimpath -ldflags "-s -w" -o "$B.partial/etcd" go.etcd.io/etcd/server/v3
}
build_kwok() {
  GOBIN="$B.partial" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK"
  local dir; dir=$(go mod download -json "sigs.k8s.io/kwok@$KWOK" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  rm -rf "$B.partial/stages"; mkdir -p "$B.partial/stages"
  # one multi-document file: kustomize may refuse ../ references from a copied folder
  for f in "$dir"/kustomize/stage/pod/fast/*.yaml "$dir"/kustomize/stage/node/fast/*.yaml "$dir"/kustomize/stage/node/heartbeat-with-lease/*.yaml; do
    [ -f "$f" ] || continue; [ "$(basename "$f")" = kustomization.yaml ] && continue
    cat "$f"; echo '---'; done > "$B.partial/stages/fast.yaml"
  cp -r "$dir/kustomize/stage" "$B.partial/stages/kustomize"; chmod -R u+w "$B.partial/stages"
  # CRDs for kwok --enable-crds (Stage, Logs, ...): the test bed applies them before kwok starts
  rm -rf "$B.partial/kwok-crds"; cp -r "$dir/kustomize/crd/bases" "$B.partial/kwok-crds"; chmod -R u+w "$B.partial/kwok-crds"
}
build_helm() {
  local V=helm.sh/helm/v3/internal/version
  GOBIN="$B.partial" go install -trimpath -ldflags "-s -w -X $V.version=$HELM -X $V.gitTreeState=clean" \
    "helm.sh/helm/v3/cmd/helm@$HELM"
}
T0=$SECONDS
step etcd build_etcd
step kwok build_kwok
step helm build_helm
step "kubernetes $K8S" build_k8s
rm -rf "$B"; mv "$B.partial" "$B"
log "all built in $((SECONDS - T0))s into $B"; du -sh "$B"/* >&2
echo "$B"
