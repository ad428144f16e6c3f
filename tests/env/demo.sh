#!/usr/bin/env bash
# make demo: a local region on this machine, and three new hypervisors
# onboarded into it with no human in the loop.
#
# Brings up the test ground (libvirtd, OVSDB, Ceph, Keystone, Nova with
# fake compute hosts, Placement, and a real Kubernetes control plane with the
# chart installed by Helm) in .hv-demo/, the real hv-coordinator, and one real
# hv-agent per compute host; creates the Kubernetes Nodes compute-1..3 and
# prints each phase change as it happens until all three are Active. Then
# it leaves everything running to look around, and says how to stop it
# (make demo-down).
#
# On a fresh machine it first installs what is missing (Debian packages,
# including the C libraries the build links, and the Python venv), then
# builds. HV_DEMO_ONESHOT=1 (`make demo-check`) stops the region and exits
# once the nodes are Active: what CI runs on a clean checkout.
set -euo pipefail
export HV_ENV_DIR="${HV_DEMO_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/.hv-demo}"
T0=$(date +%s%N)
source "$(dirname "$0")/lib.sh"
say() { printf '\033[1m[demo %5.1fs]\033[0m %s\n' "$(elapsed)" "$*"; }
NODES=(compute-1 compute-2 compute-3)
# Non-interactive (CI): whatever happens, nothing is left running; on a
# failure the logs' last lines are shown first (down.sh removes them).
oneshot_exit() {
  local rc=$?
  kill "${WATCH:-}" 2>/dev/null || true
  if ((rc != 0)); then
    for f in "$HV_ENV_DIR"/build.log "$HV_ENV_DIR"/logs/*.log; do
      [[ -f "$f" ]] || continue
      printf -- '--- last lines of %s\n' "$f" >&2
      tail -n 30 "$f" >&2
    done
  fi
  [[ -n "${HV_KEEP_ENV:-}" ]] || bash "$(dirname "$0")/down.sh" || true
  exit "$rc"
}
[[ -z "${HV_DEMO_ONESHOT:-}" ]] || trap oneshot_exit EXIT

if [[ -d "$HV_ENV_DIR" ]]; then
  say "stopping the previous demo"
  bash "$(dirname "$0")/down.sh" 2>/dev/null
fi

say "installing what is missing (Debian packages and the Python venv, a few minutes the first time)"
VENV=$(bash "$(dirname "$0")/install.sh" 2> >(sed -u 's/^/    /' >&2) | tail -1)
export HV_SKIP_INSTALL=1 HV_VENV="$VENV"

say "building the binaries (several minutes on a fresh clone)"
mkdir -p "$HV_ENV_DIR"
BUILD_LOG="$HV_ENV_DIR/build.log"
if ! (cd "$REPO" && cargo build -p hv-coordinator -p hv-agent -p hv-ceph-probe -p hv-tests --bins 2>&1 \
      | tee "$BUILD_LOG" | { grep --line-buffered -E '^ *(Compiling hv-|Finished)' || true; } | sed -u 's/^ */    /'); then
  tail -40 "$BUILD_LOG" >&2
  die "the build failed (whole output in $BUILD_LOG)"
fi
BIN="$REPO/target/debug"

say "starting the local region"
bash "$(dirname "$0")/up.sh" 2>&1 | sed -u 's/^/    /'
E="$ENV_FILE"
j() { jq -r "$1" "$E"; }

# The Kubernetes API: the ground's control plane (etcd, kube-apiserver,
# kube-controller-manager, kwok), the chart installed into it by Helm. The
# SRE's kubectl is the ground's administrator; the coordinator runs as the
# chart's ServiceAccount, with a token the API server issued (TokenRequest).
KUBECTL="$(j .kube.bin_dir)/kubectl"
export KUBECONFIG="$(j .kube.admin_kubeconfig)"
KCFG="$KUBECONFIG"
COORD_KCFG="$HV_ENV_DIR/coordinator.kubeconfig"
"$KUBECTL" config view --raw --minify > "$COORD_KCFG"
# Its Pod, as an object (a process stands for it: no scheduler of that name
# binds it to a Node), and its token bound to that Pod, as the kubelet
# projects it: the chart's admission policy lets a replica label only the
# pod its token is bound to as the leader's.
"$KUBECTL" -n hv-system create -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: hv-coordinator-0}
spec: {schedulerName: hv-ground-process, serviceAccountName: hv-coordinator,
  containers: [{name: coordinator, image: hv-coordinator}]}
