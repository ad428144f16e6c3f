"""Lints and renders the chart with real Helm (v4, as a library: the
helm-python-sdk wheel, no helm binary), for `make chart-check`.

- The chart's defaults alone must be refused by values.schema.json, naming
  exactly the values an SRE must set.
- Every ci/*-values.yaml must lint clean (strict: warnings fail) and render;
  the manifests are written to OUT/<case>/ for the Rust check against the
  Kubernetes API types (hv-manifest-check).
- crds/ must be the generated CRDs of deploy/crds/.
"""
import filecmp
import json
import os
import sys

import helm_python as helm

CHART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hv")
REQUIRED = {"/openstack/cloudsSecret", "/openstack/cloud"}


def fail(msg):
    print(f"chart-check: {msg}", file=sys.stderr)
    sys.exit(1)


def problems(report):
    """Lint messages at warning level or worse (1 is info)."""
    return [m for m in report["messages"] if m["severity"] >= 2]


def objects(rendered):
    for path, text in rendered.items():
        if not path.endswith(".yaml"):
            continue
        for doc in text.split("\n---"):
            obj = helm.values_from_yaml(doc) if doc.strip() else None
            if obj:
                yield obj


def pod_namespaces(values):
    """The namespaces the values name for protected and dependent pods, with
    the release's (hv-system here); with the drain guards alone (on unless
    turned off), the release's; else none."""
    coordinator = values.get("coordinator", {})
    drain = coordinator.get("drainProtection", {})
    guard = coordinator.get("drainGuard", {})
    guards = {guard.get("namespace") or "hv-system"} if guard.get("enabled", True) else set()
    if not drain.get("enabled"):
        return guards
    named = drain.get("protectedPods", []) + drain.get("dependentPods", [])
    return {"hv-system"} | {p["namespace"] for p in named} | guards


def policy(case, rendered, values):
    """What the chart promises an SRE, on every rendering."""
    by_kind = {}
    for o in objects(rendered):
        by_kind.setdefault(o["kind"], []).append(o)
    agent = by_kind["DaemonSet"][0]["spec"]["template"]["spec"]
    coord = by_kind["StatefulSet"][0]["spec"]["template"]["spec"]
    a, c = agent["containers"][0], coord["containers"][0]
    checks = {
        # Liveness never depends on libvirt, OVSDB, Ceph, Nova or the lease.
        "agent liveness is /livez": a["livenessProbe"]["httpGet"]["path"] == "/livez",
        "coordinator liveness is /healthz": c["livenessProbe"]["httpGet"]["path"] == "/healthz",
        "readiness is /readyz": c["readinessProbe"]["httpGet"]["path"] == "/readyz",
        "the Service selects the leader's label": "--label-leader-pod" in c["args"]
        and any(
            s["spec"]["selector"].get("hypervisor.cloud.sap/leader") == "true"
            and any(p["name"] == "grpc" for p in s["spec"]["ports"])
            for s in by_kind["Service"]
        ),
        # Every replica is Ready, so a budget of one lets a drain take the leader.
        "a budget lets one replica go": [
            (b["spec"].get("maxUnavailable"), b["spec"].get("unhealthyPodEvictionPolicy"))
            for b in by_kind.get("PodDisruptionBudget", [])
            if not b["metadata"]["name"].startswith("hv-coordinator-protect-")
        ]
        == [(1, "AlwaysAllow")],
        # The eviction webhook's backstop: a budget per protected set, released
        # only by the coordinator's label; the webhook with the leader's Service.
        "protected pods held until labelled evictable": all(
            b["spec"]["maxUnavailable"] == 0
            and {"key": "hypervisor.cloud.sap/evictable", "operator": "NotIn", "values": ["true"]}
            in b["spec"]["selector"]["matchExpressions"]
            for b in by_kind.get("PodDisruptionBudget", [])
            if b["metadata"]["name"].startswith("hv-coordinator-protect-")
        )
        and bool([b for b in by_kind.get("PodDisruptionBudget", []) if b["metadata"]["name"].startswith("hv-coordinator-protect-") and b["metadata"]["name"] != "hv-coordinator-protect-guards"])
        == bool(by_kind.get("ValidatingWebhookConfiguration"))
        # The drain guards' budget, and their image, with the guards only.
        and any(b["metadata"]["name"] == "hv-coordinator-protect-guards" for b in by_kind.get("PodDisruptionBudget", []))
        == any(x.startswith("--drain-guard-image=") for x in c["args"])
        and all(
            w["failurePolicy"] == "Ignore"
            and w["sideEffects"] == "NoneOnDryRun"
            and w["clientConfig"]["service"]["name"] == "hv-coordinator"
            and any(f"--webhook-listen=0.0.0.0:{w['clientConfig']['service']['port']}" == x for x in c["args"])
            for o in by_kind.get("ValidatingWebhookConfiguration", [])
            for w in o["webhooks"]
        )
        and (not by_kind.get("ValidatingWebhookConfiguration")) == (not any(x.startswith("--webhook-listen") for x in c["args"])),
        "the agent has no API token": agent.get("automountServiceAccountToken") is False,
        "host mounts are read-only": all(m.get("readOnly") for m in a["volumeMounts"] if m["name"] != "tmp"),
        "SASL mechanisms in the agent image": "libsasl2-modules" in open(os.path.join(CHART, "..", "..", "images", "Containerfile.agent")).read(),
        "no privilege": all(
            x["securityContext"]["allowPrivilegeEscalation"] is False
            and x["securityContext"]["capabilities"]["drop"] == ["ALL"]
            for x in (a, c)
        ),
        "TLS flags on both sides": "--tls-cert=/etc/hv-agent/tls/tls.crt" in a["args"]
        and "--client-ca=/etc/hv/tls/ca.crt" in c["args"]
        and not any(x.startswith("--insecure") for x in a["args"] + c["args"]),
        "limits set": all("limits" in x["resources"] and "requests" in x["resources"] for x in (a, c)),
        "coordinator rolled one pod at a time": by_kind["StatefulSet"][0]["spec"]["updateStrategy"]
        == {"type": "RollingUpdate"},
        # The agents share the namespace: there, without the eviction webhook,
        # pods are labelled by name, the coordinator's only.
        "the leader label only on the coordinator's own pods": [
            r.get("resourceNames")
            for o in by_kind["Role"]
            for r in o["rules"]
            if "pods" in r["resources"] and not o["metadata"]["name"].endswith("-pods")
        ]
        == [
            [f'{by_kind["StatefulSet"][0]["metadata"]["name"]}-{i}' for i in range(by_kind["StatefulSet"][0]["spec"]["replicas"])]
        ],
        # A pod patch can change its image: no right on pods cluster-wide, and
        # with the eviction webhook a Role in each namespace of the protected
        # and dependent pods (and the release's, for the agent's), no other;
        # the coordinator told the same namespaces.
        "no patch pods outside the named namespaces": not any(
            "pods" in r["resources"] for o in by_kind.get("ClusterRole", []) for r in o["rules"]
        )
        and {
            o["metadata"]["namespace"]
            for o in by_kind["Role"]
            for r in o["rules"]
            if "pods" in r["resources"] and "patch" in r["verbs"] and not r.get("resourceNames")
        }
        == pod_namespaces(values)
        == {x.removeprefix("--pod-namespace=") for x in c["args"] if x.startswith("--pod-namespace=")},
        "the agent runs where the coordinator looks": bool(agent["nodeSelector"]),
        # Fencing's limits reach the coordinator, and its Ceph identity only with its keyring.
        "fencing flags": all(any(x.startswith(f) for x in c["args"]) for f in ("--fence-fresh-heartbeat=", "--fence-max-domain-share="))
        and (not any(x.startswith("--ceph-fence-id=") for x in c["args"])
             or any(m["mountPath"] == "/etc/hv/ceph" for m in c["volumeMounts"])),
        # The dashboard, when shipped, is a Grafana dashboard whose every
        # panel queries something (the names are checked against the
        # coordinator's exposition by its unit tests).
        "the dashboard is whole": all(
            (d := json.loads(m["data"]["hv-fleet.json"]))["uid"] == "hv-fleet"
            and d["panels"]
            and all(t["expr"] for p in d["panels"] for t in p["targets"])
            for m in by_kind.get("ConfigMap", [])
            if m["metadata"]["name"].endswith("-dashboard")
        ),
        "no wildcard in RBAC": not any(
            "*" in str(r) for kind in ("ClusterRole", "Role") for o in by_kind.get(kind, []) for r in o.get("rules") or []
        ),
    }
    broken = [k for k, ok in checks.items() if not ok]
    if broken:
        fail(f"{case}: {broken}")


