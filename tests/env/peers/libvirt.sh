# libvirtd, as the unprivileged user `nobody` in session mode, with every
# XDG directory inside its own directory: hermetic, no system state. It
# listens twice on 127.0.0.1:
#   TCP without authentication: test+tcp://…/default (the test driver:
#     inventory and events) and qemu+tcp://…/session (QEMU under TCG: real
#     domains), for most tests;
#   TLS with SASL (SCRAM-SHA-256) on top: test+tls://localhost:…/default,
#     what a site runs; client certificates in tls.pki_dir (and one from
#     another CA in tls.wrong_ca_pki_dir), SASL user and password in tls.sasl.
start_libvirt() {
  local dir port tls_port
  # libvirtd runs as `nobody`: its directory must be reachable by nobody
  # even when the checkout is not (a clone under /root, say), so it lives
  # under /tmp; down.sh removes it (it is listed in external-dirs).
  dir=$(mktemp -d /tmp/hv-env-libvirt.XXXXXX)
  chmod 755 "$dir"
  echo "$dir" >> "$HV_ENV_DIR/external-dirs"
  port=$(free_port)
  tls_port=$(free_port)
  mkdir -p "$dir"/{config,runtime,cache,data,home,sasl}
  source "$(dirname "${BASH_SOURCE[0]}")/../pki.sh"
  make_pki "$dir/pki"
  # SASL: SCRAM-SHA-256 against a sasldb of its own (libvirtd reads
  # libvirt.conf from SASL_CONF_PATH). Over plain TCP libvirt offers no
  # mechanism without a security layer, hence SASL on the TLS listener.
  cat > "$dir/sasl/libvirt.conf" <<CONF
mech_list: scram-sha-256
sasldb_path: $dir/sasl/passwd.db
CONF
  printf '%s' agent-secret | saslpasswd2 -p -a libvirt -f "$dir/sasl/passwd.db" hv-agent
  cat > "$dir/libvirtd.conf" <<CONF
listen_tls = 1
listen_tcp = 1
tcp_port = "$port"
tls_port = "$tls_port"
listen_addr = "127.0.0.1"
auth_tcp = "none"
auth_tls = "sasl"
key_file = "$dir/pki/server/serverkey.pem"
cert_file = "$dir/pki/server/servercert.pem"
ca_file = "$dir/pki/server/cacert.pem"
unix_sock_dir = "$dir/runtime"
log_outputs = "3:file:$dir/libvirtd.log"
CONF
  chmod 700 "$dir/runtime"
  chown -R nobody:nogroup "$dir"
  ln -sf "$dir/libvirtd.log" "$LOGS/libvirtd.log"
  setpriv --reuid=nobody --regid=nogroup --clear-groups \
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$dir/home" \
      XDG_CONFIG_HOME="$dir/config" XDG_RUNTIME_DIR="$dir/runtime" \
      XDG_CACHE_HOME="$dir/cache" XDG_DATA_HOME="$dir/data" SASL_CONF_PATH="$dir/sasl" \
    libvirtd --listen -f "$dir/libvirtd.conf" >>"$LOGS/libvirtd.out" 2>&1 &
  record libvirtd $!
  wait_for "libvirtd on 127.0.0.1:$port" 30 virsh -c "test+tcp://127.0.0.1:$port/default" version
  put --argjson port "$port" --argjson tls_port "$tls_port" --arg dir "$dir" '.libvirt = {
      host: "127.0.0.1", port: $port, user: "nobody", dir: $dir,
      test_uri: "test+tcp://127.0.0.1:\($port)/default",
      qemu_session_uri: "qemu+tcp://127.0.0.1:\($port)/session",
      tls: { uri: "test+tls://localhost:\($tls_port)/default",
             pki_dir: "\($dir)/pki/client", wrong_ca_pki_dir: "\($dir)/pki/wrongca",
             sasl: { username: "hv-agent", password: "agent-secret" } } }'
}
