# ovsdb-server with the Open_vSwitch schema, userspace only (no kernel
# module, no vswitchd, so no tap devices), with br-int (fail mode secure, as
# Neutron and OVN set it) and br-ex created.
start_ovsdb() {
  local dir="$HV_ENV_DIR/ovs" port
  port=$(free_port)
  mkdir -p "$dir"
  ovsdb-tool create "$dir/conf.db" /usr/share/openvswitch/vswitch.ovsschema
  ovsdb-server "$dir/conf.db" \
    --remote="ptcp:$port:127.0.0.1" --remote="punix:$dir/db.sock" \
    --unixctl="$dir/ovsdb-server.ctl" --pidfile="$dir/ovsdb-server.pid" \
    --log-file="$LOGS/ovsdb-server.log" --detach --no-chdir
  record ovsdb-server "$(cat "$dir/ovsdb-server.pid")"
  wait_for "ovsdb-server" 15 sh -c "ovsdb-client --timeout=2 list-dbs tcp:127.0.0.1:$port >/dev/null 2>&1"
  ovs-vsctl --db="unix:$dir/db.sock" --no-wait init
  for br in br-int br-ex; do
    ovs-vsctl --db="unix:$dir/db.sock" --no-wait add-br "$br"
  done
  ovs-vsctl --db="unix:$dir/db.sock" --no-wait set-fail-mode br-int secure
  put --argjson port "$port" --arg sock "$dir/db.sock" '.ovsdb = {
      host: "127.0.0.1", port: $port, tcp: "tcp:127.0.0.1:\($port)", unix: "unix:\($sock)",
      bridges: ["br-int", "br-ex"] }'
}
