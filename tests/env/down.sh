#!/usr/bin/env bash
# make test-env-down: stop exactly what up started (by PID, including the
# helpers the peers spawned themselves and recorded in pid files under the
# scratch directory), then remove the scratch directory.
set -uo pipefail
T0=$(date +%s%N)
source "$(dirname "$0")/lib.sh"

[[ -d "$HV_ENV_DIR" ]] || { log "nothing to stop"; exit 0; }

pids=()
for f in "$PIDS"/*; do [[ -f "$f" ]] && pids+=("$(cat "$f")"); done
# Directories the ground keeps outside the scratch dir (reachable by the
# unprivileged libvirtd), and private libvirtds of tests that crashed.
external=()
[[ -f "$HV_ENV_DIR/external-dirs" ]] && mapfile -t external < "$HV_ENV_DIR/external-dirs"
for d in /tmp/hv-libvirt-private-*; do [[ -d "$d" ]] && external+=("$d"); done
# Daemons started on demand by a peer (virtlogd for libvirt's session) leave
# their pid files in those directories.
while IFS= read -r f; do pids+=("$(cat "$f" 2>/dev/null)"); done < <(find "$HV_ENV_DIR" "${external[@]}" -name '*.pid' -type f 2>/dev/null)

live=()
for pid in $(printf '%s\n' "${pids[@]}" | sort -u); do
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && live+=("$pid")
done
if ((${#live[@]})); then
  kill -TERM "${live[@]}" 2>/dev/null
  for _ in $(seq 50); do
    still=()
    for pid in "${live[@]}"; do kill -0 "$pid" 2>/dev/null && still+=("$pid"); done
    ((${#still[@]})) || break
    sleep 0.2
  done
  for pid in "${live[@]}"; do kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null; done
fi
rm -rf "$HV_ENV_DIR" "${external[@]}"
log "stopped ${#live[@]} process(es), removed $HV_ENV_DIR"