YAML
"$KUBECTL" --kubeconfig "$COORD_KCFG" config set-credentials coordinator \
  --token "$("$KUBECTL" -n hv-system create token hv-coordinator --duration 24h \
    --bound-object-kind Pod --bound-object-name hv-coordinator-0)" >/dev/null
"$KUBECTL" --kubeconfig "$COORD_KCFG" config set-context --current --user coordinator >/dev/null

# The coordinator's OpenStack credentials, as a clouds.yaml.
cat >"$HV_ENV_DIR/clouds.yaml" <<YAML
clouds:
  demo:
    region_name: $(j .keystone.region)
    interface: public
    identity_api_version: 3
    auth:
      auth_url: $(j .keystone.auth_url)
      username: $(j .keystone.coordinator.username)
      password: $(j .keystone.coordinator.password)
      project_name: $(j .keystone.coordinator.project_name)
      user_domain_name: Default
      project_domain_name: Default
YAML

# An availability-zone aggregate for the new hosts, made by the region's admin.
TOKEN=$(curl -sf -D - -o /dev/null -H 'Content-Type: application/json' "$(j .keystone.auth_url)/auth/tokens" -d "$(jq -n \
  --arg p "$(j .keystone.admin.password)" '{auth: {identity: {methods: ["password"], password: {user: {name: "admin",
  domain: {name: "Default"}, password: $p}}}, scope: {project: {name: "admin", domain: {name: "Default"}}}}}')" \
  | awk -F': ' 'tolower($1)=="x-subject-token" {print $2}' | tr -d '\r')
curl -sf -o /dev/null -H "X-Auth-Token: $TOKEN" -H 'Content-Type: application/json' \
  -H 'OpenStack-API-Version: compute 2.96' "$(j .nova.compute_url)/os-aggregates" \
  -d '{"aggregate": {"name": "demo-az-1"}}'

# gRPC is mutual TLS: a CA, the coordinator's certificate, an SRE's for
# hvctl, and one per node naming it (what cert-manager issues on a cluster).
PKI="$HV_ENV_DIR/pki"
"$BIN/hv-test-pki" "$PKI" $(printf -- '--node %s ' "${NODES[@]}")
CA="$PKI/hv-demo-ca.ca.pem"
export HV_TLS_CERT="$PKI/sre.pem" HV_TLS_KEY="$PKI/sre.key" HV_TLS_CA="$CA"

GRPC_PORT=$(free_port); METRICS_PORT=$(free_port)
KUBECONFIG="$COORD_KCFG" "$BIN/hv-coordinator" --listen "127.0.0.1:$GRPC_PORT" --metrics-listen "127.0.0.1:$METRICS_PORT" --os-cloud demo --clouds-yaml "$HV_ENV_DIR/clouds.yaml" \
  --tls-cert "$PKI/coordinator.pem" --tls-key "$PKI/coordinator.key" --client-ca "$CA" \
  --namespace hv-system --identity hv-coordinator-0 --label-leader-pod --aggregate demo-az-1 --custom-trait CUSTOM_HV_DEMO --busy-interval 1s --agent-heartbeat 2s \
  >"$LOGS/coordinator.log" 2>&1 &
record coordinator $!
export HV_COORDINATOR="https://127.0.0.1:$GRPC_PORT"
wait_for "the coordinator" 30 "$BIN/hvctl" list
say "coordinator up (gRPC over mutual TLS $HV_COORDINATOR, metrics http://127.0.0.1:$METRICS_PORT/metrics, logs $LOGS/coordinator.log)"

# Phase changes, as they happen, from the fleet API.
"$BIN/hvctl" watch &
WATCH=$!
[[ -n "${HV_DEMO_ONESHOT:-}" ]] || trap 'kill $WATCH 2>/dev/null || true' EXIT

# Nodes as kubelets register them; kwok keeps them Ready (their Leases renewed).
for n in "${NODES[@]}"; do
  "$KUBECTL" create -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: $n
  labels: {hypervisor.cloud.sap/managed: "true", kwok.x-k8s.io/node: fake}
