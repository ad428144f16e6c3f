# The project's chart (deploy/helm/hv), installed by real Helm into hv-system
# on the ground's API server, release `hv`: its ServiceAccounts, RBAC,
# disruption budgets and eviction webhook are the ones the tests' coordinators
# run under (each with a TokenRequest token of the chart's ServiceAccount).
# Nothing of it runs in a pod: no kubelet runs here; the coordinators and
# agents run as processes, each in a Pod object the tests make for it
# (hv-coordinator-N, so a token can be bound to it).
#
# Values for the ground (tests/env/chart.py installs, and a test upgrades):
# one coordinator replica that no Node takes (a nodeSelector none matches):
# the controller manager runs the Deployment controllers (for the drain
# guards) and the scheduler binds pods to the fake Nodes, so a bound replica
# would be a Pod no process stands for, which a drain would evict past the
# eviction webhook; the update signals of Gardener
# MCM and Cluster API (the ClusterRole reads Machines); drain protection for nova-compute
# and a network agent in `openstack`, its webhook called at a URL (a test that
# drains upgrades the release with its own coordinator's); the BMC credentials'
# Secrets the fencing tests make (bmc-<host>, tests/src/fencing.rs), the only
# Secrets the coordinator may read. The release installs the CRDs, templated
# with their keep policy, as a cluster gets them.
start_chart() {
  local dir="$HV_ENV_DIR/kube" kubeconfig ca
  kubeconfig=$(jq -r '.kube.admin_kubeconfig' "$ENV_FILE.partial")
  ca=$(base64 -w0 < "$(jq -r '.kube.ca_file' "$ENV_FILE.partial")")
  jq -n --arg ca "$ca" '{
    openstack: {cloudsSecret: "hv-clouds", cloud: "hv"},
    coordinator: {
      replicas: 1,
      nodeSelector: {"hv-ground/coordinator": "process"},
      fencing: {bmcSecrets: $ARGS.positional},
      updateSignals: ["gardener-mcm", "cluster-api"],
      drainProtection: {
        enabled: true,
        webhookUrl: "https://127.0.0.1:1/validate-eviction",
        caBundle: $ca,
        protectedPods: [{namespace: "openstack", matchLabels: {app: "nova-compute"}}],
        dependentPods: [{component: "neutron-l2", namespace: "openstack", matchLabels: {app: "neutron-l2"}}]
      }
    }
  }' --args "${FAKE_HOSTS[@]/#/bmc-}" > "$dir/chart-values.json"
  "$(jq -r '.kube.bin_dir' "$ENV_FILE.partial")/kubectl" --kubeconfig "$kubeconfig" create namespace openstack >/dev/null
  "$HELM_VENV/bin/python" "$(dirname "${BASH_SOURCE[0]}")/../chart.py" \
    "$kubeconfig" hv-system hv "$dir/chart-values.json" >>"$LOGS/chart.log" 2>&1 \
    || { tail -5 "$LOGS/chart.log" >&2; die "installing the chart failed (log: $LOGS/chart.log)"; }
  "$(jq -r '.kube.bin_dir' "$ENV_FILE.partial")/kubectl" --kubeconfig "$kubeconfig" wait \
    --for condition=Established --timeout 60s -f "$REPO/deploy/crds" >/dev/null
  put --arg values "$dir/chart-values.json" --arg python "$HELM_VENV/bin/python" \
    '.kube.chart = { release: "hv", namespace: "hv-system", values: $values, helm_python: $python,
      coordinator_account: "hv-coordinator" }'
}
