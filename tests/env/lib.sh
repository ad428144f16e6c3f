# Shared helpers for the test-ground scripts. Sourced, not run.

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HV_ENV_DIR="${HV_ENV_DIR:-$REPO/.hv-env}"
ENV_FILE="$HV_ENV_DIR/env.json"
PIDS="$HV_ENV_DIR/pids"
LOGS="$HV_ENV_DIR/logs"
# The Redfish BMC emulator's own venv (its Flask and ours need not agree
# with Nova's pins).
SUSHY_PIN="sushy-tools==2.2.0"
SUSHY_VENV="${XDG_CACHE_HOME:-$HOME/.cache}/hv-test-env/sushy-venv-${SUSHY_PIN#*==}"
# Real Helm (v4) as a library: installs the chart on the ground, and checks it
# (make chart-check).
HELM_PIN="helm-python-sdk==0.2.2"
HELM_VENV="${XDG_CACHE_HOME:-$HOME/.cache}/hv-test-env/helm-venv-${HELM_PIN#*==}"

# The ground's fake Nova hosts. Each is a machine of its own: Nova runs a
# nova-compute under its name, and a libvirtd of its own calls itself by it
# (peers/libvirt.sh).
FAKE_HOSTS=(compute-{1..17})

# ensure_helm_venv: create $HELM_VENV once.
ensure_helm_venv() {
  [[ -x "$HELM_VENV/bin/python" && -f "$HELM_VENV/.complete" ]] && return 0
  printf '[install] creating the venv for Helm (%s) in %s\n' "$HELM_PIN" "$HELM_VENV" >&2
  rm -rf "$HELM_VENV"
  python3 -m venv "$HELM_VENV"
  "$HELM_VENV/bin/pip" install -q "$HELM_PIN"
  touch "$HELM_VENV/.complete"
}

log() { printf '[test-env %5.1fs] %s\n' "$(elapsed)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
elapsed() { echo "$(( $(date +%s%N) - ${T0:-$(date +%s%N)} ))" | awk '{printf "%.1f", $1/1e9}'; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_for DESCRIPTION SECONDS COMMAND...: retry COMMAND until it succeeds.
wait_for() {
  local what=$1 secs=$2; shift 2
  local deadline=$(( $(date +%s) + secs ))
  # Each attempt gets a hard limit too: a probe that hangs must not hang us.
  until timeout 10 "$@" >/dev/null 2>&1; do
    if (( $(date +%s) >= deadline )); then
      die "$what did not come up within ${secs}s (logs: $LOGS)"
    fi
    sleep 0.2
  done
}

# record NAME PID: remember a process this script started.
record() { echo "$2" > "$PIDS/$1"; }

alive() { [[ -f "$PIDS/$1" ]] && kill -0 "$(cat "$PIDS/$1")" 2>/dev/null; }
