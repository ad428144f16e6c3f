"""Lints and renders the chart with real Helm (v4, as a library: the
helm-python-sdk wheel, no helm binary), for `make chart-check`.

- The chart's defaults alone must be refused by values.schema.json, naming
  exactly the values an SRE must set; so must alerts without a runbook base.
- Every ci/*-values.yaml must lint clean (strict: warnings fail) and render;
  the manifests are written to OUT/<case>/ for the Rust check against the
  Kubernetes API types (hv-manifest-check). So must the chart as a subchart
  of a parent that passes `global` values (OUT/subchart/).
- What each rendering promises an SRE (`policy`): among it, every value
  reaches its coordinator flag (VALUE_FLAGS), Secrets are readable by name
  only, the CRDs are the generated ones, kept on uninstall, every alert has
  its summary, description and runbook, and `helm test` checks the install.
- Every coordinator flag is a value, set by the chart, or said not to be
  one (NOT_VALUES); each value's default is its flag's default.
- files/crds/ must be the generated CRDs of deploy/crds/.
- Every alert's runbook anchor is a heading of docs/operations.md's Alerts.
"""
import copy
import filecmp
import glob
import json
import os
import re
import shutil
import sys
import tempfile

import helm_python as helm

CHART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hv")
REPO = os.path.join(CHART, "..", "..", "..")
REQUIRED = {"/openstack/cloudsSecret", "/openstack/cloud"}
NAMESPACE = "hv-system"

# Each value and the coordinator flag it sets: "value" (--flag=VALUE always),
# "optional" (absent when empty), "switch" (bare, when true), "list" (one
# --flag=ITEM each), "pods" (one --flag=NAMESPACE/SELECTOR per {namespace,
# selector}), "joined" (--flag=A,B when not empty), "identity"
# (--flag=VALUE with agent.identity.from coordinator, absent otherwise). Its default in
# values.yaml must be the flag's default in coordinator/src/config.
VALUE_FLAGS = [
    ("trustDomain", "--trust-domain", "value"),
    ("openstack.cloud", "--os-cloud", "value"),
    ("coordinator.mode", "--mode", "value"),
    ("coordinator.hypervisorSelector", "--node-selector", "value"),
    ("coordinator.aggregates", "--aggregate", "list"),
    ("coordinator.customTraits", "--custom-trait", "list"),
    ("coordinator.cephPools", "--ceph-pool", "list"),
    ("coordinator.novaHostStripSuffixes", "--nova-host-strip-suffix", "list"),
    ("coordinator.defaultMigrationPolicy", "--default-migration-policy", "value"),
    ("coordinator.clusterMaxMigrations", "--cluster-max-migrations", "value"),
    ("coordinator.clusterMaxEvacuations", "--cluster-max-evacuations", "value"),
    ("coordinator.driftInterval", "--drift-interval", "value"),
    ("coordinator.novaViewMaxAge", "--nova-view-max-age", "optional"),
    ("coordinator.openstackMaxInFlight", "--openstack-max-in-flight", "value"),
    ("coordinator.openstackTimeout", "--openstack-timeout", "value"),
    ("coordinator.kubeMaxInFlightWrites", "--kube-max-in-flight-writes", "value"),
    ("coordinator.reconcileConcurrency", "--reconcile-concurrency", "value"),
    ("coordinator.cordonStartsMaintenance", "--cordon-starts-maintenance", "switch"),
    ("coordinator.updateSignals", "--update-signal", "list"),
    ("coordinator.updateMaxHeld", "--update-max-held", "value"),
    ("coordinator.registrationTimeout", "--registration-timeout", "value"),
    ("coordinator.checksTimeout", "--checks-timeout", "value"),
    ("coordinator.busyInterval", "--busy-interval", "value"),
    ("coordinator.skipTests", "--skip-tests", "switch"),
    ("coordinator.nodeDependencies", "--node-dependency", "pods"),
    ("coordinator.hibernationPolicies", "--hibernation-policy", "list"),
    ("coordinator.hibernationInterval", "--hibernation-interval", "value"),
    ("coordinator.maxConnections", "--max-connections", "value"),
    ("coordinator.agentHeartbeat", "--agent-heartbeat", "value"),
    ("coordinator.kubeTimeout", "--kube-timeout", "value"),
    ("coordinator.connectTimeout", "--connect-timeout", "value"),
    ("coordinator.leaderElection.leaseDuration", "--lease-duration", "value"),
    ("coordinator.leaderElection.renewDeadline", "--lease-renew-deadline", "value"),
    ("coordinator.leaderElection.retryPeriod", "--lease-retry", "value"),
    ("coordinator.health.nodeNotReadyGrace", "--node-not-ready-grace", "value"),
    ("coordinator.health.settle", "--health-settle", "value"),
    ("coordinator.health.unreachableGrace", "--unreachable-grace", "value"),
    ("coordinator.health.haMaintenanceLimit", "--ha-maintenance-limit", "value"),
    ("coordinator.health.unseenMaxShare", "--unseen-max-share", "value"),
    ("coordinator.fencing.freshHeartbeat", "--fence-fresh-heartbeat", "value"),
    ("coordinator.fencing.maxDomainShare", "--fence-max-domain-share", "value"),
    ("coordinator.fencing.maxFleetShare", "--fence-max-fleet-share", "value"),
    ("coordinator.fencing.domainLabel", "--fence-domain-label", "optional"),
    ("coordinator.fencing.maxDomains", "--fence-max-domains", "value"),
    ("coordinator.fencing.powerTimeout", "--fence-power-timeout", "value"),
    ("coordinator.fencing.evacuateByDefault", "--evacuate-by-default", "value"),
    ("coordinator.fencing.evacuateRebuildFromImage", "--evacuate-rebuild-from-image", "switch"),
    ("coordinator.fencing.ceph.id", "--ceph-fence-id", "optional"),
    ("coordinator.fencing.ceph.clientNetworks", "--ceph-client-networks", "joined"),
    ("coordinator.identity.certificateLife", "--agent-certificate-life", "identity"),
]
# Flags the chart sets from what it knows (its paths, ports, names, the
# drain protection's selectors), not one value each.
CHART_SET = {
    "--listen", "--metrics-listen", "--tls-cert", "--tls-key", "--client-ca", "--clouds-yaml",
    "--lease-name", "--label-leader-pod", "--log-json", "--node-lock", "--webhook-listen",
    "--webhook-tls-cert", "--webhook-tls-key", "--protected-pods", "--dependent-pods",
    "--pod-namespace", "--drain-guard-image", "--drain-guard-namespace",
    "--drain-guard-pull-secret", "--ceph-fence-conf", "--ceph-fence-keyring",
    "--identity-listen", "--agent-signer-cert", "--agent-signer-key", "--agent-service-account",
    "--agent-daemonset", "--agent-token-audience", "--publish-server-ca", "--publish-server-ca-configmap",
}
# Flags that are no value, and why.
NOT_VALUES = {
    "--insecure": "the chart always serves mutual TLS",
    "--identity": "the pod's name (POD_NAME)",
    "--namespace": "the pod's namespace (POD_NAMESPACE)",
    "--agent-token-max-life": "the chart's projected tokens live 10 minutes, well within the default",
    "--accept-host-certificates": "for a move from host directories: given through extraArgs for that while",
}


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


