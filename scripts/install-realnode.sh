#!/usr/bin/env bash
# Installs the Debian packages a real test-bed node needs (tests/testbed `up --real-node`):
# containerd and runc (the container runtime; runc because crun refuses this kernel's hybrid
# cgroups), the CNI plugins, iptables and conntrack (kube-proxy and the CNI firewall/portmap
# plugins call them), ipset (the NetworkPolicy engine, kube-router's firewall, keeps a policy's
# pods and peers in ipsets), debootstrap (the Debian base image, since no public registry is reachable)
# and buildah (builds the runtime images from their Dockerfiles). Idempotent: a second run only
# checks. No service is started: the test bed runs its own containerd with a private config, so
# packaged services are kept from starting during the install (policy-rc.d) and stopped if an
# init system started them anyway.
set -euo pipefail
PKGS=(containerd runc containernetworking-plugins iptables ipset conntrack debootstrap buildah skopeo)
log() { echo "[install-realnode $(date +%T)] $*" >&2; }
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then log "all installed: ${PKGS[*]}"; exit 0; fi
if [ "$(id -u)" -ne 0 ]; then log "needs root to install: ${missing[*]}"; exit 1; fi
t0=$SECONDS
own_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; own_policy=1
fi
trap '[ "$own_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
# a packaged containerd must not hold /run/containerd: the test bed's own one runs elsewhere,
# but a stray daemon would still be a process nobody stops
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  systemctl disable --now containerd >/dev/null 2>&1 || true
fi
log "installed ${missing[*]} in $((SECONDS - t0))s"