def main(out):
    # The defaults alone: refused by the schema, for the required values only.
    report = helm.lint(CHART, strict=True)
    named = {p for m in problems(report) for p in REQUIRED if f"'{p}'" in m["error"]}
    if named != REQUIRED:
        fail(f"the defaults should be refused for {sorted(REQUIRED)}; lint said {report['messages']}")
    others = [m for m in problems(report) if not any(f"'{p}'" in m["error"] for p in REQUIRED)]
    if others:
        fail(f"the defaults have other problems: {others}")
    print(f"defaults refused by the schema, naming {', '.join(sorted(REQUIRED))}")

    chart = helm.Chart.load(CHART)
    cases = sorted(f for f in os.listdir(os.path.join(CHART, "ci")) if f.endswith("-values.yaml"))
    if not cases:
        fail("no ci/*-values.yaml")
    for case in cases:
        with open(os.path.join(CHART, "ci", case)) as f:
            values = helm.values_from_yaml(f.read())
        report = helm.lint(CHART, values, strict=True)
        if problems(report) or report["errors"]:
            fail(f"{case}: {report['messages']} {report['errors']}")
        rendered = chart.render(values, name="hv", namespace="hv-system", is_install=True)
        dest = os.path.join(out, case.removesuffix("-values.yaml"))
        os.makedirs(dest, exist_ok=True)
        n = 0
        for path, text in sorted(rendered.items()):
            if not path.endswith(".yaml") or not text.strip():
                continue
            with open(os.path.join(dest, os.path.basename(path)), "w") as f:
                f.write(text)
            n += 1
        policy(case, rendered, values)
        print(f"{case}: lint clean, {n} templates rendered into {dest}, policies hold")

    generated = os.path.join(CHART, "..", "..", "crds")
    cmp = filecmp.dircmp(generated, os.path.join(CHART, "crds"))
    if cmp.left_only or cmp.right_only or cmp.diff_files:
        fail(f"crds/ differs from deploy/crds/ (run make crds): {cmp.left_only} {cmp.right_only} {cmp.diff_files}")
    print(f"crds/ matches deploy/crds/ ({len(cmp.same_files)} CRDs)")


if __name__ == "__main__":
    main(sys.argv[1])