def merged(base, over):
    """Helm's coalescing of values: maps merged key by key, the rest replaced."""
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def at(values, path):
    for key in path.split("."):
        values = values.get(key) if isinstance(values, dict) else None
    return values


def chart_yaml():
    with open(os.path.join(CHART, "Chart.yaml")) as f:
        return helm.values_from_yaml(f.read())


def defaults():
    with open(os.path.join(CHART, "values.yaml")) as f:
        return helm.values_from_yaml(f.read())


def fullname(v, release="hv"):
    return v.get("fullnameOverride") or release


def image(v, which):
    """The image reference the chart should write for images.<which>."""
    img = v["images"][which]
    registry = img.get("registry") or v["images"].get("registry") or (v.get("global") or {}).get("imageRegistry")
    repo = f"{registry.rstrip('/')}/{img['repository']}" if registry else img["repository"]
    if img.get("digest"):
        return f"{repo}@{img['digest']}"
    return f"{repo}:{img.get('tag') or chart_yaml()['appVersion']}"


def secret_readers(objs, bmc_namespaces=()):
    """Rules of Roles and ClusterRoles that may read a Secret not named:
    get, list or watch on secrets without resourceNames, outside a
    namespace set aside for BMC credentials."""
    out = []
    for o in objs:
        if o.get("kind") not in ("Role", "ClusterRole"):
            continue
        if o["kind"] == "Role" and o["metadata"].get("namespace") in bmc_namespaces:
            continue
        for r in o.get("rules") or []:
            reads = {"get", "list", "watch", "*"} & set(r.get("verbs", []))
            on_secrets = {"secrets", "*"} & set(r.get("resources", []))
            if reads and on_secrets and "" in r.get("apiGroups", [""]) and not r.get("resourceNames"):
                out.append(f"{o['kind']} {o['metadata'].get('namespace', '')}/{o['metadata']['name']}: {r}")
    return out


def flag_args(args, flag):
    """The values given to --flag=VALUE in args, and whether it stands bare."""
    given = [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]
    return given, flag in args


