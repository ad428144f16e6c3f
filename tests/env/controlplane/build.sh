#!/usr/bin/env bash
# Builds the test ground's Kubernetes control plane from pinned Go modules,
# once, into a cache directory named after the pins; later runs reuse it.
#
#   kubernetes/  kube-apiserver, kube-controller-manager, kube-scheduler and
#                kubectl from one release of k8s.io/kubernetes (its staging modules named at
#                their published versions in go.mod's replace block)
#   etcd/        etcd (go.etcd.io/etcd/server/v3)
#   kwok/        kwok (sigs.k8s.io/kwok), which keeps fake Nodes alive
#
# Each directory is a small wrapper module of ours: go.mod and go.sum pin
# every version; no source is vendored. Progress goes to stderr; the last
# line on stdout is the directory holding the binaries.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
progress() { printf '[control plane] %s\n' "$*" >&2; }

# The release the kubernetes module pins: written into the binaries'
# version, which Helm and kubectl read (a plain `go build` says v0.0.0).
K8S_VERSION=$(awk '($1 == "require" && $2 == "k8s.io/kubernetes") || $1 == "k8s.io/kubernetes" { print ($1 == "require" ? $3 : $2); exit }' "$here/kubernetes/go.mod")
[[ -n "$K8S_VERSION" ]] || { progress "no k8s.io/kubernetes version in $here/kubernetes/go.mod"; exit 1; }
pins=$(cat "$here"/*/go.mod "$here"/*/go.sum "$0" | sha256sum | cut -c1-12)
OUT="${HV_CONTROLPLANE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hv-test-env/controlplane-$K8S_VERSION-$pins}"
BINS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)

complete() { [[ -f "$OUT/.complete" ]] && for b in "${BINS[@]}"; do [[ -x "$OUT/bin/$b" ]] || return 1; done; }
if complete; then
  echo "$OUT/bin"
  exit 0
fi
command -v go >/dev/null || { progress "Go 1.25 or newer is needed to build the control plane: go is not on PATH"; exit 1; }
have=$(go env GOVERSION | sed 's/^go//')
if [[ "$(printf '%s\n1.25\n' "${have%%[-+ ]*}" | sort -V | head -1)" != "1.25" ]]; then
  progress "Go 1.25 or newer is needed to build the control plane (k8s.io/kubernetes $K8S_VERSION); this is go$have"
  exit 1
fi
# One build at a time into the cache (two test runs starting together).
mkdir -p "$(dirname "$OUT")"
exec 9>"$OUT.lock"
flock 9
if complete; then
  echo "$OUT/bin"
  exit 0
fi
mkdir -p "$OUT/bin"
# The versions are the pins: go.sum must already hold every module.
export GOFLAGS=-mod=readonly
minor=$(echo "$K8S_VERSION" | cut -d. -f2)
ver="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1"
ver+=" -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
ver+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1"
ver+=" -X k8s.io/client-go/pkg/version.gitMinor=$minor"
T0=$SECONDS
build() { # DIR PACKAGE OUTPUT [LDFLAGS]
  local t=$SECONDS
  progress "building $3 ($2) ..."
  (cd "$here/$1" && go build -trimpath -ldflags "-s -w ${4:-}" -o "$OUT/bin/$3" "$2")
  progress "built $3 in $((SECONDS - t)) s"
}
build etcd go.etcd.io/etcd/server/v3 etcd
build kwok sigs.k8s.io/kwok/cmd/kwok kwok
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  build kubernetes "k8s.io/kubernetes/cmd/$b" "$b" "$ver"
done
touch "$OUT/.complete"
progress "control plane $K8S_VERSION built in $((SECONDS - T0)) s into $OUT"
echo "$OUT/bin"
