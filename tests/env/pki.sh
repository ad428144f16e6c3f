# Test certificates, made with openssl. Sourced, not run.
#
# make_pki DIR writes:
#   DIR/server/{cacert,servercert,serverkey}.pem   libvirtd's, for localhost and 127.0.0.1
#   DIR/client/{cacert,clientcert,clientkey}.pem   an agent's, from the same CA
#   DIR/wrongca/{cacert,clientcert,clientkey}.pem  a client certificate from another CA
# (libvirt's file names, so each client directory is a `pkipath`).
make_pki() {
  local d=$1
  mkdir -p "$d/ca" "$d/otherca" "$d/server" "$d/client" "$d/wrongca"
  _ca() { # NAME DIR
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=$1" \
      -keyout "$2/cakey.pem" -out "$2/cacert.pem" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
  }
  _leaf() { # CADIR CN EXTENDED_KEY_USAGE SUBJECT_ALT_NAME KEY CERT
    local ext; ext=$(mktemp)
    printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=%s\n' "$3" > "$ext"
    if [[ -n "$4" ]]; then echo "subjectAltName=$4" >> "$ext"; fi
    openssl req -newkey rsa:2048 -nodes -subj "/CN=$2" -keyout "$5" -out "$5.csr" 2>/dev/null
    openssl x509 -req -in "$5.csr" -CA "$1/cacert.pem" -CAkey "$1/cakey.pem" -CAcreateserial \
      -days 3650 -extfile "$ext" -out "$6" 2>/dev/null
    rm -f "$ext" "$5.csr"
  }
  _ca hv-test-ca "$d/ca"
  _ca hv-other-ca "$d/otherca"
  _leaf "$d/ca" localhost serverAuth "DNS:localhost,IP:127.0.0.1" "$d/server/serverkey.pem" "$d/server/servercert.pem"
  _leaf "$d/ca" hv-agent clientAuth "" "$d/client/clientkey.pem" "$d/client/clientcert.pem"
  _leaf "$d/otherca" hv-agent clientAuth "" "$d/wrongca/clientkey.pem" "$d/wrongca/clientcert.pem"
  for sub in server client wrongca; do cp "$d/ca/cacert.pem" "$d/$sub/cacert.pem"; done
}
