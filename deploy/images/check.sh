#!/usr/bin/env bash
# make images-check: no container engine runs on the test machines, so the
# images are not built here. What can be checked is checked: the Debian
# packages each Containerfile installs in its runtime stage are exactly those
# that provide the shared libraries its binaries link (readelf NEEDED of the
# binaries `make test` built), beyond the base image's libc6 and libgcc-s1;
# a package that provides no library must be named in ALLOWED below.
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE=(libc6 libgcc-s1)
# Packages that provide no linked library but are needed all the same: CA roots, SASL plugins.
ALLOWED=(ca-certificates libsasl2-modules)
status=0
check() { # CONTAINERFILE BINARY...
  local file=$1; shift
  local listed needed=() lib pkg
  # The runtime stage's install line, its continuation lines joined.
  listed=$(sed -n '/^FROM .*bookworm-slim/,$p' "$file" | sed -e ':a' -e '/\\$/N; s/\\\n//; ta' \
    | grep -o 'no-install-recommends [^&]*' | cut -d' ' -f2- | tr ' ' '\n' | grep -v '^$' | sort -u)
  for bin in "$@"; do
    [[ -x "target/debug/$bin" ]] || { echo "images-check: target/debug/$bin missing (run make build)" >&2; return 1; }
    for lib in $(readelf -d "target/debug/$bin" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'); do
      # The package whose files include .../$lib (dpkg knows /lib and /usr/lib apart).
      pkg=$(dpkg -S "*/$lib" 2>/dev/null | awk -F': ' -v l="/$lib" 'substr($2, length($2) - length(l) + 1) == l {print $1; exit}' | cut -d: -f1 || true)
      [[ -n "$pkg" ]] || { echo "images-check: no package provides $lib ($bin)" >&2; status=1; continue; }
      needed+=("$pkg")
    done
  done
  local want
  want=$(printf '%s\n' "${needed[@]}" | grep -vxF -f <(printf '%s\n' "${BASE[@]}") | sort -u || true)
  local extra missing
  missing=$(comm -23 <(echo "$want") <(echo "$listed") | grep -v '^$' || true)
  extra=$(comm -13 <(echo "$want") <(echo "$listed") | grep -vxF -f <(printf '%s\n' "${ALLOWED[@]}") | grep -v '^$' || true)
  if [[ -n "$missing$extra" ]]; then
    echo "images-check: $file: missing [${missing//$'\n'/ }], not needed [${extra//$'\n'/ }]" >&2
    status=1
  else
    echo "$file: runtime packages [${listed//$'\n'/ }] match what $* link"
  fi
}
check deploy/images/Containerfile.coordinator hv-coordinator hvctl hv-ceph-fence
check deploy/images/Containerfile.agent hv-agent hv-ceph-probe
exit $status
