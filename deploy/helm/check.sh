#!/usr/bin/env bash
# make chart-check: real Helm (the helm-python-sdk wheel, in a venv of its
# own) lints and renders deploy/helm/hv; every rendered object is then
# checked against the Kubernetes API types (hv-manifest-check).
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/hv-test-env/helm-venv-0.2.2"
if [[ ! -x "$VENV/bin/python" || ! -f "$VENV/.complete" ]]; then
  echo "[chart-check] creating $VENV with helm-python-sdk" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "helm-python-sdk==0.2.2"
  touch "$VENV/.complete"
fi
OUT="target/chart"
rm -rf "$OUT"
"$VENV/bin/python" deploy/helm/check.py "$OUT"
cargo run -q -p hv-tests --bin hv-manifest-check -- "$OUT"
