# libvirtd, as the unprivileged user `nobody` in session mode, with every
# XDG directory inside its own directory: hermetic, no system state. It
# listens twice on 127.0.0.1:
#   TCP without authentication: test+tcp://…/default (the test driver:
#     inventory and events) and qemu+tcp://…/session (QEMU under TCG: real
#     domains), for most tests;
#   TLS with SASL (SCRAM-SHA-256) on top: test+tls://localhost:…/default,
#     what a site runs; client certificates in tls.pki_dir (and one from
#     another CA in tls.wrong_ca_pki_dir), SASL user and password in tls.sasl.
# Beside it, one libvirtd per fake Nova host (start_host_libvirts): the
# host's machine, in a UTS namespace of its own whose host name is the
# host's, so libvirt there calls itself what Nova's record of the host says;
# libvirt.hosts and libvirt.tls.hosts map each host to its test-driver URIs.
# libvirtd_conf DIR PKI PORT TLS_PORT: DIR/libvirtd.conf for a libvirtd on
# 127.0.0.1: TCP without authentication on PORT, TLS (the server
# certificate in PKI) with SASL on TLS_PORT; its socket and log in DIR.
libvirtd_conf() {
  local dir=$1 pki=$2 port=$3 tls_port=$4
  cat > "$dir/libvirtd.conf" <<CONF
listen_tls = 1
listen_tcp = 1
tcp_port = "$port"
tls_port = "$tls_port"
listen_addr = "127.0.0.1"
auth_tcp = "none"
auth_tls = "sasl"
key_file = "$pki/serverkey.pem"
cert_file = "$pki/servercert.pem"
ca_file = "$pki/cacert.pem"
unix_sock_dir = "$dir/runtime"
log_outputs = "3:file:$dir/libvirtd.log"
CONF
}

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
  # The same user in each fake host's realm: SASL's default realm is the
  # host name, and each host's libvirtd has its own (start_host_libvirts).
  local h
  for h in "${FAKE_HOSTS[@]}"; do
    printf '%s' agent-secret | saslpasswd2 -p -a libvirt -u "$h" -f "$dir/sasl/passwd.db" hv-agent
  done
  libvirtd_conf "$dir" "$dir/pki/server" "$port" "$tls_port"
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
  start_host_libvirts "$dir"
}

# start_host_libvirts DIR: a libvirtd per fake host, on 127.0.0.1 as the
# shared one (TCP, and TLS with SASL from the shared one's PKI and sasldb
# in DIR), each in its own UTS namespace named after its host. The test
# driver's state lives as long as a connection holds it: the Nova region
# holds one to each (nova_region.py) and runs there a domain for each
# server its fake driver runs on the host.
start_host_libvirts() {
  local shared=$1 h d port tls_port hosts='{}' tls_hosts='{}'
  for h in "${FAKE_HOSTS[@]}"; do
    d="$shared/hosts/$h"
    port=$(free_port)
    tls_port=$(free_port)
    mkdir -p "$d"/{config,runtime,cache,data,home}
    libvirtd_conf "$d" "$shared/pki/server" "$port" "$tls_port"
    chmod 700 "$d/runtime"
    chown -R nobody:nogroup "$d"
    # unshare, sh, setpriv and env each exec the next: the pid recorded is
    # libvirtd's.
    unshare --uts sh -c 'hostname "$1" && shift && exec "$@"' sh "$h" \
      setpriv --reuid=nobody --regid=nogroup --clear-groups \
      env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$d/home" \
        XDG_CONFIG_HOME="$d/config" XDG_RUNTIME_DIR="$d/runtime" \
        XDG_CACHE_HOME="$d/cache" XDG_DATA_HOME="$d/data" SASL_CONF_PATH="$shared/sasl" \
      libvirtd --listen -f "$d/libvirtd.conf" >>"$LOGS/libvirtd-$h.out" 2>&1 &
    record "libvirtd-$h" $!
    hosts=$(jq -c --arg h "$h" --arg uri "test+tcp://127.0.0.1:$port/default" '.[$h] = $uri' <<<"$hosts")
    tls_hosts=$(jq -c --arg h "$h" --arg uri "test+tls://localhost:$tls_port/default" '.[$h] = $uri' <<<"$tls_hosts")
  done
  local uri
  for h in "${FAKE_HOSTS[@]}"; do
    uri=$(jq -r --arg h "$h" '.[$h]' <<<"$hosts")
    # Up, and calling itself by its host's name.
    wait_for "libvirtd of $h" 30 bash -c '[[ $(virsh -q -c "$1" hostname) == "$2" ]]' _ "$uri" "$h"
  done
  put --argjson hosts "$hosts" --argjson tls_hosts "$tls_hosts" '.libvirt.hosts = $hosts | .libvirt.tls.hosts = $tls_hosts'
}
