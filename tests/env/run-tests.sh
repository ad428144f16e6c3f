#!/usr/bin/env bash
# make test: bring the test ground up, run every test, take the ground down
# (whatever the outcome), and exit with the tests' status.
set -uo pipefail
here="$(dirname "$0")"
source "$here/lib.sh"
# Install first: the snapshot below needs `ip` (iproute2), which install.sh
# provides on a machine that lacks it.
bash "$here/install.sh" >&2 || { echo "installing the test ground's packages failed" >&2; exit 1; }
# What `down` must leave as it was: network links, and no process of ours.
links() { ip -o link | awk -F': ' '{print $2}' | sort; }
links_before=$(links)
if ! bash "$here/up.sh"; then
  echo "test ground failed to come up; logs are in ${HV_ENV_DIR:-.hv-env}/logs" >&2
  [[ -n "${HV_KEEP_ENV:-}" ]] || bash "$here/down.sh"
  exit 1
fi
# The end-to-end tests run the workspace's binaries as processes (hv-coordinator,
# hvctl, hv-agent, hv-ceph-probe); `cargo test` alone builds only test harnesses.
"${CARGO:-cargo}" build --workspace --bins && "${CARGO:-cargo}" test --workspace --all-targets "$@"
rc=$?
if [[ -n "${HV_KEEP_ENV:-}" ]]; then
  echo "HV_KEEP_ENV is set: the test ground stays up (make test-env-down stops it)" >&2
else
  bash "$here/down.sh"
  if [[ "$(links)" != "$links_before" ]]; then
    echo "test-env-down left network links behind:" >&2
    diff <(echo "$links_before") <(links) >&2
    rc=1
  fi
  if pgrep -af "$HV_ENV_DIR" >&2; then
    echo "test-env-down left the processes above running" >&2
    rc=1
  fi
fi
exit $rc