def as_arg(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def flags_reach_the_coordinator(args, v):
    """Every VALUE_FLAGS value in the coordinator's args, as its kind says;
    no flag twice but the repeatable ones."""
    wrong = []
    for path, flag, kind in VALUE_FLAGS:
        value = at(v, path)
        given, bare = flag_args(args, flag)
        extra = [a.split("=", 1)[1] for a in v["coordinator"].get("extraArgs", []) if a.startswith(flag + "=")]
        if kind in ("list", "pods"):
            given = given[: len(given) - len(extra)] if extra else given
        if kind == "value":
            ok = given == [as_arg(value)] and not bare
        elif kind == "optional":
            ok = given == ([as_arg(value)] if value else []) and not bare
        elif kind == "switch":
            ok = bare == bool(value) and not given
        elif kind == "identity":
            on = v["agent"]["identity"]["from"] == "coordinator"
            ok = given == ([as_arg(value)] if on else []) and not bare
        elif kind == "list":
            ok = given == [as_arg(x) for x in value]
        elif kind == "pods":
            ok = given == [f"{x['namespace']}/{x['selector']}" for x in value]
        else:
            ok = given == ([",".join(value)] if value else [])
        if not ok:
            wrong.append(f"{path} -> {flag}: {value!r} but args say {given} {'(bare)' if bare else ''}")
    repeatable = {f for _, f, k in VALUE_FLAGS if k in ("list", "pods")} | {
        "--node-lock", "--protected-pods", "--dependent-pods", "--pod-namespace", "--drain-guard-pull-secret",
    }
    names = [a.split("=", 1)[0] for a in args if a.startswith("--")]
    wrong += [f"{n} given twice" for n in sorted(set(names)) if names.count(n) > 1 and n not in repeatable]
    return wrong


def crds_as_generated(crds):
    """The rendered CRDs are deploy/crds/, with the chart's labels and the
    keep policy added."""
    generated = {}
    for path in glob.glob(os.path.join(REPO, "deploy", "crds", "*.yaml")):
        with open(path) as f:
            g = helm.values_from_yaml(f.read())
        generated[g["metadata"]["name"]] = g
    rendered = {}
    for c in crds:
        meta = c["metadata"]
        if meta.get("annotations", {}).get("helm.sh/resource-policy") != "keep":
            return False
        bare = copy.deepcopy(c)
        bare["metadata"] = {k: x for k, x in meta.items() if k not in ("labels", "annotations")}
        rendered[meta["name"]] = bare
    return rendered == generated and len(generated) >= 3


def the_test_pod(by_kind, v, sts, coordinator_name):
    """`helm test`: a test hook that reads every replica's metrics through the
    headless Service and connects to the leader's Service, and with a client
    certificate watches the fleet through it over mutual TLS."""
    pods = [p for p in by_kind.get("Pod", []) if p["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    if len(pods) != 1:
        return False
    pod = pods[0]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    leader = containers.get("leader")
    env = {e["name"]: e.get("value") for e in (leader or {}).get("env", [])}
    services = {s["metadata"]["name"]: s for s in by_kind["Service"]}
    metrics = services.get(f"{coordinator_name}-metrics", {}).get("spec", {})
    grpc = [p["port"] for p in services.get(coordinator_name, {}).get("spec", {}).get("ports", []) if p["name"] == "grpc"]
    ok = (
        pod["restartPolicy"] == "Never"
        and pod.get("automountServiceAccountToken") is False
        and leader is not None
        and leader["image"] == image(v, "coordinator")
        and "hv_coordinator_leader 1" in leader["args"][0]
        and "/dev/tcp/" in leader["args"][0]
        and "getent ahostsv4" in leader["args"][0]
        and env.get("REPLICAS") == str(sts["spec"]["replicas"])
        and metrics.get("clusterIP") == "None"
        and env.get("METRICS_SERVICE") == f"{coordinator_name}-metrics"
        and env.get("METRICS_PORT") == str(metrics["ports"][0]["port"])
        and services[coordinator_name]["spec"]["selector"].get("hypervisor.cloud.sap/leader") == "true"
        and env.get("SERVICE") == coordinator_name
        and [env.get("GRPC_PORT")] == [str(p) for p in grpc]
        and env.get("NAMESPACE") == NAMESPACE
        and all(c["securityContext"]["readOnlyRootFilesystem"] for c in pod["containers"])
    )
    client = v["tests"].get("clientTlsSecret") or (f"{fullname(v)}-sre-tls" if v["certManager"]["enabled"] else "")
    fleet = containers.get("fleet")
    if not client:
        return ok and fleet is None
    fenv = {e["name"]: e.get("value") for e in (fleet or {}).get("env", [])}
    return (
        ok
        and fleet is not None
        and "hvctl watch" in fleet["args"][0]
        and fenv.get("HV_COORDINATOR") == f"https://{coordinator_name}.{NAMESPACE}.svc:{grpc[0]}"
        and any(vol.get("secret", {}).get("secretName") == client for vol in pod.get("volumes", []))
    )


def alerts_whole(by_kind, v):
    """Every alert has a summary, a description and its runbook: the base URL
    and the alert's name lowercased (its heading's anchor)."""
    base = v["monitoring"]["runbookBaseUrl"]
    for o in by_kind.get("PrometheusRule", []):
        for g in o["spec"]["groups"]:
            for r in g["rules"]:
                if "alert" not in r:
                    continue
                a = r.get("annotations", {})
                if not (a.get("summary") and len(a.get("description", "")) > 80):
                    return False
                if a.get("runbook_url") != f"{base}#{r['alert'].lower()}":
                    return False
    return True


def monitoring_metadata(by_kind, v):
    """The monitoring objects carry monitoring.labels (kube-prometheus-stack's
    release label, say) and their own, and the annotations likewise."""
    m = v["monitoring"]
    want = {
        "ServiceMonitor": m["serviceMonitor"],
        "PodMonitor": m["serviceMonitor"],
        "PrometheusRule": m["prometheusRule"],
    }
    for kind, own in want.items():
        for o in by_kind.get(kind, []):
            labels = {**(m.get("labels") or {}), **(own.get("labels") or {})}
            annotations = {**(m.get("annotations") or {}), **(own.get("annotations") or {})}
            meta = o["metadata"]
            if not labels.items() <= (meta.get("labels") or {}).items():
                return False
            if annotations != (meta.get("annotations") or {}):
                return False
    return True


def pod_extras(spec, container, component, v, selector):
    """extraEnv, extraVolumes, extraVolumeMounts, podAnnotations, podLabels,
    priorityClassName, affinity and topologySpreadConstraints as given."""
    c = v[component]
    env_names = [e["name"] for e in container.get("env", [])]
    ok = (
        all(e in container.get("env", []) for e in c.get("extraEnv", []))
        and len(env_names) == len(set(env_names))
        and all(x in spec.get("volumes", []) for x in c.get("extraVolumes", []))
        and all(x in container.get("volumeMounts", []) for x in c.get("extraVolumeMounts", []))
        and spec.get("priorityClassName", "") == c.get("priorityClassName", "")
    )
    if c.get("affinity"):
        ok = ok and spec.get("affinity") == c["affinity"]
    elif component == "coordinator":
        # The default: one replica per node where it can.
        terms = (spec.get("affinity") or {}).get("podAntiAffinity", {}).get("preferredDuringSchedulingIgnoredDuringExecution", [])
        ok = ok and [t["podAffinityTerm"]["labelSelector"]["matchLabels"] for t in terms] == [selector]
    else:
        ok = ok and "affinity" not in spec
    if component == "coordinator":
        want = [{"labelSelector": {"matchLabels": selector}, **t} for t in c.get("topologySpreadConstraints", [])]
        ok = ok and spec.get("topologySpreadConstraints", []) == want
    return ok


def pod_metadata(template, component, v, selector):
    meta = template["metadata"]
    labels = meta["labels"]
    own = {k: x for k, x in v[component]["podLabels"].items() if k not in selector}
    return (
        own.items() <= labels.items()
        and selector.items() <= labels.items()
        and meta.get("annotations", {}) == v[component]["podAnnotations"]
    )


def service_accounts(by_kind, v, coord, agent):
    """The ServiceAccounts the values ask for, their annotations, and every
    binding of the coordinator's rights to its account."""
    fn = fullname(v)
    sa = {c: v[c]["serviceAccount"] for c in ("coordinator", "agent")}
    names = {
        "coordinator": sa["coordinator"]["name"] or f"{fn}-coordinator",
        "agent": sa["agent"]["name"] or (f"{fn}-agent" if sa["agent"]["create"] else "default"),
    }
    made = {o["metadata"]["name"]: o for o in by_kind.get("ServiceAccount", [])}
    for c in ("coordinator", "agent"):
        if sa[c]["create"] != (names[c] in made):
            return False
        if sa[c]["create"] and (made[names[c]]["metadata"].get("annotations") or {}) != sa[c]["annotations"]:
            return False
    subjects = [
        s["name"]
        for kind in ("RoleBinding", "ClusterRoleBinding")
        for o in by_kind.get(kind, [])
        for s in o["subjects"]
    ] + [
        r["subjects"][0]["serviceAccount"]["name"]
        for o in by_kind.get("FlowSchema", [])
        for r in o["spec"]["rules"]
    ]
    return (
        coord["serviceAccountName"] == names["coordinator"]
        and agent["serviceAccountName"] == names["agent"]
        and made.get(names["agent"], {}).get("automountServiceAccountToken", False) is False
        and subjects
        and set(subjects) == {names["coordinator"]}
    )


def leader_label_policy(by_kind, v, name):
    """The ValidatingAdmissionPolicy and its binding that hold the leader
    label to a replica's own pod: matched on the coordinator's account in the
    release's namespace, denying, comparing the pod its token names."""
    account = v["coordinator"]["serviceAccount"]["name"] or name
    policies = [p for p in by_kind.get("ValidatingAdmissionPolicy", []) if p["metadata"]["name"] == f"{name}-leader-label"]
    bindings = [b for b in by_kind.get("ValidatingAdmissionPolicyBinding", []) if b["spec"]["policyName"] == f"{name}-leader-label"]
    if len(policies) != 1 or len(bindings) != 1:
        return False
    spec = policies[0]["spec"]
    return (
        spec["failurePolicy"] == "Fail"
        and "namespaceSelector" not in spec["matchConstraints"]
        and spec["matchConstraints"]["resourceRules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}]
        and [m["expression"] for m in spec["matchConditions"]] == [f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{account}"']
        and "authentication.kubernetes.io/pod-name" in spec["variables"][0]["expression"]
        and all("'hypervisor.cloud.sap/leader'" in x["expression"] for x in spec["variables"][1:3])
        and [x["expression"] for x in spec["validations"]][0] == "object.spec == oldObject.spec"
        and "k.startsWith('hypervisor.cloud.sap/')" in spec["validations"][1]["expression"]
        and "annotations" in spec["validations"][2]["expression"]
        and spec["validations"][3]["expression"] == "variables.label == variables.was || variables.podName == object.metadata.name"
        and bindings[0]["spec"]["validationActions"] == ["Deny"]
    )


def agent_identity(by_kind, v, agent, a, coord, c, name):
    """With agent.identity.from coordinator: the agent asks the coordinator's
    bootstrap port on a projected token for the audience the coordinator
    takes, trusts the CA the leader publishes, keeps its key in the pod's
    memory and mounts nothing of the host for it; the coordinator serves that
    port behind the Service, mounts the signing CA (the site's, or the chart's:
    cert-manager's Certificate or a Secret Helm keeps) and may review tokens.
    With hostDir: the host's directory, as before, and none of that."""
    ident = v["coordinator"]["identity"]
    fn = fullname(v)
    mounts = {m["name"]: m for m in a["volumeMounts"]}
    vols = {x["name"]: x for x in agent["volumes"]}
    cmounts = {m["name"]: m for m in c["volumeMounts"]}
    cvols = {x["name"]: x for x in coord["volumes"]}
    service = next(s for s in by_kind["Service"] if s["metadata"]["name"] == name)
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    cports = {p["name"]: p["containerPort"] for p in c["ports"]}
    signer = ident["signerSecret"] or f"{fn}-agent-signer"
    certs = [o for o in by_kind.get("Certificate", []) if o["spec"]["secretName"] == f"{fn}-agent-signer"]
    secrets = [o for o in by_kind.get("Secret", []) if o["metadata"]["name"] == f"{fn}-agent-signer"]
    reviews = any(
        "tokenreviews" in r["resources"] and r["verbs"] == ["create"]
        for o in by_kind.get("ClusterRole", [])
        for r in o["rules"]
    )
    if v["agent"]["identity"]["from"] == "hostDir":
        return (
            [x for x in a["args"] if x.startswith("--tls-")]
            == ["--tls-cert=/etc/hv-agent/tls/tls.crt", "--tls-key=/etc/hv-agent/tls/tls.key", "--tls-ca=/etc/hv-agent/tls/ca.crt"]
            and vols.get("tls", {}).get("hostPath", {}).get("path") == v["agent"]["tlsHostDir"]
            and not {"token", "coordinator-ca", "identity"} & set(vols)
            and not any(
                x.startswith(("--identity-", "--agent-signer", "--agent-service-account", "--agent-daemonset",
                              "--agent-token", "--agent-certificate", "--publish-server-ca", "--token-file"))
                for x in c["args"] + a["args"]
            )
            and "identity" not in ports
            and "agent-signer" not in cvols
            and not certs
            and not secrets
        )
    audience = [x.split("=", 1)[1] for x in c["args"] if x.startswith("--agent-token-audience=")]
    token = vols.get("token", {}).get("projected", {}).get("sources", [{}])[0].get("serviceAccountToken", {})
    sa = v["agent"]["serviceAccount"]
    agent_sa = sa["name"] or (f"{fn}-agent" if sa["create"] else "default")
    made = (
        (not ident["signerSecret"] and v["certManager"]["enabled"] and len(certs) == 1 and certs[0]["spec"]["isCA"] is True and not secrets)
        or (not ident["signerSecret"] and not v["certManager"]["enabled"] and len(secrets) == 1 and not certs
            and secrets[0]["metadata"]["annotations"].get("helm.sh/resource-policy") == "keep"
            and secrets[0]["type"] == "kubernetes.io/tls")
        or (ident["signerSecret"] and not certs and not secrets)
    )
    return (
        f"--identity-url=https://{name}.{NAMESPACE}.svc:{ident['port']}" in a["args"]
        and "--tls-ca=/etc/hv-agent/coordinator-ca/ca.crt" in a["args"]
        and "--token-file=/var/run/secrets/hv-agent/token" in a["args"]
        and "--identity-dir=/run/hv-agent/identity" in a["args"]
        and not any(x.startswith(("--tls-cert", "--tls-key")) for x in a["args"])
        and "tls" not in vols
        and not any("hostPath" in vols[m] for m in ("token", "coordinator-ca", "identity") if m in vols)
        and token == {"audience": audience[0] if audience else None, "expirationSeconds": 600, "path": "token"}
        and mounts.get("token", {}).get("mountPath") == "/var/run/secrets/hv-agent"
        and vols.get("coordinator-ca", {}).get("configMap", {}).get("name") == f"{fn}-coordinator-ca"
        and mounts.get("coordinator-ca", {}).get("mountPath") == "/etc/hv-agent/coordinator-ca"
        and vols.get("identity", {}).get("emptyDir", {}).get("medium") == "Memory"
        and mounts.get("identity", {}).get("mountPath") == "/run/hv-agent/identity"
        and agent.get("automountServiceAccountToken") is False
        and f"--identity-listen=0.0.0.0:{ident['port']}" in c["args"]
        and f"--agent-service-account={NAMESPACE}/{agent_sa}" in c["args"]
        and f"--agent-daemonset={by_kind['DaemonSet'][0]['metadata']['name']}" in c["args"]
        and f"--publish-server-ca-configmap={fn}-coordinator-ca" in c["args"]
        and "--publish-server-ca=/etc/hv/tls/ca.crt" in c["args"]
        and cvols.get("agent-signer", {}).get("secret", {}).get("secretName") == signer
        and cmounts.get("agent-signer", {}).get("mountPath") == "/etc/hv/agent-signer"
        and {"--agent-signer-cert=/etc/hv/agent-signer/tls.crt", "--agent-signer-key=/etc/hv/agent-signer/tls.key"} <= set(c["args"])
        and ports.get("identity", {}).get("port") == ident["port"]
        and cports.get("identity") == ident["port"]
        and made
        and reviews
    )


def policy(case, rendered, values):
    """What the chart promises an SRE, on every rendering."""
    v = merged(defaults(), values)
    by_kind = {}
    for o in objects(rendered):
        by_kind.setdefault(o["kind"], []).append(o)
    name = f"{fullname(v)}-coordinator"
    sts = next(d for d in by_kind["Deployment"] if d["metadata"]["name"] == name)
    agent = by_kind["DaemonSet"][0]["spec"]["template"]["spec"]
    coord = sts["spec"]["template"]["spec"]
    a, c = agent["containers"][0], coord["containers"][0]
    protect = f"{name}-protect-"
    coord_selector = sts["spec"]["selector"]["matchLabels"]
    agent_selector = by_kind["DaemonSet"][0]["spec"]["selector"]["matchLabels"]
    all_objects = [o for kind in by_kind.values() for o in kind]
    bmc_secrets = v["coordinator"]["fencing"]["bmcSecrets"]
    own_secrets = {
        f"{fullname(v)}-ca", f"{fullname(v)}-sre-tls", f"{fullname(v)}-agent-signer",
        v["coordinator"]["tlsSecret"], v["openstack"]["cloudsSecret"],
    } | ({v["coordinator"]["identity"]["signerSecret"]} - {""})
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
            if not b["metadata"]["name"].startswith(protect)
        ]
        == [(1, "AlwaysAllow")],
        # The eviction webhook's backstop: a budget per protected set, released
        # only by the coordinator's label; the webhook with the leader's Service.
        "protected pods held until labelled evictable": all(
            b["spec"]["maxUnavailable"] == 0
            and {"key": "hypervisor.cloud.sap/evictable", "operator": "NotIn", "values": ["true"]}
            in b["spec"]["selector"]["matchExpressions"]
            for b in by_kind.get("PodDisruptionBudget", [])
            if b["metadata"]["name"].startswith(protect)
        )
        and bool([b for b in by_kind.get("PodDisruptionBudget", []) if b["metadata"]["name"].startswith(protect) and b["metadata"]["name"] != f"{protect}guards"])
        == bool(by_kind.get("ValidatingWebhookConfiguration"))
        # The drain guards' budget, and their image, with the guards only.
        and any(b["metadata"]["name"] == f"{protect}guards" for b in by_kind.get("PodDisruptionBudget", []))
        == any(x.startswith("--drain-guard-image=") for x in c["args"])
        and all(
            w["failurePolicy"] == "Ignore"
            and w["sideEffects"] == "NoneOnDryRun"
            and w["clientConfig"]["service"]["name"] == name
            and any(f"--webhook-listen=0.0.0.0:{w['clientConfig']['service']['port']}" == x for x in c["args"])
            for o in by_kind.get("ValidatingWebhookConfiguration", [])
            for w in o["webhooks"]
        )
        and (not by_kind.get("ValidatingWebhookConfiguration")) == (not any(x.startswith("--webhook-listen") for x in c["args"])),
        "the agent has no API token": agent.get("automountServiceAccountToken") is False,
        # Writable: /tmp, and the agent's certificate in the pod's memory.
        "host mounts are read-only": all(m.get("readOnly") for m in a["volumeMounts"] if m["name"] not in ("tmp", "identity")),
        "SASL mechanisms in the agent image": "libsasl2-modules" in open(os.path.join(CHART, "..", "..", "images", "Containerfile.agent")).read(),
        "no privilege": all(
            x["securityContext"]["allowPrivilegeEscalation"] is False
            and x["securityContext"]["capabilities"]["drop"] == ["ALL"]
            for x in (a, c)
        ),
        "TLS flags on both sides": any(x.startswith("--tls-ca=") for x in a["args"])
        and ("--tls-cert=/etc/hv-agent/tls/tls.crt" in a["args"]) != ("--identity-url" in " ".join(a["args"]))
        and "--client-ca=/etc/hv/tls/ca.crt" in c["args"]
        and not any(x.startswith("--insecure") for x in a["args"] + c["args"]),
        "the agents' certificates as agent.identity.from says": agent_identity(by_kind, v, agent, a, coord, c, name),
        "limits set": all("limits" in x["resources"] and "requests" in x["resources"] for x in (a, c)),
        "coordinator rolled one pod at a time": sts["spec"]["strategy"]
        == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        # A Deployment's pods have no names known in advance: the admission
        # policy lets the coordinator's account set or clear the leader label
        # only on the pod its token is bound to.
        "the leader label only on the coordinator's own pod": leader_label_policy(by_kind, v, name),
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
            if "pods" in r["resources"] and "patch" in r["verbs"] and o["metadata"]["name"] == f"{name}-pods"
        }
        == pod_namespaces(values)
        == {x.removeprefix("--pod-namespace=") for x in c["args"] if x.startswith("--pod-namespace=")}
        # Its own Role: patch on pods of its namespace, for the leader label.
        and [
            (o["metadata"]["namespace"], r["verbs"])
            for o in by_kind["Role"]
            for r in o["rules"]
            if "pods" in r["resources"] and o["metadata"]["name"] == name
        ]
        == [(NAMESPACE, ["patch"])]
        # No other Role has a rule on pods.
        and not [
            o["metadata"]["name"]
            for o in by_kind["Role"]
            for r in o["rules"]
            if "pods" in r["resources"]
            and o["metadata"]["name"] not in (name, f"{name}-pods", f"{name}-dependency-pods")
        ],
        # The node dependencies' pods are only watched: where no pods Role is,
        # a Role of its own grants list and watch on them, never patch; every
        # namespace named is watchable, and none is a --pod-namespace for it.
        "node dependencies' pods watched, never patched": dependency_pods(by_kind, v, values, name, c["args"]),
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
        # Every value reaches its flag (VALUE_FLAGS), extraArgs last.
        "every value reaches its coordinator flag": not flags_reach_the_coordinator(c["args"], v)
        and c["args"][len(c["args"]) - len(v["coordinator"]["extraArgs"]):] == v["coordinator"]["extraArgs"],
        # Secrets by name only (the BMC credentials'), never the chart's own keys.
        "Secrets readable only by name": not secret_readers(all_objects)
        and [
            r["resourceNames"]
            for o in by_kind.get("Role", []) + by_kind.get("ClusterRole", [])
            for r in o["rules"]
            if "secrets" in r["resources"]
        ]
        == ([sorted(set(bmc_secrets), key=bmc_secrets.index)] if bmc_secrets else [])
        and not own_secrets & set(bmc_secrets),
        # The whole clouds Secret: a CA file beside clouds.yaml.
        "the clouds Secret mounted whole": [
            (x["secret"]["secretName"], x["secret"].get("items"))
            for x in coord["volumes"]
            if x["name"] == "clouds"
        ]
        == [(v["openstack"]["cloudsSecret"], None)]
        and {"name": "clouds", "mountPath": "/etc/openstack", "readOnly": True} in c["volumeMounts"]
        and "--clouds-yaml=/etc/openstack/clouds.yaml" in c["args"],
        # The CRDs upgrade with the release, and stay on uninstall.
        "the CRDs are the generated ones, kept": (
            crds_as_generated(by_kind.get("CustomResourceDefinition", []))
            and all(
                v["crds"]["annotations"].items() <= o["metadata"]["annotations"].items()
                for o in by_kind.get("CustomResourceDefinition", [])
            )
        )
        if v["crds"]["install"]
        else not by_kind.get("CustomResourceDefinition"),
        "helm test checks the install": the_test_pod(by_kind, v, sts, name),
        "every alert has a summary, a description and a runbook": alerts_whole(by_kind, v),
        "monitoring objects carry their labels and annotations": monitoring_metadata(by_kind, v),
        "images: registry, digest over tag": c["image"] == image(v, "coordinator")
        and a["image"] == image(v, "agent")
        and (not v["coordinator"]["drainGuard"]["enabled"] or f"--drain-guard-image={image(v, 'agent')}" in c["args"]),
        "names: fullnameOverride and nameOverride": all(
            o["metadata"]["name"].startswith(fullname(v))
            for o in all_objects
            if o["kind"] not in ("CustomResourceDefinition", "ValidatingWebhookConfiguration", "ServiceAccount")
        )
        and all(
            o["metadata"].get("labels", {}).get("app.kubernetes.io/name") == (v.get("nameOverride") or "hv")
            for o in all_objects
        )
        and f"--lease-name={name}" in c["args"],
        "service accounts": service_accounts(by_kind, v, coord, agent),
        "coordinator pod extras": pod_extras(coord, c, "coordinator", v, coord_selector)
        and pod_metadata(sts["spec"]["template"], "coordinator", v, coord_selector),
        "agent pod extras": pod_extras(agent, a, "agent", v, agent_selector)
        and pod_metadata(by_kind["DaemonSet"][0]["spec"]["template"], "agent", v, agent_selector),
    }
    broken = [k for k, ok in checks.items() if not ok]
    if broken:
        detail = flags_reach_the_coordinator(c["args"], v) + secret_readers(all_objects)
        fail(f"{case}: {broken} {detail}")


def pod_namespaces(values):
    """The namespaces the values name for protected and dependent pods, with
    the release's (hv-system here); with the drain guards alone (on unless
    turned off), the release's; with the agents' certificates from the
    coordinator (the default), the release's too; else none. Not the node
    dependencies' (dependency_namespaces)."""
    coordinator = values.get("coordinator", {})
    drain = coordinator.get("drainProtection", {})
    guard = coordinator.get("drainGuard", {})
    guards = {guard.get("namespace") or NAMESPACE} if guard.get("enabled", True) else set()
    if values.get("agent", {}).get("identity", {}).get("from", "coordinator") == "coordinator":
        guards.add(NAMESPACE)
    if not drain.get("enabled"):
        return guards
    named = drain.get("protectedPods", []) + drain.get("dependentPods", [])
    return {NAMESPACE} | {p["namespace"] for p in named} | guards


def dependency_namespaces(values):
    """The namespaces of the node dependencies' pods without a pods Role
    (pod_namespaces): each gets a Role that lets the coordinator list and
    watch pods there, and nothing else."""
    named = {d["namespace"] for d in values.get("coordinator", {}).get("nodeDependencies", [])}
    return named - pod_namespaces(values)


# The dependency pods' Role's only rule (files/coordinator-rules.yaml, dependencyPods).
WATCH_PODS = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}


def dependency_pods(by_kind, v, values, name, args):
    """Where pods are only watched (dependency_namespaces): a Role named
    NAME-dependency-pods with WATCH_PODS alone, bound to the coordinator's
    account, in each such namespace and no other; every namespace of a node
    dependency can list and watch pods (that Role or the pods Role), and
    none of them is a --pod-namespace for the dependency's sake."""
    role = f"{name}-dependency-pods"
    account = v["coordinator"]["serviceAccount"]["name"] or name
    want = dependency_namespaces(values)
    roles = {o["metadata"]["namespace"]: o for o in by_kind.get("Role", []) if o["metadata"]["name"] == role}
    bindings = {o["metadata"]["namespace"]: o for o in by_kind.get("RoleBinding", []) if o["metadata"]["name"] == role}
    if set(roles) != want or set(bindings) != want:
        return False
    for ns in want:
        b = bindings[ns]
        if roles[ns]["rules"] != [WATCH_PODS]:
            return False
        if b["roleRef"] != {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role}:
            return False
        if b["subjects"] != [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]:
            return False
    watchable = {
        o["metadata"]["namespace"]
        for o in by_kind.get("Role", [])
        if o["metadata"]["name"] in (role, f"{name}-pods")
        for r in o["rules"]
        if "pods" in r["resources"] and {"list", "watch"} <= set(r["verbs"]) and "" in r["apiGroups"]
    }
    named = {d["namespace"] for d in v["coordinator"]["nodeDependencies"]}
    told = {x.removeprefix("--pod-namespace=") for x in args if x.startswith("--pod-namespace=")}
    return named <= watchable and not (want & told)


def rust_flags():
    """The coordinator's flags (coordinator/src/config): name -> (type, default
    as the values would say it, or None)."""
    keys = open(os.path.join(REPO, "coordinator", "src", "api", "keys.rs")).read()
    consts = dict(re.findall(r'pub const (\w+): &str = "([^"]*)";', keys))
    flags = {}
    for path in glob.glob(os.path.join(REPO, "coordinator", "src", "config", "*.rs")):
        text = open(path).read()
        for attr, field, ty in re.findall(r"#\[arg\((.*?)\)\]\s*pub (\w+):\s*([^\n]+?),?\n", text, re.S):
            if not re.match(r"\s*long\b", attr):
                continue
            long = re.search(r'long\s*=\s*"([^"]+)"', attr)
            flag = "--" + (long.group(1) if long else field.replace("_", "-"))
            default = None
            if m := re.search(r'default_value\s*=\s*"([^"]*)"', attr):
                default = m.group(1)
            elif m := re.search(r"default_value\s*=\s*([\w:]+)", attr):
                default = consts[m.group(1).split("::")[-1]]
            elif m := re.search(r"default_value_t\s*=\s*([^,]+)", attr):
                raw = m.group(1).strip()
                if raw in ("true", "false"):
                    default = raw == "true"
                elif re.fullmatch(r"[0-9_]+", raw):
                    default = int(raw.replace("_", ""))
                else:
                    default = raw.split("::")[-1].lower()
            elif ty.strip() == "bool":
                default = False
            flags[flag] = (ty.strip(), default)
    return flags


def flags_are_values():
    """Every coordinator flag is a value (its default the flag's), set by
    the chart, or no value for a reason; no value names a flag that is gone."""
    flags = rust_flags()
    if len(flags) < 40:
        fail(f"read only {len(flags)} coordinator flags from coordinator/src/config: the parser is stale")
    d = defaults()
    table = {flag: (path, kind) for path, flag, kind in VALUE_FLAGS}
    unknown = sorted((set(table) | CHART_SET | set(NOT_VALUES)) - set(flags))
    if unknown:
        fail(f"flags in check.py the coordinator no longer has: {unknown}")
    loose = sorted(set(flags) - set(table) - CHART_SET - set(NOT_VALUES))
    if loose:
        fail(f"coordinator flags settable only through extraArgs: {loose}; give each a value (and a row of VALUE_FLAGS)")
    wrong = []
    for flag, (path, kind) in table.items():
        _, rust = flags[flag]
        value = at(d, path)
        if rust is None:
            # No default: the value is empty (or required, as openstack.cloud).
            ok = value in ("", [], False, None)
        else:
            ok = value == rust
        if not ok:
            wrong.append(f"{path} defaults to {value!r}, {flag} to {rust!r}")
    if wrong:
        fail(f"values.yaml defaults differ from the coordinator's: {wrong}")
    print(f"{len(flags)} coordinator flags: {len(table)} values with the flags' defaults, {len(CHART_SET)} set by the chart, {len(NOT_VALUES)} no value")


def schema_in_step():
    """values.yaml has every value values.schema.json describes (and the
    schema refuses what it does not describe: the defaults' lint)."""
    with open(os.path.join(CHART, "values.schema.json")) as f:
        schema = json.load(f)

    def resolve(node):
        while "$ref" in node:
            node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]] | {k: x for k, x in node.items() if k != "$ref"}
        return node

    missing = []

    def walk(node, values, path):
        for key, sub in resolve(node).get("properties", {}).items():
            if not isinstance(values, dict) or key not in values:
                missing.append(f"{path}{key}")
            elif "properties" in resolve(sub):
                walk(sub, values[key], f"{path}{key}.")

    walk(schema, defaults(), "")
    if missing:
        fail(f"values.schema.json describes values values.yaml does not have: {missing}")