YAML
done
say "created Kubernetes Nodes ${NODES[*]}"

# The agents log in to their machine's libvirt as a site's would: TLS with
# a client certificate, SASL (SCRAM-SHA-256) on top.
printf '%s\n' "$(j .libvirt.tls.sasl.password)" > "$HV_ENV_DIR/libvirt-sasl-password"
chmod 600 "$HV_ENV_DIR/libvirt-sasl-password"
for n in "${NODES[@]}"; do
  "$BIN/hv-agent" run --node "$n" --coordinator "$HV_COORDINATOR" --heartbeat 2s --health-listen 127.0.0.1:0 \
    --tls-cert "$PKI/node-$n.pem" --tls-key "$PKI/node-$n.key" --tls-ca "$CA" \
    --libvirt-uri "$(j ".libvirt.tls.hosts[\"$n\"]")" --libvirt-pki-dir "$(j .libvirt.tls.pki_dir)" \
    --libvirt-sasl-username "$(j .libvirt.tls.sasl.username)" \
    --libvirt-sasl-password-file "$HV_ENV_DIR/libvirt-sasl-password" \
    --ovsdb "$(j .ovsdb.tcp)" --ceph-conf "$(j .ceph.conf)" \
    --ceph-id "$(j .ceph.client.id)" --ceph-keyring "$(j .ceph.client.keyring)" >"$LOGS/agent-$n.log" 2>&1 &
  record "agent-$n" $!
done
say "started one hv-agent per node (its certificate names its node; libvirt over TLS with SASL)"

deadline=$(( $(date +%s) + 300 ))
until [[ $("$BIN/hvctl" list --phase Active | tail -n +2 | wc -l) -eq ${#NODES[@]} ]]; do
  if (( $(date +%s) > deadline )); then
    "$BIN/hvctl" list
    die "not all nodes became Active within 5 minutes; see $LOGS/coordinator.log"
  fi
  sleep 0.5
done
sleep 0.5
kill $WATCH 2>/dev/null || true
say "all ${#NODES[@]} nodes Active"
# The leader labels its pod, which the chart's Service selects; a leader
# that cannot, steps down and exits.
wait_for "the leader label on the coordinator's pod" 20 bash -c \
  "[[ \$('$KUBECTL' -n hv-system get pod hv-coordinator-0 -o jsonpath='{.metadata.labels.hypervisor\\.cloud\\.sap/leader}') == true ]]"
alive coordinator || die "the coordinator exited; see $LOGS/coordinator.log"
"$BIN/hvctl" list | sed 's/^/    /'

if [[ -n "${HV_DEMO_ONESHOT:-}" ]]; then
  say "HV_DEMO_ONESHOT is set: stopping the region"
  exit 0
fi

cat <<EOF

The region keeps running. Look around:

  export KUBECONFIG=$KCFG HV_COORDINATOR=$HV_COORDINATOR PATH=$BIN:$(dirname "$KUBECTL"):\$PATH
  export HV_TLS_CERT=$HV_TLS_CERT HV_TLS_KEY=$HV_TLS_KEY HV_TLS_CA=$HV_TLS_CA   # an SRE's certificate
  hvctl list                      # the fleet, from the coordinator
  hvctl get compute-1             # one node with its conditions
  hvctl health compute-1          # grpc.health.v1 for node/compute-1
  hvctl watch                     # phase changes as they happen
  kubectl get hv                  # the Hypervisors, from the API server
  grpcurl -cacert \$HV_TLS_CA -cert \$HV_TLS_CERT -key \$HV_TLS_KEY 127.0.0.1:$GRPC_PORT list   # reflection
  grpc_health_probe -addr 127.0.0.1:$GRPC_PORT -tls -tls-ca-cert \$HV_TLS_CA \\
    -tls-client-cert \$HV_TLS_CERT -tls-client-key \$HV_TLS_KEY -service node/compute-1
  kubectl get hv -o json | jq '.items[].status.phase'
  curl -s http://127.0.0.1:$METRICS_PORT/metrics | grep ^hv_   # eviction counters, leader
  logs: $LOGS

Stop it all with: make demo-down
EOF
