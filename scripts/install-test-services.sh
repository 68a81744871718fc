#!/usr/bin/env bash
# Installs the real services the test suite starts on loopback: the PostgreSQL server
# binaries, RabbitMQ (installed but left stopped: the fixtures run their own broker),
# wrk (benchmarks), Chromium with its driver (browser tests) and an S3 server (moto[server]) in its own virtualenv, because
# moto's botocore pins conflict with the kubernetes client in the project's venv,
# bubblewrap (bwrap), the sandbox `sless up` runs every tenant's function in, passt (pasta), which gives each
# function its own network namespace, and promtool (Debian's prometheus package; its server is left stopped), which
# checks and unit-tests the chart's alerting rules, and zsh and fish, in which the CLI's completion scripts are tested.
# Idempotent and quick when everything is already there. Debian 12, as root (or sudo).
set -euo pipefail
TOOLS=${SLESS_TOOLS_DIR:-/var/cache/sless-tools}
MOTO_VENV=$TOOLS/moto-venv
MOTO_SPEC=${SLESS_MOTO_SPEC:-moto[server]>=5,<6}
log() { echo "[install-test-services] $*"; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

have_pg() { compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; }
have_rabbit() { [ -x /usr/sbin/rabbitmq-server ] || [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; }
have_wrk() { command -v wrk >/dev/null 2>&1; }
have_bwrap() { command -v bwrap >/dev/null 2>&1; }
have_pasta() { command -v pasta >/dev/null 2>&1; }
have_chromium() { [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; }
have_buildah() { command -v buildah >/dev/null 2>&1; }
have_promtool() { command -v promtool >/dev/null 2>&1; }
have_shells() { command -v zsh >/dev/null 2>&1 && command -v fish >/dev/null 2>&1; }
have_moto() { [ -f "$MOTO_VENV/.complete" ] && "$MOTO_VENV/bin/python" -c 'import moto.server' 2>/dev/null; }

missing=()
have_pg || missing+=(postgresql)
have_rabbit || missing+=(rabbitmq-server)
have_wrk || missing+=(wrk)
have_bwrap || missing+=(bubblewrap)
have_pasta || missing+=(passt)
have_chromium || missing+=(chromium chromium-driver)  # browser tests: a function page vs the console
have_buildah || missing+=(buildah)  # the runtime_images role's tests build with a real builder
have_promtool || missing+=(prometheus)  # promtool: the chart's PrometheusRule is checked and unit-tested with it
have_shells || missing+=(zsh fish)  # the CLI's completion scripts for them are run in them
PY=${SLESS_PYTHON:-python3}
if ! have_moto && ! "$PY" -c 'import venv, ensurepip' 2>/dev/null; then missing+=(python3-venv); fi

if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  # Keep the packages' own services from starting: the tests start private instances.
  policy_added=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    log "temporarily disabling service start-up during install (policy-rc.d)"
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 755 /usr/sbin/policy-rc.d
    policy_added=1
  fi
  cleanup() { if [ "$policy_added" = 1 ]; then $SUDO rm -f /usr/sbin/policy-rc.d; fi; }
  trap cleanup EXIT
  for p in "${missing[@]}"; do
    if ! apt-cache show "$p" >/dev/null 2>&1; then
      log "apt-get update (no package list knows $p yet)"
      $SUDO apt-get update -q
      break
    fi
  done
  log "apt-get install ${missing[*]}"
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  cleanup; policy_added=0
else
  log "postgresql, rabbitmq-server, wrk, bubblewrap and passt already installed"
fi

# A broker left running by a package install would hold port 5672 and epmd's 4369.
if command -v rabbitmqctl >/dev/null 2>&1 && pgrep -u rabbitmq -f beam >/dev/null 2>&1; then
  log "stopping the system RabbitMQ service (tests start their own)"
  $SUDO service rabbitmq-server stop >/dev/null 2>&1 || $SUDO rabbitmqctl stop >/dev/null 2>&1 || true
fi

if have_moto; then
  log "moto venv present at $MOTO_VENV"
else
  log "creating moto venv at $MOTO_VENV ($MOTO_SPEC)"
  $SUDO mkdir -p "$TOOLS"
  # Built in place (venv scripts carry their absolute path); .complete marks success,
  # so an interrupted run is redone from scratch next time.
  $SUDO rm -rf "$MOTO_VENV"
  $SUDO "$PY" -m venv "$MOTO_VENV"
  $SUDO "$MOTO_VENV/bin/pip" install -q --disable-pip-version-check "$MOTO_SPEC"
  $SUDO touch "$MOTO_VENV/.complete"
  have_moto || { log "moto venv is broken"; exit 1; }
fi
log "ready: $(ls -d /usr/lib/postgresql/*/bin | tail -1), $(command -v wrk), $MOTO_VENV/bin/moto_server"
