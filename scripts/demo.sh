#!/usr/bin/env bash
# The README's first command: on a fresh machine, set up, start `sless up` (the embedded default),
# deploy the hello examples (Python, Node.js, Go), call each over HTTP, then keep serving until Ctrl-C.
# `scripts/demo.sh --once` stops after showing the calls (used by the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${SLESS_PORT:-8090}
DATA=${SLESS_DATA_DIR:-$PWD/.data}
URL=http://127.0.0.1:$PORT
# The platform's own log lines (JSON) go here, not between the answers shown below.
LOG=${SLESS_DEMO_LOG:-$PWD/.sless-up.log}
log() { echo "[demo] $*" >&2; }
# bubblewrap: the sandbox every tenant's function runs in (sless up refuses to start without one); passt
# (pasta): each function's own network namespace (as root, sless up refuses to start without it).
if ! command -v bwrap >/dev/null 2>&1 || ! command -v pasta >/dev/null 2>&1; then
  SUDO=""; if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  log "installing bubblewrap and passt (the function sandbox and its network)"
  $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap passt
fi
bash scripts/bootstrap.sh
export SLESS_DATA_DIR=$DATA
log "starting sless up on $URL (its log: $LOG)"
.venv/bin/sless up --port "$PORT" --data-dir "$DATA" >>"$LOG" 2>&1 &
SLESS_PID=$!
trap 'kill -TERM $SLESS_PID 2>/dev/null; wait $SLESS_PID 2>/dev/null' EXIT
for _ in $(seq 1 100); do curl -sf "$URL/health" >/dev/null && break; sleep 0.1; done
curl -sf "$URL/health" >/dev/null || { log "sless up did not start; its log ($LOG) ends:"; tail -20 "$LOG" >&2; exit 1; }
for example in hello-python hello-node hello-go; do
  log "deploying examples/$example"
  .venv/bin/sless deploy "examples/$example" --url "$URL" --data-dir "$DATA" --sub demo >/dev/null
done
NS=$(.venv/bin/python -c 'from sless_core.naming import tenant_namespace; print(tenant_namespace("demo"))')
for example in hello-python hello-node hello-go; do
  log "curl $URL/fn/$NS/$example?name=sless"
  curl -sf "$URL/fn/$NS/$example?name=sless"; echo
done
if [ "${1:-}" = "--once" ]; then exit 0; fi
log "sless is serving on $URL (Ctrl-C stops it; its log: $LOG). The functions are tenant 'demo''s: for the CLI"
log "  export SLESS_URL=$URL SLESS_DATA_DIR=$DATA SLESS_SUB=demo; .venv/bin/sless ls"
log "and for the console ($URL/console), its token: .venv/bin/sless token --sub demo --data-dir $DATA"
wait $SLESS_PID
