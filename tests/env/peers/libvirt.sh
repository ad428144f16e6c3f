# libvirtd over TCP, as the unprivileged user `nobody` in session mode, with
# every XDG directory inside the scratch dir: hermetic, no system state.
# Serves test+tcp://…/default (the test driver: inventory and events) and
# qemu+tcp://…/session (the QEMU driver under TCG: real domains).
start_libvirt() {
  local dir port
  # libvirtd runs as `nobody`: its directory must be reachable by nobody
  # even when the checkout is not (a clone under /root, say), so it lives
  # under /tmp; down.sh removes it (it is listed in external-dirs).
  dir=$(mktemp -d /tmp/hv-env-libvirt.XXXXXX)
  chmod 755 "$dir"
  echo "$dir" >> "$HV_ENV_DIR/external-dirs"
  port=$(free_port)
  mkdir -p "$dir"/{config,runtime,cache,data,home}
  cat > "$dir/libvirtd.conf" <<CONF
listen_tls = 0
listen_tcp = 1
tcp_port = "$port"
listen_addr = "127.0.0.1"
auth_tcp = "none"
unix_sock_dir = "$dir/runtime"
log_outputs = "3:file:$dir/libvirtd.log"
CONF
  chmod 700 "$dir/runtime"
  chown -R nobody:nogroup "$dir"
  ln -sf "$dir/libvirtd.log" "$LOGS/libvirtd.log"
  setpriv --reuid=nobody --regid=nogroup --clear-groups \
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$dir/home" \
      XDG_CONFIG_HOME="$dir/config" XDG_RUNTIME_DIR="$dir/runtime" \
      XDG_CACHE_HOME="$dir/cache" XDG_DATA_HOME="$dir/data" \
    libvirtd --listen -f "$dir/libvirtd.conf" >>"$LOGS/libvirtd.out" 2>&1 &
  record libvirtd $!
  wait_for "libvirtd on 127.0.0.1:$port" 30 virsh -c "test+tcp://127.0.0.1:$port/default" version
  put --argjson port "$port" --arg dir "$dir" '.libvirt = {
      host: "127.0.0.1", port: $port, user: "nobody", dir: $dir,
      test_uri: "test+tcp://127.0.0.1:\($port)/default",
      qemu_session_uri: "qemu+tcp://127.0.0.1:\($port)/session" }'
}
