# Placement (its own process, sqlite, gunicorn) and a Nova region in one
# process (nova_region.py), both validating real Keystone tokens. Compute
# hosts (FAKE_HOSTS) run the fake live-migration driver, each server it
# runs a domain in its host's own libvirtd (peers/libvirt.sh); the end-to-end
# tests claim them through hv_tests::hosts (a test that deletes a host's
# service retires it). The region's control port stops and starts a fake
# host's nova-compute.
start_nova() {
  local dir="$HV_ENV_DIR/nova" pport nport cport ks paste
  pport=$(free_port); nport=$(free_port); cport=$(free_port)
  ks=$(jq -r .keystone.auth_url "$ENV_FILE.partial")
  mkdir -p "$dir/placement"
  local authtoken="www_authenticate_uri = $ks
auth_url = $ks
auth_type = password
project_name = service
user_domain_name = Default
project_domain_name = Default
region_name = RegionOne"
  cat > "$dir/placement/placement.conf" <<CONF
[DEFAULT]
log_file = $LOGS/placement.log
[placement_database]
connection = sqlite:///$dir/placement/placement.db
[api]
auth_strategy = keystone
[keystone_authtoken]
$authtoken
username = placement
password = placement-secret
CONF
  "$VENV/bin/placement-manage" --config-file "$dir/placement/placement.conf" db sync >>"$LOGS/placement-manage.log" 2>&1 \
    || die "placement db sync failed (see $LOGS/placement-manage.log)"
  OS_PLACEMENT_CONFIG_DIR="$dir/placement" \
    "$VENV/bin/python" "$(dirname "$0")/serve_wsgi.py" placement.wsgi.api:application "127.0.0.1:$pport" \
      "$dir/placement/gunicorn.pid" "$LOGS/placement-gunicorn.log" 1 >>"$LOGS/placement.out" 2>&1 &
  record placement $!
  local ka=("$VENV/bin/python" "$(dirname "$0")/keystone_admin.py" "$ks" admin-secret)
  "${ka[@]}" endpoint placement placement "http://127.0.0.1:$pport" >/dev/null
  "${ka[@]}" endpoint nova compute "http://127.0.0.1:$nport/v2.1" >/dev/null
  wait_for "placement on 127.0.0.1:$pport" 60 curl -sf --max-time 5 "http://127.0.0.1:$pport/"

  # Nova's API paste file, with keystonemiddleware configured in place.
  paste="$dir/api-paste.ini"
  awk -v conf="$authtoken
username = nova
password = nova-secret" '{print} /^\[filter:authtoken\]/{getline; print; print conf}' \
    "$VENV/etc/nova/api-paste.ini" > "$paste"
  jq -n --arg paste "$paste" --arg ks "$ks" --argjson port "$nport" --argjson cport "$cport" \
    --arg log "$LOGS/nova-api-access.log" --arg requests "$LOGS/nova-api-requests.jsonl" \
    '{paste: $paste, auth_url: $ks, port: $port, control_port: $cport, access_log: $log, request_log: $requests,
      hosts: $ARGS.positional, libvirt: $libvirt}' --argjson libvirt "$(jq -c .libvirt.hosts "$ENV_FILE.partial")" \
      --args "${FAKE_HOSTS[@]}" > "$dir/region.json"
  "$VENV/bin/python" "$(dirname "$0")/nova_region.py" "$dir/region.json" "$dir/ready.json" \
    >>"$LOGS/nova-region.log" 2>&1 &
  record nova-region $!
  wait_for "the Nova region (see $LOGS/nova-region.log)" 120 test -s "$dir/ready.json"
  put --arg nova "http://127.0.0.1:$nport/v2.1" --arg placement "http://127.0.0.1:$pport" \
      --slurpfile ready "$dir/ready.json" '.nova = {
      compute_url: $nova, placement_url: $placement, hosts: $ready[0].hosts,
      control_url: $ready[0].control_url,
      compute_microversion: "2.96", placement_microversion: "1.39" }'
}
