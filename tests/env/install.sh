#!/usr/bin/env bash
# Installs what the test ground needs, idempotently: Debian packages for the
# peers, and a pinned Python venv for Keystone, Nova and Placement. Safe to
# run again; does nothing when everything is there.
set -euo pipefail

APT_PACKAGES=(
  # libvirt over TCP (test driver; QEMU driver under TCG for real domains).
  # Not libvirt-daemon-system: it pulls in systemd.
  libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients libvirt-dev pkg-config qemu-system-x86
  # OVSDB (userspace ovsdb-server; no kernel module, no vswitchd)
  openvswitch-switch
  # Ceph: one mon, one memstore OSD; client libraries for the agent
  ceph-mon ceph-osd ceph-common librados-dev librbd-dev
  # helpers the scripts use
  jq procps iproute2 curl
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  # Packages must not start their daemons system-wide on install.
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
  $SUDO chmod +x /usr/sbin/policy-rc.d
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  $SUDO rm -f /usr/sbin/policy-rc.d
fi

# The Python side: pinned versions (issue 3), one venv per pin set, kept
# outside the checkout so fresh clones reuse it.
PY_PINS=(
  "nova==34.0.0" "openstack-placement==16.0.0" "keystone==30.0.0"
  "SQLAlchemy<2.1" gunicorn testtools oslotest wsgi-intercept requests-mock ddt
)
pins_hash=$(printf '%s\n' "${PY_PINS[@]}" | sha256sum | cut -c1-12)
VENV="${HV_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/hv-test-env/venv-$pins_hash}"
if [[ ! -x "$VENV/bin/python" || ! -f "$VENV/.complete" ]]; then
  echo "creating the Python venv for Keystone/Nova/Placement in $VENV (about a minute)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  "$VENV/bin/pip" install -q "${PY_PINS[@]}"
  touch "$VENV/.complete"
fi
echo "$VENV"
