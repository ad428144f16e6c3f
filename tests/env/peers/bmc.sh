# A Redfish BMC for every fake compute host: sushy-tools' emulator (the one
# OpenStack tests its own bare-metal code against) with its fake driver,
# which applies a power change up to 11 seconds after it is asked, as real BMCs take
# their time. HTTPS with a certificate from the ground's own CA, HTTP basic
# authentication (bcrypt htpasswd, as the emulator requires). Each system is
# named after its host, powered on; its URL is by UUID, as a site's
# inventory gives it.
start_bmc() {
  local dir="$HV_ENV_DIR/bmc" port hosts
  [[ -x "$SUSHY_VENV/bin/sushy-emulator" ]] || die "no Redfish emulator in $SUSHY_VENV (run tests/env/install.sh)"
  port=$(free_port)
  mkdir -p "$dir/state"
  source "$(dirname "${BASH_SOURCE[0]}")/../pki.sh"
  make_pki "$dir/pki"
  hosts=$(jq -c '.nova.hosts' "$ENV_FILE.partial")
  "$SUSHY_VENV/bin/python" - "$dir" "$port" "$hosts" <<'PY'
import json, sys, uuid, bcrypt
d, port, hosts = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
systems = [{"uuid": str(uuid.uuid5(uuid.NAMESPACE_DNS, h + ".bmc.hv-test")), "name": h,
            "power_state": "On", "nics": []} for h in hosts]
with open(f"{d}/htpasswd", "w") as f:
    f.write("fence:" + bcrypt.hashpw(b"fence-secret", bcrypt.gensalt()).decode() + "\n")
with open(f"{d}/emulator.conf", "w") as f:
    f.write(f"""SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'
SUSHY_EMULATOR_LISTEN_PORT = {port}
SUSHY_EMULATOR_SSL_CERT = '{d}/pki/server/servercert.pem'
SUSHY_EMULATOR_SSL_KEY = '{d}/pki/server/serverkey.pem'
SUSHY_EMULATOR_AUTH_FILE = '{d}/htpasswd'
SUSHY_EMULATOR_FAKE_DRIVER = True
SUSHY_EMULATOR_FAKE_SYSTEMS = {systems!r}
SUSHY_EMULATOR_STATE_DIR = '{d}/state'
""")
with open(f"{d}/systems.json", "w") as f:
    json.dump({s["name"]: f"/redfish/v1/Systems/{s['uuid']}" for s in systems}, f)
PY
  "$SUSHY_VENV/bin/sushy-emulator" --config "$dir/emulator.conf" >>"$LOGS/bmc.log" 2>&1 &
  record bmc $!
  wait_for "the Redfish emulator on port $port" 30 \
    curl -sf --max-time 5 --cacert "$dir/pki/ca/cacert.pem" -u fence:fence-secret "https://127.0.0.1:$port/redfish/v1/Systems"
  put --arg url "https://127.0.0.1:$port" --arg ca "$dir/pki/ca/cacert.pem" --slurpfile systems "$dir/systems.json" '.bmc = {
      url: $url, ca_file: $ca, username: "fence", password: "fence-secret", systems: $systems[0] }'
}