def runbook_headings(alerts):
    """Each alert's runbook anchor is a '### <Alert>' heading of the Alerts
    section of docs/operations.md (a GitHub anchor: the heading lowercased)."""
    path = os.path.join(REPO, "docs", "operations.md")
    text = open(path).read() if os.path.exists(path) else ""
    section = re.search(r"^## Alerts\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    slugs = set()
    for heading in re.findall(r"^### +(.+?)\s*$", section.group(1) if section else "", re.M):
        slugs.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    missing = sorted(a for a in alerts if a.lower() not in slugs)
    if missing:
        fail(f"docs/operations.md has no '### <Alert>' heading under '## Alerts' for {missing}")
    print(f"{len(alerts)} alerts, each with its runbook heading in docs/operations.md")


def alert_names(rendered):
    return sorted(
        r["alert"]
        for o in objects(rendered)
        if o["kind"] == "PrometheusRule"
        for g in o["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
    )


def as_subchart(out):
    """The chart under a parent that passes global values, as Helm passes
    them: the schema admits `global`, and global.imageRegistry is honoured."""
    with tempfile.TemporaryDirectory() as tmp:
        parent = os.path.join(tmp, "region")
        os.makedirs(os.path.join(parent, "charts"))
        os.makedirs(os.path.join(parent, "templates"))
        shutil.copytree(CHART, os.path.join(parent, "charts", "hv"))
        version = chart_yaml()["version"]
        with open(os.path.join(parent, "Chart.yaml"), "w") as f:
            f.write(
                "apiVersion: v2\nname: region\nversion: 1.0.0\nicon: https://example.com/region.svg\n"
                f"dependencies:\n  - name: hv\n    version: {version}\n"
            )
        values = {
            "global": {"imageRegistry": "mirror.example.com", "storageClass": "fast", "site": {"region": "eu-1"}},
            "hv": {"openstack": {"cloudsSecret": "hv-clouds", "cloud": "region-1"}},
        }
        with open(os.path.join(parent, "values.yaml"), "w") as f:
            json.dump(values, f)
        report = helm.lint(parent, values, strict=True, with_subcharts=True)
        if problems(report) or report["errors"]:
            fail(f"as a subchart with global values: {report['messages']} {report['errors']}")
        rendered = helm.Chart.load(parent).render(values, name="region", namespace=NAMESPACE, is_install=True)
    dest = os.path.join(out, "subchart")
    os.makedirs(dest, exist_ok=True)
    ours = {p: t for p, t in rendered.items() if "/charts/hv/templates/" in p}
    for path, text in ours.items():
        if path.endswith(".yaml") and text.strip():
            with open(os.path.join(dest, os.path.basename(path)), "w") as f:
                f.write(text)
    sts = [o for o in objects(ours) if o["kind"] == "Deployment"]
    want = f"mirror.example.com/hv-coordinator:{chart_yaml()['appVersion']}"
    if not sts or sts[0]["spec"]["template"]["spec"]["containers"][0]["image"] != want:
        fail(f"as a subchart: the coordinator's image is not {want} (global.imageRegistry)")
    print(f"as a subchart with global values: lint clean, rendered into {dest}, global.imageRegistry honoured")


def self_test():
    """The Secrets check catches a Role that could read a Secret not named."""
    rule = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
    role = {"kind": "Role", "metadata": {"name": "r", "namespace": NAMESPACE}, "rules": [rule]}
    named = copy.deepcopy(role)
    named["rules"][0]["resourceNames"] = ["bmc-a"]
    wide = {"kind": "ClusterRole", "metadata": {"name": "c"}, "rules": [dict(rule, verbs=["list"])]}
    if not (secret_readers([role]) and secret_readers([wide]) and not secret_readers([named])):
        fail("the Secrets check does not tell a Role that reads any Secret")
    if secret_readers([role], bmc_namespaces=(NAMESPACE,)):
        fail("the Secrets check does not spare a namespace set aside for BMC credentials")


def main(out):
    self_test()
    # The defaults alone: refused by the schema, for the required values only.
    report = helm.lint(CHART, strict=True)
    named = {p for m in problems(report) for p in REQUIRED if f"'{p}'" in m["error"]}
    if named != REQUIRED:
        fail(f"the defaults should be refused for {sorted(REQUIRED)}; lint said {report['messages']}")
    others = [m for m in problems(report) if not any(f"'{p}'" in m["error"] for p in REQUIRED)]
    if others:
        fail(f"the defaults have other problems: {others}")
    print(f"defaults refused by the schema, naming {', '.join(sorted(REQUIRED))}")
    # Alerts need the base of their runbooks.
    with open(os.path.join(CHART, "ci", "minimal-values.yaml")) as f:
        minimal = helm.values_from_yaml(f.read())
    report = helm.lint(CHART, merged(minimal, {"monitoring": {"prometheusRule": {"enabled": True}}}), strict=True)
    if not any("runbookBaseUrl" in m["error"] for m in problems(report)):
        fail(f"alerts without monitoring.runbookBaseUrl should be refused; lint said {report['messages']}")
    print("alerts without a runbook base refused by the schema")

    flags_are_values()
    schema_in_step()

    chart = helm.Chart.load(CHART)
    cases = sorted(f for f in os.listdir(os.path.join(CHART, "ci")) if f.endswith("-values.yaml"))
    if not cases:
        fail("no ci/*-values.yaml")
    alerts = set()
    for case in cases:
        with open(os.path.join(CHART, "ci", case)) as f:
            values = helm.values_from_yaml(f.read())
        report = helm.lint(CHART, values, strict=True)
        if problems(report) or report["errors"]:
            fail(f"{case}: {report['messages']} {report['errors']}")
        rendered = chart.render(values, name="hv", namespace=NAMESPACE, is_install=True)
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
        alerts |= set(alert_names(rendered))
        print(f"{case}: lint clean, {n} templates rendered into {dest}, policies hold")
    if not alerts:
        fail("no ci values render the PrometheusRule")

    as_subchart(out)

    generated = os.path.join(REPO, "deploy", "crds")
    cmp = filecmp.dircmp(generated, os.path.join(CHART, "files", "crds"))
    if cmp.left_only or cmp.right_only or cmp.diff_files:
        fail(f"files/crds/ differs from deploy/crds/ (run make crds): {cmp.left_only} {cmp.right_only} {cmp.diff_files}")
    if os.path.exists(os.path.join(CHART, "crds")):
        fail("crds/ is back: Helm never upgrades it; the CRDs are templates (files/crds/)")
    print(f"files/crds/ matches deploy/crds/ ({len(cmp.same_files)} CRDs)")

    runbook_headings(sorted(alerts))


if __name__ == "__main__":
    main(sys.argv[1])
