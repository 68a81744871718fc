#!/usr/bin/env bash
# Builds a real Vault-API server for the install tests (the vault_secrets role, Molecule),
# once, into a cache outside the repository keyed by version, Go version and this script's hash.
# Prints timings on stderr and the binary's path on stdout; `--check` builds nothing (exit 3
# when not built). Concurrent runs wait for each other (flock).
#
# Why HashiCorp Vault and not OpenBao: the Go module proxy refuses OpenBao's server module
# (github.com/openbao/openbao@v2.x and @main: "403 This module version is not available";
# its sdk/v2 is not served either), so OpenBao cannot be built here. Vault's server module is
# served. Its go.mod, like Kubernetes', has `replace ./api ./sdk ...` lines, so `go install
# pkg@version` is refused; a wrapper module requiring the published api/sdk versions works.
# The version must be one whose go.mod names a published sdk that matches its own tree (release
# branches carry sdk changes that no sdk tag has): v1.21.4 asks for sdk v0.21.0, whose
# ActivationFunc takes three arguments where that server passes two; v1.21.2 asks for v0.20.0 but
# calls TryRecordObservationWithRequest, which v0.20.0 lacks; v1.21.0 and sdk v0.20.0 fit.
set -euo pipefail
VAULT=${SLESS_VAULT_VERSION:-v1.21.0}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
C=${SLESS_TOOLS_DIR:-/var/cache/sless-tools}/vault
export GOMODCACHE=$C/gomod GOCACHE=$C/gobuild
HASH=$(sha256sum "$0" | cut -c1-8)
B=$C/bin/$VAULT-$(go env GOVERSION)-$HASH
log() { echo "[vault-build $(date +%T)] $*" >&2; }
if [ -x "$B/vault" ]; then echo "$B/vault"; exit 0; fi
if [ "${1:-}" = --check ]; then exit 3; fi
mkdir -p "$C"; exec 9>"$C/build.lock"
if ! flock -n 9; then log "another build runs; waiting for it"; flock 9; fi
if [ -x "$B/vault" ]; then echo "$B/vault"; exit 0; fi
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
T0=$SECONDS
cd "$W" && go mod init sless.local/vault >/dev/null 2>&1
MOD=$(go mod download -json "github.com/hashicorp/vault@$VAULT" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
# keep upstream's replacements that point at other modules (not at its own ./api, ./sdk folders)
sed -n 's#^replace \([^ ]*\( v[^ ]*\)\?\) => \([^.][^ ]* v[^ ]*\)$#\1=\3#p' "$MOD" | while IFS='=' read -r old new; do
  go mod edit -replace="${old// /@}=${new// /@}"; done
log "downloading modules (cold: several hundred MB)"
t=$SECONDS; go get "github.com/hashicorp/vault@$VAULT" >&2 9>&-; log "modules in $((SECONDS - t))s"
t=$SECONDS; mkdir -p "$B.partial"
# 9>&-: the compilers must not inherit the lock (a killed build would otherwise keep it)
nice -n 10 go build -trimpath -ldflags "-s -w" -o "$B.partial/vault" github.com/hashicorp/vault 9>&-
log "compiled in $((SECONDS - t))s"
rm -rf "$B"; mv "$B.partial" "$B"
"$B/vault" version >&2
log "built in $((SECONDS - T0))s: $B/vault ($(du -sh "$B/vault" | cut -f1))"
echo "$B/vault"
