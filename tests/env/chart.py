"""Installs or upgrades the chart (deploy/helm/hv) on the test ground's API
server with real Helm (v4, as a library: the helm-python-sdk wheel).

    chart.py KUBECONFIG NAMESPACE RELEASE VALUES.json [CHART_DIR]

Installs the release when it does not exist, upgrades it otherwise (the
values given replace the release's: nothing is reused), waits for nothing
(no pod of the chart runs on the ground) and prints one line: the release,
its revision and status. A failure prints Helm's error and exits 1.
"""
import json
import os
import sys

import helm_python as helm

HERE = os.path.dirname(os.path.abspath(__file__))
CHART = os.path.join(HERE, "..", "..", "deploy", "helm", "hv")


def main(kubeconfig, namespace, release, values_file, chart_dir=CHART):
    with open(values_file) as f:
        values = json.load(f)
    chart = helm.Chart.load(chart_dir)
    with helm.Config(kubeconfig_path=kubeconfig, namespace=namespace) as cfg:
        installed = any(r["name"] == release for r in cfg.list(all_states=True) or [])
        if installed:
            rel = cfg.upgrade(chart, release, values, namespace=namespace, timeout=60)
        else:
            rel = cfg.install(chart, release, values, namespace=namespace, timeout=60)
    print(f"release {release} in {namespace}: revision {rel.get('version')}, {rel.get('info', {}).get('status')}")


if __name__ == "__main__":
    if len(sys.argv) not in (5, 6):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    try:
        main(*sys.argv[1:])
    except helm.HelmError as e:
        print(f"helm: {e}", file=sys.stderr)
        sys.exit(1)
