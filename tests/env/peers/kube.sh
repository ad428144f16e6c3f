# A real Kubernetes control plane on loopback, built from pinned Go modules
# (tests/env/controlplane/): etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler and kwok, which keeps the tests' fake Nodes alive and runs
# the pods bound to them as kubelets would.
#
# - The API server: TLS with the ground's own CA, client-certificate and
#   ServiceAccount-token authentication, the RBAC authorizer, the default
#   admission chain (webhooks included, ServiceAccount admission off: no pod
#   here ever runs, and it would race the namespace's default account), and
#   an audit log of every request made by a ServiceAccount of hv-system (the
#   chart's identities) or hv-rbac (the RBAC test's), read by the RBAC check.
# - The controller manager: the garbage collector, the disruption controller
#   (PodDisruptionBudget status), the Node lifecycle controller (a Node whose
#   lease stops being renewed turns Unknown after 12 s), the token and
#   ServiceAccount controllers, the namespace controller, and the Deployment
#   and ReplicaSet controllers (the coordinator's drain guards are
#   Deployments); each controller with its own ServiceAccount's credentials,
#   as clusters run it. No StatefulSet or DaemonSet controller runs: the
#   chart's coordinators and agents run as the tests' processes, not pods.
# - The scheduler binds pods that name no Node (a drain guard's, by its
#   node affinity). The coordinator pods the tests make stand for processes:
#   they name a scheduler that does not exist and stay unbound.
# - kwok manages the Nodes labelled kwok.x-k8s.io/node=fake: it sets them
#   Ready and renews their Leases every 2 s. A Node whose label is taken
#   away is no longer renewed: its kubelet has "stopped".
# - etcd, the API server and kwok run at a higher priority than the tests'
#   processes (nice -5 where the ground may raise it): on a loaded machine a
#   Lease renewal that waits for the CPU would read as a dead kubelet.
#
# The CRDs come with the chart (peers/chart.sh), as an install gets them.
# env.json gets `.kube`.
start_kube() {
  local dir="$HV_ENV_DIR/kube" here bin pki api etcd_client etcd_peer kcm_port sched_port
  here="$(dirname "${BASH_SOURCE[0]}")/.."
  bin=$(bash "$here/controlplane/build.sh" | tail -1)
  pki="$dir/pki"
  mkdir -p "$pki" "$dir/etcd"
  _kube_pki "$pki"
  api=$(free_port); etcd_client=$(free_port); etcd_peer=$(free_port); kcm_port=$(free_port); sched_port=$(free_port)
  local PRIO=()
  nice -n -5 true 2>/dev/null && PRIO=(nice -n -5)

  "${PRIO[@]}" "$bin/etcd" --name hv --data-dir "$dir/etcd" --log-level warn --unsafe-no-fsync \
    --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "hv=http://127.0.0.1:$etcd_peer" >>"$LOGS/etcd.log" 2>&1 &
  record etcd $!
  wait_for "etcd on port $etcd_client" 30 curl -sf "http://127.0.0.1:$etcd_client/health"

  cat > "$dir/audit-policy.yaml" <<'YAML'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
# The chart's identities (and the RBAC test's release of it, in hv-rbac):
# what they ask for is what the chart must grant.
- level: Metadata
  userGroups: ["system:serviceaccounts:hv-system", "system:serviceaccounts:hv-rbac"]
- level: None
YAML
  # No watch cache for ConfigMaps (nothing of ours watches them): a watch
  # resumed from a version etcd has compacted reaches etcd and is answered
  # 410 Gone, so kube_api's relist test needs no long wait for the cache's
  # window to pass. Every other resource is cached, as in a cluster.
  "${PRIO[@]}" "$bin/kube-apiserver" \
    --watch-cache-sizes configmaps#0 \
    --etcd-servers "http://127.0.0.1:$etcd_client" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api" \
    --tls-cert-file "$pki/apiserver.pem" --tls-private-key-file "$pki/apiserver-key.pem" \
    --client-ca-file "$pki/ca.pem" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --authorization-mode RBAC \
    --disable-admission-plugins ServiceAccount \
    --service-cluster-ip-range 10.96.0.0/24 --endpoint-reconciler-type none \
    --audit-policy-file "$dir/audit-policy.yaml" --audit-log-path "$LOGS/kube-audit.jsonl" \
    --audit-log-format json --audit-log-mode blocking \
    --profiling=false >>"$LOGS/kube-apiserver.log" 2>&1 &
  record kube-apiserver $!

  _kubeconfig "$dir/admin.kubeconfig" "$api" "$pki/admin"
  _kubeconfig "$dir/kcm.kubeconfig" "$api" "$pki/kcm"
  _kubeconfig "$dir/kwok.kubeconfig" "$api" "$pki/kwok"
  _kubeconfig "$dir/scheduler.kubeconfig" "$api" "$pki/scheduler"
  wait_for "kube-apiserver on port $api" 90 \
    curl -sf --cacert "$pki/ca.pem" --cert "$pki/admin.pem" --key "$pki/admin-key.pem" "https://127.0.0.1:$api/readyz"

  # A Node's Lease lasts 8 s (renewed every 2 s), and 12 s without one
  # makes it NotReady: tests see a stopped kubelet quickly. `make bench`
  # asks for 600 s (HV_NODE_LEASE_SECONDS): 5,000 Leases renewed even at
  # the kubelet's pace (every 10 s) are a control plane's own machines'
  # load, which on the ground's two cores would starve Nova and the
  # coordinator the scale benchmark measures.
  local lease="${HV_NODE_LEASE_SECONDS:-8}"
  [[ "$lease" =~ ^[1-9][0-9]*$ ]] || { log "HV_NODE_LEASE_SECONDS must be a whole number of seconds, not '$lease'"; return 1; }
  "$bin/kube-controller-manager" --kubeconfig "$dir/kcm.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$kcm_port" --leader-elect=false \
    --controllers garbage-collector-controller,disruption-controller,node-lifecycle-controller,serviceaccount-token-controller,serviceaccount-controller,namespace-controller,deployment-controller,replicaset-controller \
    --use-service-account-credentials \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.pem" \
    --node-monitor-period 1s --node-monitor-grace-period "$((lease * 3 / 2))s" \
    >>"$LOGS/kube-controller-manager.log" 2>&1 &
  record kube-controller-manager $!

  "$bin/kube-scheduler" --kubeconfig "$dir/scheduler.kubeconfig" \
    --authentication-kubeconfig "$dir/scheduler.kubeconfig" --authorization-kubeconfig "$dir/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$sched_port" --leader-elect=false \
    >>"$LOGS/kube-scheduler.log" 2>&1 &
  record kube-scheduler $!

  "${PRIO[@]}" "$bin/kwok" --kubeconfig "$dir/kwok.kubeconfig" \
    --manage-nodes-with-label-selector kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds "$lease" >>"$LOGS/kwok.log" 2>&1 &
  record kwok $!

  local kubectl=("$bin/kubectl" --kubeconfig "$dir/admin.kubeconfig")
  # The controller manager's own accounts: it made them once it runs.
  wait_for "the controller manager's accounts" 60 "${kubectl[@]}" -n kube-system get serviceaccount generic-garbage-collector
  "${kubectl[@]}" create namespace hv-system >/dev/null

  put --arg url "https://127.0.0.1:$api" --arg ca "$pki/ca.pem" --arg kc "$dir/admin.kubeconfig" \
      --arg audit "$LOGS/kube-audit.jsonl" --arg bin "$bin" --arg etcd "http://127.0.0.1:$etcd_client" \
      --argjson lease "$lease" \
      '.kube = { url: $url, ca_file: $ca, admin_kubeconfig: $kc, audit_log: $audit, bin_dir: $bin, etcd: $etcd, node_lease_seconds: $lease }'
}

