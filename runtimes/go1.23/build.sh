#!/usr/bin/env bash
# Compiles a user's Go function together with the sless wrapper into one static
# binary, installed as OUT_DIR/server and OUT_DIR/runner (the mode follows the
# name it is started as).
#
#   runtimes/go1.23/build.sh CODE_DIR OUT_DIR
#
# CODE_DIR holds package `function` (any file names, optional go.mod). It is
# copied into a temporary main module next to the wrapper (wrapper/*.go) and a
# generated main that calls function.<SLESS_ENTRYPOINT>.
#
# Environment:
#   SLESS_ENTRYPOINT  exported function name (default Handle). A `module.func`
#                     value such as the platform default handler.handle maps to
#                     its last part with the first letter upper-cased (Handle).
#   SLESS_GO_CACHE    directory of the module and build caches, kept between
#                     builds (mod/ and build/ below it). Unset: GOMODCACHE and
#                     GOCACHE when set, else $HOME/.cache/sless-go.
#   GOPROXY, GOSUMDB, GOPRIVATE, ...  the usual Go module settings apply.
#
# Exit status: 0 built; 1 compile or module error (the compiler's message on
# stderr, with paths relative to CODE_DIR); 2 usage error.
set -euo pipefail

die() { echo "build.sh: $*" >&2; exit 2; }
[ $# -eq 2 ] || die "usage: build.sh CODE_DIR OUT_DIR"
[ -d "$1" ] || die "CODE_DIR $1 is not a directory"
code_dir=$(cd "$1" && pwd)
mkdir -p "$2" || die "cannot create OUT_DIR $2"
out_dir=$(cd "$2" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

entry=${SLESS_ENTRYPOINT:-Handle}
entry=${entry##*.}
entry="$(printf %s "${entry:0:1}" | tr '[:lower:]' '[:upper:]')${entry:1}"
[[ $entry =~ ^[A-Z][A-Za-z0-9_]*$ ]] ||
  die "SLESS_ENTRYPOINT=${SLESS_ENTRYPOINT:-} is not an exported Go function name"
compgen -G "$code_dir/*.go" >/dev/null || die "no .go files in $code_dir (expected package function)"

if [ -n "${SLESS_GO_CACHE:-}" ]; then
  export GOMODCACHE=$SLESS_GO_CACHE/mod GOCACHE=$SLESS_GO_CACHE/build
else
  cache=${HOME:-/tmp}/.cache/sless-go
  export GOMODCACHE=${GOMODCACHE:-$cache/mod} GOCACHE=${GOCACHE:-$cache/build}
fi
# Keep the caller's GOFLAGS except a -mod mode: the temporary module needs -mod=mod.
goflags=-modcacherw
for flag in ${GOFLAGS:-}; do
  case $flag in -mod=*|-modcacherw) ;; *) goflags="$goflags $flag" ;; esac
done
export GOFLAGS="$goflags -mod=mod" GOTOOLCHAIN=local CGO_ENABLED=0 GOWORK=off GO111MODULE=on

work=$(mktemp -d "${TMPDIR:-/tmp}/sless-go-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/slessrt"
for f in "$here"/wrapper/*.go; do
  case $f in *_test.go) ;; *) cp "$f" "$work/slessrt/" ;; esac
done
cp -R "$code_dir" "$work/function"

# The user's module (or a synthetic one) is required by the main module and
# replaced by the copy, so its own go line sets the language version of its code.
if [ -f "$work/function/go.mod" ]; then
  mod_path=$(cd "$work/function" && go mod edit -json | sed -n '/"Path": /{s/^[[:space:]]*"Path": "\(.*\)",\{0,1\}$/\1/p;q;}')
  [ -n "$mod_path" ] || { echo "build.sh: cannot read the module path of $code_dir/go.mod" >&2; exit 1; }
else
  mod_path=sless.local/function
  printf 'module %s\n\ngo 1.23\n' "$mod_path" >"$work/function/go.mod"
fi
cat >"$work/go.mod" <<EOF
module slessmain

go 1.23

require $mod_path v0.0.0

replace $mod_path => ./function
EOF
[ ! -f "$work/function/go.sum" ] || cp "$work/function/go.sum" "$work/go.sum"

# Replace and exclude directives only count in the main module, so carry the
# user's over; a local path is resolved against the original CODE_DIR.
user_directives() {
  awk '
    { sub(/\/\/.*/, "") }
    /^[ \t]*(replace|exclude)[ \t]*\([ \t]*$/ { block = $1; next }
    block != "" && /^[ \t]*\)[ \t]*$/ { block = ""; next }
    block != "" && NF { print block, $0; next }
    $1 == "replace" || $1 == "exclude" { print }
  ' "$work/function/go.mod"
}
# A local replacement must stay inside the upload: one pointing elsewhere ("../x", "/", a path that climbs
# out through "..") would read the build host's files and quote them back in compiler errors.
local_replacement() {  # prints the replacement's folder inside the copy, or fails with a message
  local rel=$1 inside
  if [[ $rel == /* ]]; then
    echo "build.sh: go.mod replaces a module with the absolute path $rel: only folders inside the function's code may replace modules" >&2
    return 1
  fi
  inside=$(realpath -m "$work/function/$rel")
  if [[ $inside != "$work/function" && $inside != "$work/function/"* ]]; then
    echo "build.sh: go.mod replaces a module with $rel, outside the function's code: only folders inside it may replace modules" >&2
    return 1
  fi
  printf '%s\n' "$inside"
}
while read -r verb a b c d e; do
  if [ "$verb" = exclude ]; then
    go mod edit -exclude="$a@$b" "$work/go.mod"
    continue
  fi
  old=$a; [ "$b" = "=>" ] || { old="$a@$b"; c=$d; d=$e; }
  c=${c#[\"\`]}; c=${c%[\"\`]}  # go.mod may quote a path
  new=$c
  if [ -n "$d" ]; then new="$c@$d"
  elif [[ $c == ./* || $c == ../* || $c == /* || $c == . || $c == .. ]]; then new=$(local_replacement "$c") || exit 1; fi
  go mod edit -replace="$old=$new" "$work/go.mod"
done < <(user_directives)

import_path=$mod_path
cat >"$work/sless_entrypoint.go" <<EOF
// Code generated by runtimes/go1.23/build.sh. DO NOT EDIT.

package main

import (
	function "$import_path"
	"slessmain/slessrt"
)

func main() { slessrt.Main(function.$entry) }
EOF

# Compiler messages name files relative to the working directory; map them back
# to CODE_DIR-relative paths and give the generated file a readable name.
rewrite_paths() {
  sed -e "s#$work/function/##g" -e "s#\\./function/##g" -e "s#^function/##" \
    -e "s#\\(^\\|[[:space:]]\\)\\./sless_entrypoint\\.go#\\1(entrypoint glue)#g" \
    -e "s#$work/##g"
}

start=$(date +%s.%N)
if ! (cd "$work" && go build -trimpath -ldflags="-s -w" -o "$work/server" .) 2>"$work/build.log"; then
  rewrite_paths <"$work/build.log" >&2
  if grep -q 'entrypoint glue' <(rewrite_paths <"$work/build.log"); then
    echo "build.sh: SLESS_ENTRYPOINT=$entry must name an exported" \
      "func(ctx context.Context, event map[string]any) (any, error) in package function" >&2
  fi
  exit 1
fi
rewrite_paths <"$work/build.log" >&2

# Install atomically, then link the second name to the same file.
cp "$work/server" "$out_dir/.server.new"
mv -f "$out_dir/.server.new" "$out_dir/server"
ln -f "$out_dir/server" "$out_dir/.runner.new" 2>/dev/null || cp "$out_dir/server" "$out_dir/.runner.new"
mv -f "$out_dir/.runner.new" "$out_dir/runner"
printf 'build.sh: built %s/server and runner (entrypoint %s) in %.1fs\n' \
  "$out_dir" "$entry" "$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { print e - s }')" >&2
