# Keystone from PyPI (sqlite, fernet tokens) behind gunicorn, one worker:
# with two, concurrent failed logins (which write failed_auth_count) hit
# "database is locked" and answer 500. Nova and
# Placement validate real tokens against it, so the coordinator
# authenticates as in production and a wrong password is testable.
start_keystone() {
  local dir="$HV_ENV_DIR/keystone" port url
  port=$(free_port)
  url="http://127.0.0.1:$port/v3"
  mkdir -p "$dir/fernet-keys" "$dir/credential-keys"
  cat > "$dir/keystone.conf" <<CONF
[DEFAULT]
log_file = $LOGS/keystone.log
[database]
connection = sqlite:///$dir/keystone.db
[token]
provider = fernet
expiration = 86400
[fernet_tokens]
key_repository = $dir/fernet-keys
[credential]
key_repository = $dir/credential-keys
CONF
  local km=("$VENV/bin/keystone-manage" --config-file "$dir/keystone.conf")
  "${km[@]}" db_sync >>"$LOGS/keystone-manage.log" 2>&1 || die "keystone db_sync failed (see $LOGS/keystone-manage.log)"
  "${km[@]}" fernet_setup --keystone-user "$(id -un)" --keystone-group "$(id -gn)" >>"$LOGS/keystone-manage.log" 2>&1
  "${km[@]}" credential_setup --keystone-user "$(id -un)" --keystone-group "$(id -gn)" >>"$LOGS/keystone-manage.log" 2>&1
  "${km[@]}" bootstrap --bootstrap-password admin-secret \
    --bootstrap-admin-url "$url" --bootstrap-internal-url "$url" --bootstrap-public-url "$url" \
    --bootstrap-region-id RegionOne >>"$LOGS/keystone-manage.log" 2>&1 || die "keystone bootstrap failed"
  OS_KEYSTONE_CONFIG_DIR="$dir" OS_KEYSTONE_CONFIG_FILES=keystone.conf \
    "$VENV/bin/python" "$(dirname "$0")/serve_wsgi.py" keystone.wsgi.api:application "127.0.0.1:$port" \
      "$dir/gunicorn.pid" "$LOGS/keystone-gunicorn.log" 1 >>"$LOGS/keystone-gunicorn.out" 2>&1 &
  record keystone $!
  wait_for "keystone on $url" 60 curl -sf --max-time 5 "$url"
  local ka=("$VENV/bin/python" "$(dirname "$0")/keystone_admin.py" "$url" admin-secret)
  "${ka[@]}" user nova nova-secret service admin >/dev/null
  "${ka[@]}" user placement placement-secret service admin >/dev/null
  # The identity the coordinator uses, as an operator would create it.
  "${ka[@]}" user hv-coordinator hv-secret service admin >/dev/null
  put --arg url "$url" '.keystone = {
      auth_url: $url, region: "RegionOne",
      admin: { username: "admin", password: "admin-secret", project_name: "admin",
               user_domain_name: "Default", project_domain_name: "Default" },
      coordinator: { username: "hv-coordinator", password: "hv-secret", project_name: "service",
                     user_domain_name: "Default", project_domain_name: "Default" } }'
}
