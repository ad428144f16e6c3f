#!/usr/bin/env bash
# make chart-check: real Helm (the helm-python-sdk wheel, in a venv of its
# own) lints and renders deploy/helm/hv; every rendered object is then
# checked against the Kubernetes API types (hv-manifest-check).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/env/lib.sh
ensure_helm_venv
VENV="$HELM_VENV"
OUT="target/chart"
rm -rf "$OUT"
"$VENV/bin/python" deploy/helm/check.py "$OUT"
cargo run -q -p hv-tests --bin hv-manifest-check -- "$OUT"
