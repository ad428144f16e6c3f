#!/usr/bin/env bash
# make test: bring the test ground up, run every test, take the ground down
# (whatever the outcome), and exit with the tests' status.
#
# The test executables (one per crate's unit tests and one per file in a
# tests/ directory) run one after the other, in an order set by
# HV_TEST_ORDER: `random` (the default; the seed is printed, and
# HV_TEST_SEED=N repeats an order), `reverse`, or `cargo` (cargo's own). The
# suite must pass in any order: no test may rely on another having run.
# Arguments are passed to every test executable (a name filter, say).
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

run_all() {
  local cargo="${CARGO:-cargo}" plan
  # The end-to-end tests run the workspace's binaries as processes
  # (hv-coordinator, hvctl, hv-agent, hv-ceph-probe); `cargo test` alone
  # builds only test harnesses.
  "$cargo" build --workspace --bins || return 1
  plan=$(mktemp)
  local build_err; build_err=$(mktemp)
  # A build error must show: cargo's diagnostics go to a file, printed when it fails.
  "$cargo" test --workspace --all-targets --no-run --message-format=json-render-diagnostics 2>"$build_err" \
    | jq -r 'select(.reason == "compiler-artifact" and .profile.test == true and .executable != null)
             | select(.target.kind[0] == "lib" or .target.kind[0] == "bin" or .target.kind[0] == "test")
             | "\(.target.name)\t\(.target.kind[0])\t\(.manifest_path)\t\(.executable)"' > "$plan" \
    || { cat "$build_err" >&2; rm -f "$build_err"; return 1; }
  rm -f "$build_err"
  [[ -s "$plan" ]] || { echo "no test executables were built" >&2; return 1; }
  local order="${HV_TEST_ORDER:-random}" seed="${HV_TEST_SEED:-$RANDOM$RANDOM}"
  case "$order" in
    cargo) ;;
    reverse) tac "$plan" > "$plan.o" && mv "$plan.o" "$plan" ;;
    random) python3 -c 'import random,sys; l=open(sys.argv[1]).read().splitlines(); random.Random(int(sys.argv[2])).shuffle(l); print("\n".join(l))' "$plan" "$seed" > "$plan.o" && mv "$plan.o" "$plan" ;;
    *) echo "HV_TEST_ORDER is cargo, reverse or random, not $order" >&2; return 1 ;;
  esac
  echo "== test order: $order$([[ $order == random ]] && echo " (HV_TEST_SEED=$seed)"): $(cut -f1,2 "$plan" | tr '\t' ':' | paste -sd' ')" >&2
  local failed=() name kind manifest exe
  while IFS=$'\t' read -r name kind manifest exe; do
    echo "== $name ($kind)" >&2
    # As cargo does: from the package's directory.
    if ! (cd "$(dirname "$manifest")" && "$exe" "$@"); then
      failed+=("$name ($kind)")
    fi
  done < "$plan"
  rm -f "$plan"
  # The chart's RBAC against what the coordinator asked of the API server
  # during the tests, from its audit log (only a whole run has asked for
  # everything).
  if [[ $# -eq 0 ]]; then
    echo "== RBAC of the chart" >&2
    "$cargo" run -q -p hv-tests --bin hv-rbac-check || failed+=("the chart's RBAC")
  fi
  if ((${#failed[@]})); then
    echo "failed: ${failed[*]} (order $order${seed:+, HV_TEST_SEED=$seed})" >&2
    return 1
  fi
}
run_all "$@"
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