# The control plane's certificates: a CA, the API server's serving
# certificate, client certificates for the ground's administrator
# (system:masters), the controller manager, the scheduler and kwok, and the key that signs
# ServiceAccount tokens.
_kube_pki() {
  local d=$1
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=hv-test-kube-ca" \
    -keyout "$d/ca-key.pem" -out "$d/ca.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  _kube_leaf "$d" apiserver "/CN=kube-apiserver" serverAuth \
    "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:127.0.0.1,IP:10.96.0.1"
  _kube_leaf "$d" admin "/O=system:masters/CN=hv-ground-admin" clientAuth ""
  _kube_leaf "$d" kcm "/CN=system:kube-controller-manager" clientAuth ""
  _kube_leaf "$d" scheduler "/CN=system:kube-scheduler" clientAuth ""
  # kwok writes Nodes, their Leases and Pods' status, as kubelets would.
  _kube_leaf "$d" kwok "/O=system:masters/CN=kwok" clientAuth ""
  openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
  openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
}

_kube_leaf() { # DIR NAME SUBJECT EXTENDED_KEY_USAGE SUBJECT_ALT_NAME
  local ext; ext=$(mktemp)
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=%s\n' "$4" > "$ext"
  [[ -z "$5" ]] || echo "subjectAltName=$5" >> "$ext"
  openssl req -newkey rsa:2048 -nodes -subj "$3" -keyout "$1/$2-key.pem" -out "$1/$2.csr" 2>/dev/null
  openssl x509 -req -in "$1/$2.csr" -CA "$1/ca.pem" -CAkey "$1/ca-key.pem" -CAcreateserial \
    -days 3650 -extfile "$ext" -out "$1/$2.pem" 2>/dev/null
  rm -f "$ext" "$1/$2.csr"
}

_kubeconfig() { # FILE PORT CERT_PREFIX
  cat > "$1" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: hv-ground
  cluster:
    server: https://127.0.0.1:$2
    certificate-authority: $(dirname "$3")/ca.pem
users:
- name: $(basename "$3")
  user:
    client-certificate: $3.pem
    client-key: $3-key.pem
contexts:
- name: hv-ground
  context: {cluster: hv-ground, user: $(basename "$3")}
current-context: hv-ground
YAML
}
