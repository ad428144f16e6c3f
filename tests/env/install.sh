#!/usr/bin/env bash
# Installs what the test ground and the build need, idempotently: Debian
# packages (the peers, and the C libraries the crates link), a pinned
# Python venv for Keystone, Nova and Placement, one for the Redfish BMC
# emulator (sushy-tools), one for Helm, and the Kubernetes control plane
# built from pinned Go modules (tests/env/controlplane). Safe to run again; does
# nothing when everything is there. Progress goes to stderr; the last line
# on stdout is the venv's path (up.sh reads it).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

progress() { printf '[install] %s\n' "$*" >&2; }

APT_PACKAGES=(
  # libvirt over TCP (test driver; QEMU driver under TCG for real domains).
  # Not libvirt-daemon-system: it pulls in systemd. sasl2-bin and
  # libsasl2-modules for the SASL-protected libvirtd, gnutls-bin for TLS.
  libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients libvirt-dev pkg-config qemu-system-x86
  sasl2-bin libsasl2-modules
  # OVSDB (userspace ovsdb-server; no kernel module, no vswitchd)
  openvswitch-switch
  # Ceph: one mon, one memstore OSD; client libraries for the agent
  ceph-mon ceph-osd ceph-common librados-dev librbd-dev
  # helpers the scripts use (openssl makes the test PKI, python3-venv the venv)
  jq procps iproute2 curl openssl python3-venv
  # libvirt-python is built in the venv against libvirt-dev
  python3-dev gcc
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  progress "installing ${#missing[@]} Debian package(s) and their dependencies: ${missing[*]}"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  # Packages must not start their daemons system-wide on install.
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  t0=$SECONDS
  $SUDO apt-get update -qq
  # One progress line per 25 packages set up, so a first install (a few
  # hundred packages, a minute or two) is visibly moving.
  log=$(mktemp)
  if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" 2>&1 | tee "$log" \
       | awk '/^Setting up/ { n++; if (n % 25 == 0) { printf "[install] %d packages set up\n", n; fflush() } }' >&2; then
    tail -20 "$log" >&2; rm -f "$log"; $SUDO rm -f /usr/sbin/policy-rc.d
    progress "apt-get install failed"; exit 1
  fi
  n=$(grep -c '^Setting up' "$log" || true)
  rm -f "$log"
  $SUDO rm -f /usr/sbin/policy-rc.d
  progress "set up $n Debian package(s) in $((SECONDS - t0)) s"
fi

# The Python side: pinned versions, one venv per pin set, kept outside the
# checkout so fresh clones reuse it.
PY_PINS=(
  "nova==34.0.0" "openstack-placement==16.0.0" "keystone==30.0.0"
  "SQLAlchemy<2.1" gunicorn testtools oslotest wsgi-intercept requests-mock ddt
  # the fake hosts' domains (nova_region.py); built against libvirt-dev
  "libvirt-python==9.0.0"
)
pins_hash=$(printf '%s\n' "${PY_PINS[@]}" | sha256sum | cut -c1-12)
VENV="${HV_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/hv-test-env/venv-$pins_hash}"
if [[ ! -x "$VENV/bin/python" || ! -f "$VENV/.complete" ]]; then
  progress "creating the Python venv for Keystone/Nova/Placement in $VENV (about a minute)"
  t0=$SECONDS
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  "$VENV/bin/pip" install -q "${PY_PINS[@]}"
  touch "$VENV/.complete"
  progress "venv ready in $((SECONDS - t0)) s"
fi
if [[ ! -x "$SUSHY_VENV/bin/sushy-emulator" || ! -f "$SUSHY_VENV/.complete" ]]; then
  progress "creating the venv for the Redfish BMC emulator in $SUSHY_VENV"
  rm -rf "$SUSHY_VENV"
  python3 -m venv "$SUSHY_VENV"
  "$SUSHY_VENV/bin/pip" install -q "$SUSHY_PIN"
  touch "$SUSHY_VENV/.complete"
fi
ensure_helm_venv
# The Kubernetes control plane, from pinned Go modules (cached once built).
bash "$(dirname "$0")/controlplane/build.sh" >/dev/null
echo "$VENV"
