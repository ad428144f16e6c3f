# Ceph pacific: one mon, one memstore OSD, cephx on, pool size 1, no mgr.
# Pool `vms` holds an RBD image `probe`; pool `secret` exists but the
# restricted hypervisor client `client.node-1` (profile rbd on vms only) may
# not read it. `client.hv-fence` is the coordinator's, for blocklisting.
start_ceph() {
  local dir="$HV_ENV_DIR/ceph" port fsid conf osd_uuid osd_id osd_secret
  port=$(free_port)
  fsid=$(python3 -c 'import uuid; print(uuid.uuid4())')
  mkdir -p "$dir"/{mon,osd,run}
  conf="$dir/ceph.conf"
  cat > "$conf" <<CONF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$port
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
run dir = $dir/run
admin socket = $dir/run/\$cluster-\$name.asok
log file = $LOGS/ceph-\$name.log
pid file = $dir/run/\$name.pid
keyring = $dir/ceph.client.admin.keyring
ms bind ipv6 = false
[mon]
mon data = $dir/mon/\$cluster-\$id
[osd]
osd objectstore = memstore
memstore device bytes = 1073741824
osd data = $dir/osd/\$cluster-\$id
keyring = $dir/osd/\$cluster-\$id/keyring
osd max object name len = 256
osd max object namespace len = 64
CONF
  ceph-authtool --create-keyring "$dir/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$dir/ceph.client.admin.keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool "$dir/mon.keyring" --import-keyring "$dir/ceph.client.admin.keyring" >/dev/null
  monmaptool --create --addv a "[v2:127.0.0.1:$port]" --fsid "$fsid" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/mon.keyring"
  ceph-mon -c "$conf" -i a >>"$LOGS/ceph-mon.out" 2>&1
  wait_for "ceph-mon" 30 test -s "$dir/run/mon.a.pid"
  record ceph-mon "$(cat "$dir/run/mon.a.pid")"
  local c=(ceph -c "$conf" --connect-timeout 10)
  wait_for "ceph-mon quorum" 30 "${c[@]}" mon stat

  osd_uuid=$(python3 -c 'import uuid; print(uuid.uuid4())')
  osd_secret=$(ceph-authtool --gen-print-key)
  echo "{\"cephx_secret\": \"$osd_secret\"}" > "$dir/osd-secret.json"
  osd_id=$("${c[@]}" osd new "$osd_uuid" -i "$dir/osd-secret.json")
  mkdir -p "$dir/osd/ceph-$osd_id"
  ceph-authtool --create-keyring "$dir/osd/ceph-$osd_id/keyring" --name "osd.$osd_id" --add-key "$osd_secret" >/dev/null
  ceph-osd -c "$conf" -i "$osd_id" --mkfs --osd-uuid "$osd_uuid" >>"$LOGS/ceph-osd-mkfs.log" 2>&1 \
    || die "ceph-osd --mkfs failed (see $LOGS/ceph-osd-mkfs.log)"
  ceph-osd -c "$conf" -i "$osd_id" >>"$LOGS/ceph-osd.out" 2>&1
  wait_for "ceph-osd" 30 test -s "$dir/run/osd.$osd_id.pid"
  record ceph-osd "$(cat "$dir/run/osd.$osd_id.pid")"
  wait_for "osd.$osd_id up" 60 sh -c "${c[*]} osd dump | grep -q '^osd.$osd_id up'"

  for pool in vms secret; do
    "${c[@]}" osd pool create "$pool" 8 8 >/dev/null 2>&1
    "${c[@]}" osd pool application enable "$pool" rbd >/dev/null 2>&1
  done
  wait_for "an RBD image in pool vms" 60 rbd -c "$conf" create vms/probe --size 16M
  rbd -c "$conf" create secret/hidden --size 16M
  "${c[@]}" auth get-or-create client.node-1 mon 'profile rbd' osd 'profile rbd pool=vms' \
    -o "$dir/ceph.client.node-1.keyring" >/dev/null
  # The coordinator's fencing identity: it may read the maps and add or lift
  # blocklist entries, nothing else.
  "${c[@]}" auth get-or-create client.hv-fence mon 'allow r, allow command "osd blocklist"' \
    -o "$dir/ceph.client.hv-fence.keyring" >/dev/null
  put --arg conf "$conf" --arg dir "$dir" --argjson port "$port" --arg fsid "$fsid" '.ceph = {
      conf: $conf, fsid: $fsid, mon_host: "127.0.0.1:\($port)",
      admin: { id: "admin", keyring: "\($dir)/ceph.client.admin.keyring" },
      client: { id: "node-1", keyring: "\($dir)/ceph.client.node-1.keyring" },
      fence: { id: "hv-fence", keyring: "\($dir)/ceph.client.hv-fence.keyring" },
      readable_pool: "vms", forbidden_pool: "secret", image: "probe" }'
}
