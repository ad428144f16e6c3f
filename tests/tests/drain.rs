//! A rolling update's ask, on the real peers: the Node annotation
//! `hypervisor.cloud.sap/maintenance-required`, or a cordon where the site
//! says a cordon is one (`--cordon-starts-maintenance`), puts the host into
//! `auto` maintenance: disabled in Nova, its servers live-migrated away by a
//! RollingUpdate Eviction, held in Maintenance while the ask stands. Its
//! end (annotation removed, uncordon) brings the host back through its
//! checks to Active; past `--update-max-held`, a host asking waits in
//! service for a place. And the node lock protocol: the Node says whether the
//! host may lose its dependents (label `hypervisor.cloud.sap/evictable`),
//! and a network agent's lock annotation stands while it may not
//! (docs/drain.md). And `kubectl drain` against the eviction webhook and
//! the disruption budgets: refused while the host has VMs, its maintenance
//! started by the refusal, done by itself once the host is emptied.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test that fails fails

use std::time::Duration;

use hv_coordinator::api::Phase;
use hv_coordinator::api::eviction::EvictionReason;
use hv_coordinator::api::keys::MAINTENANCE_REQUIRED_ANNOTATION;
use hv_coordinator::api::keys::{DRAIN_REFUSED_ANNOTATION, POD_EVICTABLE_LABEL};
use hv_coordinator::api::keys::{EVICTABLE_LABEL, LOCK_ANNOTATION_PREFIX};
use hv_tests::openstack::Admin;
use hv_tests::region::Region;
use hv_tests::wait::{Poll, until};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const SOON: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread")]
async fn an_update_empties_the_host_by_live_migration_and_its_end_brings_it_back_through_its_checks() {
    let region = Region::start("drain-update").await;
    let env = region.env.clone();
    let zone = hv_tests::hosts::zone(&env, 1).await;
    let (host, target) = (zone.source.host.clone(), zone.targets[0].host.clone());
    let coord = region.coordinator(
        None,
        &[
            "--cordon-starts-maintenance",
            "--node-lock",
            "neutron-l2",
            "--update-max-held",
            "1",
            "--update-signal",
            "label:example.com/os-update=pending",
        ],
    );
    let agents = both_active(&region, [&host, &target], &coord).await;
    let admin = Admin::login(&env).await.unwrap();
    let id = zone.boot(&admin, &format!("drain-{}", std::process::id()), &host, "1").await;
    let nodes: Api<Node> = Api::all(region.kube.client.clone());
    // In service with a VM: not evictable, the network agent locked.
    wait_locks(&nodes, &host, false).await;
    let runs = |hv: &hv_coordinator::api::Hypervisor| hv.status.as_ref().map_or(0, |s| s.lifecycle.test_run);
    let before = runs(&region.hypervisor(&host).await.unwrap());

    // Cordoned (the site says a cordon is an update's ask): emptied by live
    // migration, and held.
    let cordon = |on: bool| serde_json::json!({"spec": {"unschedulable": on}});
    nodes.patch(&host, &PatchParams::default(), &Patch::Merge(&cordon(true))).await.unwrap();
    let held = region.wait_phase(&host, Phase::Maintenance, SOON, &coord).await;
    live_migrated_away(&region, &admin, &id, &host, &target).await;
    let svc = admin.service(&host).await.unwrap().unwrap();
    assert_eq!(svc["status"], "disabled", "{svc}");
    assert!(
        svc["disabled_reason"].as_str().unwrap().contains("maintenance (auto): the Node is cordoned"),
        "{svc}"
    );
    assert!(held.spec.maintenance_reason.is_empty(), "the spec is the SRE's: untouched");
    // Empty and held: evictable, the lock lifted.
    wait_locks(&nodes, &host, true).await;
    // The other host asks too, past --update-max-held 1: it waits, in service.
    let ask =
        serde_json::json!({"metadata": {"annotations": {MAINTENANCE_REQUIRED_ANNOTATION: "os-update"}}});
    nodes.patch(&target, &PatchParams::default(), &Patch::Merge(&ask)).await.unwrap();
    until("the other host told it waits", SOON, String::new, || async {
        let events = region.events_for(&target).await;
        match events.iter().find(|(reason, _)| reason == "UpdateWaits") {
            Some((_, note)) => Poll::Ready(note.clone()),
            None => Poll::Pending(format!("{events:?}")),
        }
    })
    .await;
    let waiting = region.hypervisor(&target).await.unwrap();
    assert_eq!(waiting.status.unwrap().phase, Some(Phase::Active), "held back in service");
    assert_eq!(admin.service(&target).await.unwrap().unwrap()["status"], "enabled");

    // Uncordoned: back through its checks (a new run) to Active, enabled.
    nodes.patch(&host, &PatchParams::default(), &Patch::Merge(&cordon(false))).await.unwrap();
    let back = region.wait_phase(&host, Phase::Active, SOON, &coord).await;
    assert!(runs(&back) > before, "checked again: run {} after {before}", runs(&back));
    let status = back.status.clone().unwrap();
    assert!(!status.checks.is_empty() && status.checks.iter().all(|c| c.passed), "{:?}", status.checks);
    assert_eq!(admin.service(&host).await.unwrap().unwrap()["status"], "enabled");
    // In service again, VMs may land: locked again.
    wait_locks(&nodes, &host, false).await;

    // The place freed, the waiting host gets it, through its annotation:
    // emptied (the server back on the first host) and held.
    region.wait_phase(&target, Phase::Maintenance, SOON, &coord).await;
    assert_eq!(admin.server(&id).await.unwrap()["OS-EXT-SRV-ATTR:host"], host.as_str());
    let svc = admin.service(&target).await.unwrap().unwrap();
    assert!(svc["disabled_reason"].as_str().unwrap().contains("maintenance-required"), "{svc}");
    let done = serde_json::json!({"metadata": {"annotations": {MAINTENANCE_REQUIRED_ANNOTATION: null}}});
    nodes.patch(&target, &PatchParams::default(), &Patch::Merge(&done)).await.unwrap();
    region.wait_phase(&target, Phase::Active, SOON, &coord).await;
    assert_eq!(admin.service(&target).await.unwrap().unwrap()["status"], "enabled");

    // A sign the site names (--update-signal label:…=pending) asks as the
    // annotation does; the same label with another value does not.
    let label =
        |v: serde_json::Value| serde_json::json!({"metadata": {"labels": {"example.com/os-update": v}}});
    nodes.patch(&host, &PatchParams::default(), &Patch::Merge(&label(json!("done")))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(region.hypervisor(&host).await.unwrap().status.unwrap().phase, Some(Phase::Active));
    nodes.patch(&host, &PatchParams::default(), &Patch::Merge(&label(json!("pending")))).await.unwrap();
    region.wait_phase(&host, Phase::Maintenance, SOON, &coord).await;
    assert_eq!(admin.server(&id).await.unwrap()["OS-EXT-SRV-ATTR:host"], target.as_str(), "emptied");
    nodes
        .patch(&host, &PatchParams::default(), &Patch::Merge(&label(serde_json::Value::Null)))
        .await
        .unwrap();
    region.wait_phase(&host, Phase::Active, SOON, &coord).await;
    drop(agents);
}

/// The server left `host` for `target` by live migration (Nova's record,
/// ACTIVE there), moved by the host's one RollingUpdate Eviction.
async fn live_migrated_away(region: &Region, admin: &Admin, id: &str, host: &str, target: &str) {
    let server = admin.server(id).await.unwrap();
    assert_eq!(server["OS-EXT-SRV-ATTR:host"], target, "{server}");
    assert_eq!(server["status"], "ACTIVE");
    let migrations = admin.migrations_of(id).await.unwrap();
    assert!(
        migrations.iter().any(|m| m["migration_type"] == "live-migration" && m["status"] == "completed"),
        "{migrations:?}"
    );
    let mine = region.evictions_of(host).await;
    assert_eq!(mine.len(), 1, "one Eviction");
    assert_eq!(mine[0].spec.reason, EvictionReason::RollingUpdate);
}

/// The two hosts' agents and Nodes, once both are Active.
async fn both_active(
    region: &Region,
    hosts: [&String; 2],
    coord: &hv_tests::region::Proc,
) -> Vec<hv_tests::region::Proc> {
    region.active_with_agents(&[hosts[0].clone(), hosts[1].clone()], coord, SOON).await
}

/// Waits until the Node's lock protocol marks say `evictable`: the label,
/// and the neutron-l2 lock annotation there exactly while it is not.
async fn wait_locks(nodes: &Api<Node>, host: &str, evictable: bool) {
    let what = format!("{host} evictable={evictable}");
    until(&what, Duration::from_secs(60), String::new, || async {
        let node = nodes.get(host).await.unwrap();
        let label = node.labels().get(EVICTABLE_LABEL).cloned();
        let locked = node.annotations().contains_key(&format!("{LOCK_ANNOTATION_PREFIX}neutron-l2"));
        if label.as_deref() == Some(&evictable.to_string()) && locked != evictable {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("label {label:?}, locked {locked}"))
        }
    })
    .await;
}

/// A hypervisor's pods as a site runs them: nova-compute and a network
/// agent per node (owned by a per-node StatefulSet, as Yaook does), our
/// agent from a DaemonSet, and a workload pod of no concern to us. Their
/// owners are real objects (the garbage collector deletes a pod whose owner
/// is missing); no StatefulSet or DaemonSet controller runs on the ground,
/// so the owners make no pods of their own, and kwok runs the pods on the
/// host's Node.
async fn pods_of(region: &Region, host: &str) -> Vec<(String, String)> {
    let mut made = Vec::new();
    for (ns, app, kind, owner_name) in [
        ("openstack", "nova-compute", "StatefulSet", format!("nova-compute-{host}")),
        ("openstack", "neutron-l2", "StatefulSet", format!("neutron-l2-{host}")),
        ("hv-system", "hv-agent", "DaemonSet", "hv-agent".to_string()),
        ("default", "web", "StatefulSet", "web".to_string()),
    ] {
        let name = format!("{app}-{host}");
        pod_on(region, host, ns, &name, app, owner(region, ns, kind, &owner_name, app).await).await;
        made.push((ns.to_string(), name));
    }
    made
}

/// The pod `ns/name` labelled `app`, bound to `host`, owned by `owner`.
async fn pod_on(region: &Region, host: &str, ns: &str, name: &str, app: &str, owner: serde_json::Value) {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}, "ownerReferences": [owner]},
        "spec": {"nodeName": host, "containers": [{"name": app, "image": app}]}});
    let api: Api<Pod> = Api::namespaced(region.kube.client.clone(), ns);
    api.create(&PostParams::default(), &serde_json::from_value(pod).unwrap()).await.unwrap();
}

/// The workload `kind` `ns/name` (made if missing), as a controller owner
/// reference with its real uid.
async fn owner(region: &Region, ns: &str, kind: &str, name: &str, app: &str) -> serde_json::Value {
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    let gvk = GroupVersionKind::gvk("apps", "v1", kind);
    let api: Api<DynamicObject> =
        Api::namespaced_with(region.kube.client.clone(), ns, &ApiResource::from_gvk(&gvk));
    let spec = json!({"replicas": 1, "selector": {"matchLabels": {"app": app}},
        "template": {"metadata": {"labels": {"app": app}}, "spec": {"containers": [{"name": app, "image": app}]}}});
    let mut obj = json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name}, "spec": spec});
    if kind == "DaemonSet" {
        obj["spec"].as_object_mut().unwrap().remove("replicas");
    }
    let made = match api.create(&PostParams::default(), &serde_json::from_value(obj).unwrap()).await {
        Ok(o) => o,
        Err(kube::Error::Api(s)) if s.code == 409 => api.get(name).await.unwrap(),
        Err(e) => panic!("{kind} {ns}/{name}: {e}"),
    };
    json!({"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": made.metadata.uid.unwrap(), "controller": true})
}

/// The chart's eviction webhook is one for the cluster, and each test that
/// drains sets it to call its own coordinator: they take turns.
static WEBHOOK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The chart's eviction webhook, calling `url` with the region's CA: the
/// ground's release upgraded by Helm. The chart's disruption budgets stand
/// behind it.
fn chart_webhook(region: &Region, url: &str) {
    // A ByteString is base64 in JSON, as the chart's caBundle wants it.
    let ca = serde_json::to_value(k8s_openapi::ByteString(std::fs::read(&region.pki.ca).unwrap())).unwrap();
    region.upgrade_chart(&json!({"coordinator": {"drainProtection": {"webhookUrl": url, "caBundle": ca}}}));
}

/// The eviction webhook's flags for a coordinator of `region` serving it
/// on `port` with the region's server certificate.
fn webhook_flags(region: &Region, port: u16) -> [String; 6] {
    [
        "--webhook-listen".into(),
        format!("127.0.0.1:{port}"),
        "--webhook-tls-cert".into(),
        region.server_tls.cert.display().to_string(),
        "--webhook-tls-key".into(),
        region.server_tls.key.display().to_string(),
    ]
}

fn kubectl(region: &Region, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(region.env.kube.kubectl());
    cmd.arg("--kubeconfig").arg(&region.kubeconfig).args(args);
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).kill_on_drop(true);
    cmd
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_drain_waits_for_the_host_to_be_emptied_and_completes_by_itself() {
    let _webhook = WEBHOOK.lock().await;
    let region = Region::start("drain-kubectl").await;
    let env = region.env.clone();
    let zone = hv_tests::hosts::zone(&env, 1).await;
    let (host, target) = (zone.source.host.clone(), zone.targets[0].host.clone());
    let port = hv_tests::region::free_port();
    // No --cordon-starts-maintenance: the refused drain is the ask.
    let hook = webhook_flags(&region, port);
    let flags: Vec<&str> = hook
        .iter()
        .map(String::as_str)
        .chain([
            "--protected-pods",
            "app=nova-compute",
            "--protected-pods",
            "app=hv-agent",
            "--dependent-pods",
            "neutron-l2:app=neutron-l2",
            "--node-lock",
            "neutron-l2",
            // Where the chart grants the pods rules: nowhere else.
            "--pod-namespace",
            "openstack",
            "--pod-namespace",
            "hv-system",
        ])
        .collect();
    let mut coord = region.coordinator(None, &flags);
    let agents = both_active(&region, [&host, &target], &coord).await;
    let admin = Admin::login(&env).await.unwrap();
    let id = zone.boot(&admin, &format!("kdrain-{}", std::process::id()), &host, "1").await;
    let pods = pods_of(&region, &host).await;
    let nodes: Api<Node> = Api::all(region.kube.client.clone());
    let openstack: Api<Pod> = Api::namespaced(region.kube.client.clone(), "openstack");
    let nova_compute = format!("nova-compute-{host}");
    wait_locks(&nodes, &host, false).await;

    // The coordinator labels the protected pods for the budgets: false, VMs live here.
    until("protected pods labelled", SOON, String::new, || async {
        let label = |p: Option<Pod>| p.and_then(|p| p.labels().get(POD_EVICTABLE_LABEL).cloned());
        let nc = label(openstack.get_opt(&nova_compute).await.unwrap());
        let l2 = label(openstack.get_opt(&format!("neutron-l2-{host}")).await.unwrap());
        if nc.as_deref() == Some("false") && l2.as_deref() == Some("false") {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("{nc:?} {l2:?}"))
        }
    })
    .await;

    // The webhook down (registered, not answering; failurePolicy Ignore):
    // the disruption budget refuses, and the drain times out.
    chart_webhook(&region, &format!("https://127.0.0.1:{}/", hv_tests::region::free_port()));
    let out =
        kubectl(&region, &["drain", &host, "--ignore-daemonsets", "--timeout=8s"]).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("pods/\"{nova_compute}\""))
            && stderr.contains("violate the pod's disruption budget"),
        "{stderr}"
    );
    assert!(openstack.get_opt(&nova_compute).await.unwrap().is_some(), "not evicted");
    assert_eq!(region.hypervisor(&host).await.unwrap().status.unwrap().phase, Some(Phase::Active));
    // A protected pod the coordinator never labelled (started while it is
    // down, by a workload of its own), once it runs and the disruption
    // controller counts it: the budget holds it too. (A pod not yet Running
    // may be evicted whatever the budget says, as the eviction API has it.)
    coord.kill();
    let late = format!("nova-compute-{host}-late");
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(region.kube.client.clone(), "openstack");
    let budget = "hv-coordinator-protect-protected-0";
    let expected = |b: &k8s_openapi::api::policy::v1::PodDisruptionBudget| {
        b.status.as_ref().map_or((0, 0), |s| (s.expected_pods, s.current_healthy))
    };
    let before = expected(&pdbs.get(budget).await.unwrap()).0;
    let sts = owner(&region, "openstack", "StatefulSet", &late, "nova-compute").await;
    pod_on(&region, &host, "openstack", &late, "nova-compute", sts).await;
    until("the late pod counted by its budget", SOON, String::new, || async {
        let (pods, healthy) = expected(&pdbs.get(budget).await.unwrap());
        hv_tests::wait::ready_when(pods == before + 1 && healthy == pods, (pods, healthy))
    })
    .await;
    // By kubectl, as a drain would: kube's own client would retry the 429.
    let body = region.dir.join("late-eviction.json");
    let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": late, "namespace": "openstack"}});
    std::fs::write(&body, eviction.to_string()).unwrap();
    let path = format!("/api/v1/namespaces/openstack/pods/{late}/eviction");
    let out = kubectl(&region, &["create", "--raw", &path, "-f", &body.display().to_string()])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("disruption budget"),
        "an unlabelled pod is held: {stderr}"
    );
    assert!(openstack.get_opt(&late).await.unwrap().is_some(), "not evicted");
    let coord = region.coordinator(None, &flags);
    let labelled = |name: String| {
        let api = openstack.clone();
        async move { api.get_opt(&name).await.unwrap().and_then(|p| p.labels().get(POD_EVICTABLE_LABEL).cloned()) }
    };
    until(
        "the late pod labelled by the new leader",
        SOON,
        || coord.tail(20),
        || async {
            match labelled(late.clone()).await.as_deref() {
                Some("false") => Poll::Ready(()),
                other => Poll::Pending(format!("{other:?}")),
            }
        },
    )
    .await;

    // Another operator's lock on the Node: a dependent waits for every lock.
    let other_lock = format!("{LOCK_ANNOTATION_PREFIX}other-operator");
    let lock = |v: serde_json::Value| json!({"metadata": {"annotations": {other_lock.as_str(): v}}});
    nodes.patch(&host, &PatchParams::default(), &Patch::Merge(&lock(json!("")))).await.unwrap();

    // The webhook up: kubectl drain, by itself.
    // Bad input to the webhook is answered, never a crash; a dry run is
    // judged and marks nothing (the Node is cordoned, not yet asked).
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&region.pki.ca).unwrap()).unwrap();
    let https = reqwest::Client::builder().tls_certs_only([ca]).build().unwrap();
    let hook = format!("https://127.0.0.1:{port}/validate-eviction");
    assert_eq!(https.get(&hook).send().await.unwrap().status().as_u16(), 405);
    assert_eq!(https.post(&hook).body("{garbled").send().await.unwrap().status().as_u16(), 400);
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "dry-1", "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": "eviction",
        "name": nova_compute, "namespace": "openstack", "operation": "CREATE", "userInfo": {}, "dryRun": true,
        "object": {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": nova_compute}}}});
    let answer: serde_json::Value =
        https.post(&hook).json(&review).send().await.unwrap().json().await.unwrap();
    assert_eq!(answer["response"]["uid"], "dry-1", "{answer}");
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert_eq!(answer["response"]["status"]["code"], 429, "{answer}");
    assert!(
        !nodes.get(&host).await.unwrap().annotations().contains_key(DRAIN_REFUSED_ANNOTATION),
        "a dry run marks nothing"
    );

    chart_webhook(&region, &format!("https://127.0.0.1:{port}/validate-eviction"));
    let mut drain =
        kubectl(&region, &["drain", &host, "--ignore-daemonsets", "--timeout=300s"]).spawn().unwrap();
    // Emptied by live migration meanwhile, and held: the budget's label on
    // its protected pods, the neutron-l2 lock lifted. nova-compute stays as
    // long as the server is on the host.
    until("the server moved off the host", SOON, String::new, || async {
        let server = admin.server(&id).await.unwrap();
        let on = server["OS-EXT-SRV-ATTR:host"].as_str().unwrap_or_default().to_string();
        let present = openstack.get_opt(&nova_compute).await.unwrap().is_some();
        if on == host {
            assert!(present, "nova-compute evicted while its server is on the host");
            Poll::Pending(format!("on {on}, {}", server["status"]))
        } else {
            Poll::Ready(())
        }
    })
    .await;
    region.wait_phase(&host, Phase::Maintenance, SOON, &coord).await;
    live_migrated_away(&region, &admin, &id, &host, &target).await;
    let svc = admin.service(&host).await.unwrap().unwrap();
    assert!(svc["disabled_reason"].as_str().unwrap().contains("a drain of the Node was refused"), "{svc}");
    wait_locks(&nodes, &host, true).await;
    // nova-compute goes; the network agent waits for the other lock, and
    // the drain with it.
    until("nova-compute evicted", SOON, String::new, || async {
        match (openstack.get_opt(&nova_compute).await.unwrap(), openstack.get_opt(&late).await.unwrap()) {
            (None, None) => Poll::Ready(()),
            (a, b) => Poll::Pending(format!(
                "{:?} {:?}",
                a.map(|p| p.labels().clone()),
                b.map(|p| p.labels().clone())
            )),
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(7)).await; // past a retry of the drain
    assert!(openstack.get_opt(&format!("neutron-l2-{host}")).await.unwrap().is_some(), "held by the lock");
    assert!(drain.try_wait().unwrap().is_none(), "the drain still runs");
    // The lock released: the drain completes by itself.
    nodes.patch(&host, &PatchParams::default(), &Patch::Merge(&lock(serde_json::Value::Null))).await.unwrap();
    let out = tokio::time::timeout(SOON, drain.wait_with_output()).await.expect("drain ends").unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kubectl drain: {stdout}\n{stderr}");
    // Refused with our words while the host had VMs, then by the lock.
    let ours = format!("denied the request: hypervisor {host}: ");
    assert!(stderr.contains(&ours) && stderr.contains("maintenance started"), "{stderr}");
    assert!(stderr.contains(&format!("hypervisor {host}: node lock other-operator held")), "{stderr}");
    assert!(stdout.contains(&format!("node/{host} drained")), "{stdout}");
    for (ns, name) in &pods {
        let api: Api<Pod> = Api::namespaced(region.kube.client.clone(), ns);
        let left = api.get_opt(name).await.unwrap();
        // The DaemonSet's pod stays (--ignore-daemonsets), as a drain leaves it.
        assert_eq!(left.is_some(), ns == "hv-system", "{ns}/{name}");
    }

    // kubectl uncordon: back through its checks to Active, the drain's mark gone.
    let before = region.hypervisor(&host).await.unwrap().status.unwrap().lifecycle.test_run;
    let out = kubectl(&region, &["uncordon", &host]).output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let back = region.wait_phase(&host, Phase::Active, SOON, &coord).await;
    assert!(back.status.unwrap().lifecycle.test_run > before, "checked again");
    assert_eq!(admin.service(&host).await.unwrap().unwrap()["status"], "enabled");
    until("the drain's mark removed", Duration::from_secs(30), String::new, || async {
        let node = nodes.get(&host).await.unwrap();
        if node.annotations().contains_key(DRAIN_REFUSED_ANNOTATION) {
            Poll::Pending("still there".into())
        } else {
            Poll::Ready(())
        }
    })
    .await;
    wait_locks(&nodes, &host, false).await;
    drop(agents);
}

/// A drain guard's pod on `host`: its name, once the scheduler has bound
/// it there and kwok runs it, labelled as `evictable` says (the drain
/// marks').
async fn guard_pod(region: &Region, host: &str, evictable: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(region.kube.client.clone(), "hv-system");
    let of = format!("{}={host}", hv_coordinator::drain::guard::GUARD_OF_LABEL);
    until(&format!("the guard of {host} running, evictable={evictable}"), SOON, String::new, || async {
        let list = pods.list(&kube::api::ListParams::default().labels(&of)).await.unwrap();
        let running: Vec<&Pod> = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .collect();
        match running.as_slice() {
            [p] if p.labels().get(POD_EVICTABLE_LABEL).map(String::as_str) == Some(evictable) => {
                let bound = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
                assert_eq!(bound, Some(host), "bound to its own Node");
                Poll::Ready(p.name_any())
            }
            other => Poll::Pending(format!(
                "{:?}",
                other
                    .iter()
                    .map(|p| (p.name_any(), p.labels().get(POD_EVICTABLE_LABEL).cloned()))
                    .collect::<Vec<_>>()
            )),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_drain_that_skips_daemonset_pods_waits_on_the_guard_until_the_host_is_emptied() {
    let _webhook = WEBHOOK.lock().await;
    let region = Region::start("drain-guard").await;
    let env = region.env.clone();
    let zone = hv_tests::hosts::zone(&env, 1).await;
    let (host, target) = (zone.source.host.clone(), zone.targets[0].host.clone());
    let port = hv_tests::region::free_port();
    // nova-compute from a DaemonSet, as openstack-helm runs it; the guard
    // from the agent's image (kwok runs no image: the name is what counts).
    let hook = webhook_flags(&region, port);
    let flags: Vec<&str> = hook
        .iter()
        .map(String::as_str)
        .chain([
            "--protected-pods",
            "app=nova-compute",
            "--pod-namespace",
            "openstack",
            "--pod-namespace",
            "hv-system",
            "--drain-guard-image",
            "hv-agent:e2e",
        ])
        .collect();
    let coord = region.coordinator(None, &flags);
    let agents = both_active(&region, [&host, &target], &coord).await;
    let admin = Admin::login(&env).await.unwrap();
    let id = zone.boot(&admin, &format!("gdrain-{}", std::process::id()), &host, "1").await;
    let nova_compute = format!("nova-compute-ds-{host}");
    let ds = owner(&region, "openstack", "DaemonSet", "nova-compute-ds", "nova-compute").await;
    pod_on(&region, &host, "openstack", &nova_compute, "nova-compute", ds).await;

    // Each host in service has its guard: a Deployment of this install,
    // owned by its Hypervisor, its pod bound to the host by the scheduler,
    // labelled for the budget as the host's marks say.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(region.kube.client.clone(), "hv-system");
    let guard_name = hv_coordinator::drain::guard::name(&host);
    let made = until("the guard made", SOON, String::new, || async {
        match deployments.get_opt(&guard_name).await.unwrap() {
            Some(d) => Poll::Ready(d),
            None => Poll::Pending("none".to_string()),
        }
    })
    .await;
    let owner_ref = &made.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner_ref.kind.as_str(), owner_ref.name.as_str()), ("Hypervisor", host.as_str()));
    let first_guard = guard_pod(&region, &host, "false").await;
    guard_pod(&region, &target, "false").await;
    // A hand that scales the guard away: it comes back.
    let scale = json!({"spec": {"replicas": 0}});
    deployments.patch(&guard_name, &PatchParams::default(), &Patch::Merge(&scale)).await.unwrap();
    until("the guard scaled back", SOON, String::new, || async {
        let d = deployments.get(&guard_name).await.unwrap();
        let replicas = d.spec.and_then(|s| s.replicas);
        hv_tests::wait::ready_when(replicas == Some(1), replicas)
    })
    .await;
    // (The scaled-down pod may have gone: the guard that stands now.)
    drop(first_guard);
    let first_guard = guard_pod(&region, &host, "false").await;

    // kubectl drain as every update tool runs it: DaemonSet pods skipped.
    chart_webhook(&region, &format!("https://127.0.0.1:{port}/validate-eviction"));
    let started = std::time::Instant::now();
    let mut drain = kubectl(
        &region,
        &["drain", &host, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=300s"],
    )
    .spawn()
    .unwrap();
    let system: Api<Pod> = Api::namespaced(region.kube.client.clone(), "hv-system");
    // The guard stays, and the drain runs, as long as the server is on the host.
    loop {
        let server = admin.server(&id).await.unwrap();
        if server["OS-EXT-SRV-ATTR:host"].as_str() != Some(host.as_str()) {
            break;
        }
        assert!(
            system.get_opt(&first_guard).await.unwrap().is_some(),
            "the guard evicted with a VM on the host"
        );
        assert!(drain.try_wait().unwrap().is_none(), "the drain ended with a VM on the host");
        assert!(started.elapsed() < SOON, "the server never moved: {server}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    region.wait_phase(&host, Phase::Maintenance, SOON, &coord).await;
    live_migrated_away(&region, &admin, &id, &host, &target).await;
    let out = tokio::time::timeout(SOON, drain.wait_with_output()).await.expect("drain ends").unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kubectl drain: {stdout}\n{stderr}");
    let ours = format!("denied the request: hypervisor {host}: ");
    assert!(stderr.contains(&ours) && stderr.contains("maintenance started"), "{stderr}");
    assert!(stdout.contains(&format!("node/{host} drained")), "{stdout}");
    // The guard went: evicted by the drain, or taken away by its scale-down
    // once the host was freed (the drain's eviction then finds it gone).
    assert!(system.get_opt(&first_guard).await.unwrap().is_none(), "{stdout}");
    let openstack: Api<Pod> = Api::namespaced(region.kube.client.clone(), "openstack");
    assert!(openstack.get_opt(&nova_compute).await.unwrap().is_some(), "a DaemonSet's pod stays");
    eprintln!("drain with a VM on the host: {:.1} s", started.elapsed().as_secs_f64());

    // Freed and cordoned, the host keeps no guard (one that came back on
    // the cordoned Node would be evicted again by a drain that lists again);
    // a drain of the host, now in Maintenance, passes at once.
    until("the guard scaled down on the freed, cordoned host", SOON, String::new, || async {
        let d = deployments.get(&guard_name).await.unwrap();
        let (want, have) = (d.spec.and_then(|s| s.replicas), d.status.and_then(|s| s.replicas));
        let of = format!("{}={host}", hv_coordinator::drain::guard::GUARD_OF_LABEL);
        let pods = system.list(&kube::api::ListParams::default().labels(&of)).await.unwrap().items.len();
        hv_tests::wait::ready_when(want == Some(0) && pods == 0, (want, have, pods))
    })
    .await;
    let started = std::time::Instant::now();
    let out =
        kubectl(&region, &["drain", &host, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=30s"])
            .output()
            .await
            .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && !stderr.contains("denied"), "kubectl drain: {stdout}\n{stderr}");
    assert!(stdout.contains(&format!("node/{host} drained")), "{stdout}");
    eprintln!("drain of a host in Maintenance: {:.1} s", started.elapsed().as_secs_f64());

    // Decommissioned, the host's guard goes; the other host keeps its own.
    zone.source.retire();
    let hvs: Api<hv_coordinator::api::Hypervisor> = Api::all(region.kube.client.clone());
    let patch = json!({"spec": {"maintenance": "termination"}});
    hvs.patch(&host, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    region.wait_phase(&host, Phase::Decommissioned, SOON, &coord).await;
    until("the guard removed", SOON, String::new, || async {
        let left = deployments.get_opt(&guard_name).await.unwrap().is_some();
        hv_tests::wait::ready_when(!left, left)
    })
    .await;
    assert!(deployments.get_opt(&hv_coordinator::drain::guard::name(&target)).await.unwrap().is_some());
    drop(agents);
}

/// Cluster API's Machine kind, as its CRD serves it (the shape the
/// coordinator reads: metadata, `status.nodeRef`; the rest kept as given),
/// applied once.
async fn cluster_api_crd(region: &Region) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "machines.cluster.x-k8s.io"},
        "spec": {"group": "cluster.x-k8s.io", "scope": "Namespaced",
            "names": {"kind": "Machine", "listKind": "MachineList", "plural": "machines", "singular": "machine", "shortNames": ["ma"]},
            "versions": [{"name": "v1beta2", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap();
    let api: Api<CustomResourceDefinition> = Api::all(region.kube.client.clone());
    api.patch(
        &crd.metadata.name.clone().unwrap(),
        &PatchParams::apply("hv-e2e").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    until("the Machine CRD established", SOON, String::new, || async {
        let c = api.get("machines.cluster.x-k8s.io").await.unwrap();
        let established = c
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        hv_tests::wait::ready_when(established, established)
    })
    .await;
}

/// Whether `host` still runs the server `id`.
async fn on_host(admin: &Admin, id: &str, host: &str) -> bool {
    admin.server(id).await.unwrap()["OS-EXT-SRV-ATTR:host"].as_str() == Some(host)
}

#[tokio::test(flavor = "multi_thread")]
async fn update_tools_that_announce_themselves_have_the_host_emptied_before_their_drain() {
    let _webhook = WEBHOOK.lock().await;
    let region = Region::start("drain-tools").await;
    let env = region.env.clone();
    let zone = hv_tests::hosts::zone(&env, 2).await;
    let (mcm_host, capi_host, spare) =
        (zone.source.host.clone(), zone.targets[0].host.clone(), zone.targets[1].host.clone());
    let port = hv_tests::region::free_port();
    let hook = webhook_flags(&region, port);
    let flags: Vec<&str> = hook
        .iter()
        .map(String::as_str)
        .chain([
            "--pod-namespace",
            "hv-system",
            "--drain-guard-image",
            "hv-agent:e2e",
            "--update-signal",
            "gardener-mcm:2h",
            "--update-signal",
            "cluster-api",
        ])
        .collect();
    cluster_api_crd(&region).await;
    let coord = region.coordinator(None, &flags);
    let hosts = [mcm_host.clone(), capi_host.clone(), spare.clone()];
    let agents = region.active_with_agents(&hosts, &coord, SOON).await;
    chart_webhook(&region, &format!("https://127.0.0.1:{port}/validate-eviction"));
    let admin = Admin::login(&env).await.unwrap();
    let stamp = std::process::id();
    let a = zone.boot(&admin, &format!("mcm-{stamp}"), &mcm_host, "1").await;
    let b = zone.boot(&admin, &format!("capi-{stamp}"), &capi_host, "1").await;
    let nodes: Api<Node> = Api::all(region.kube.client.clone());
    let guard = guard_pod(&region, &mcm_host, "false").await;

    // Gardener MCM: its condition on the Node as it writes it, 1 h 45 min
    // into its 2 h drain timeout; then its drain (the eviction API, DaemonSet
    // pods skipped), as kubectl drain does it.
    let since = jiff::Timestamp::now() - jiff::SignedDuration::from_mins(105);
    let terminating = json!({"status": {"conditions": [{"type": "Terminating", "status": "True", "reason": "ScaleDown",
        "message": format!("Machine shoot--hv--worker-z1-{mcm_host} is being deleted"),
        "lastHeartbeatTime": since.to_string(), "lastTransitionTime": since.to_string()}]}});
    nodes.patch_status(&mcm_host, &PatchParams::default(), &Patch::Strategic(&terminating)).await.unwrap();
    let mut drain = kubectl(
        &region,
        &["drain", &mcm_host, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=300s"],
    )
    .spawn()
    .unwrap();
    // Told before the tool stops waiting: the condition, a Warning Event,
    // the fleet's least time left under the alert's 30 minutes.
    let near = region.wait_condition(&mcm_host, "UpdateDrain", "DeadlineNear", &coord).await;
    assert!(near.contains("Gardener MCM stops waiting at") && near.contains("1 VMs left"), "{near}");
    let hv = region.hypervisor(&mcm_host).await.unwrap();
    let recorded = hv.status.as_ref().and_then(|s| s.update_drain.clone()).expect("status.updateDrain");
    assert_eq!(
        recorded.stops_waiting_at.0.as_second(),
        (since + jiff::SignedDuration::from_hours(2)).as_second()
    );
    until("a DeadlineNear Event", SOON, String::new, || async {
        let events = region.events_for(&mcm_host).await;
        let told = events.iter().any(|(r, n)| r == "DeadlineNear" && n.contains("Gardener MCM"));
        hv_tests::wait::ready_when(told, events)
    })
    .await;
    let url = coord.metrics.clone().unwrap();
    let left = hv_tests::region::metric(&url, "hv_update_drain_seconds_left").await.unwrap();
    assert!(left > 0.0 && left < 1800.0, "{left}");
    // The drain waits on the guard while the server is there.
    let system: Api<Pod> = Api::namespaced(region.kube.client.clone(), "hv-system");
    while on_host(&admin, &a, &mcm_host).await {
        assert!(system.get_opt(&guard).await.unwrap().is_some(), "the guard evicted with a VM on the host");
        assert!(drain.try_wait().unwrap().is_none(), "MCM's drain ended with a VM on the host");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    region.wait_phase(&mcm_host, Phase::Maintenance, SOON, &coord).await;
    let svc = admin.service(&mcm_host).await.unwrap().unwrap();
    assert!(svc["disabled_reason"].as_str().unwrap().contains("--update-signal"), "{svc}");
    let out = tokio::time::timeout(SOON, drain.wait_with_output()).await.expect("drain ends").unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    region.wait_condition(&mcm_host, "UpdateDrain", "Emptied", &coord).await;
    until("no drain left waiting", SOON, String::new, || async {
        let left = hv_tests::region::metric(&url, "hv_update_drain_seconds_left").await;
        hv_tests::wait::ready_when(left == Some(f64::INFINITY), left)
    })
    .await;

    // Cluster API: the Machine of a hypervisor carries our pre-drain hook.
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"));
    let ns = format!("capi-{}", region.id);
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(region.kube.client.clone());
    namespaces
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap())
        .await
        .unwrap();
    let machines: Api<DynamicObject> = Api::namespaced_with(region.kube.client.clone(), &ns, &ar);
    let name = format!("hv-md-0-{capi_host}");
    // Cluster API names a workload Node's Machine on the Node.
    let linked = json!({"metadata": {"annotations": {"cluster.x-k8s.io/machine": name, "cluster.x-k8s.io/cluster-namespace": ns,
        "cluster.x-k8s.io/cluster-name": "region", "cluster.x-k8s.io/owner-kind": "MachineSet", "cluster.x-k8s.io/owner-name": "hv-md-0-7d9f"}}});
    nodes.patch(&capi_host, &PatchParams::default(), &Patch::Merge(&linked)).await.unwrap();
    let machine = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": name, "finalizers": ["machine.cluster.x-k8s.io"],
            "labels": {"cluster.x-k8s.io/cluster-name": "region", "cluster.x-k8s.io/deployment-name": "hv-md-0"}},
        "spec": {"clusterName": "region", "version": "v1.35.4", "providerID": format!("metal3://{capi_host}"),
            "bootstrap": {"dataSecretName": format!("{name}-bootstrap")},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Machine", "name": name}}});
    machines.create(&PostParams::default(), &serde_json::from_value(machine).unwrap()).await.unwrap();
    let node_ref = json!({"status": {"nodeRef": {"name": capi_host}, "phase": "Running"}});
    machines.patch_status(&name, &PatchParams::default(), &Patch::Merge(&node_ref)).await.unwrap();
    let hook = hv_coordinator::api::keys::CLUSTER_API_HOOK_ANNOTATION;
    let hooked = |present: bool| {
        let (machines, name) = (machines.clone(), name.clone());
        async move {
            let m = machines.get(&name).await.unwrap();
            let has = m.annotations().contains_key(hook);
            hv_tests::wait::ready_when(has == present, m.annotations().clone())
        }
    };
    // Another cluster's Machine whose Node shares the name (a management
    // cluster serves several): not ours, never hooked.
    let other_ns = format!("capi-other-{}", region.id);
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": other_ns}})).unwrap(),
        )
        .await
        .unwrap();
    let foreign: Api<DynamicObject> = Api::namespaced_with(region.kube.client.clone(), &other_ns, &ar);
    let other = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": {"name": name},
        "spec": {"clusterName": "other", "bootstrap": {"dataSecretName": "x"},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Machine", "name": name}}});
    foreign.create(&PostParams::default(), &serde_json::from_value(other).unwrap()).await.unwrap();
    foreign.patch_status(&name, &PatchParams::default(), &Patch::Merge(&node_ref)).await.unwrap();
    until("our hook on the Machine", SOON, || coord.tail(20), || hooked(true)).await;
    tokio::time::sleep(Duration::from_secs(3)).await; // past a look at every Machine
    let untouched = foreign.get(&name).await.unwrap();
    assert!(!untouched.annotations().contains_key(hook), "another cluster's Machine is never hooked");
    // Cluster API deletes it (a rolling update): held by its finalizer, it
    // waits on our hook; the host is emptied first.
    machines.delete(&name, &Default::default()).await.unwrap();
    let mark = hv_coordinator::api::keys::MACHINE_DELETING_ANNOTATION;
    until(
        "the deletion read as an update's ask",
        SOON,
        || coord.tail(20),
        || async {
            let node = nodes.get(&capi_host).await.unwrap();
            let value = node.annotations().get(mark).cloned();
            hv_tests::wait::ready_when(value.as_deref() == Some(format!("{ns}/{name}").as_str()), value)
        },
    )
    .await;
    while on_host(&admin, &b, &capi_host).await || on_host(&admin, &a, &capi_host).await {
        let m = machines.get(&name).await.unwrap();
        assert!(m.annotations().contains_key(hook), "the hook lifted with a VM on the host");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    region.wait_phase(&capi_host, Phase::Maintenance, SOON, &coord).await;
    until("our hook lifted", SOON, || coord.tail(20), || hooked(false)).await;
    // Cluster API's drain then passes at once.
    let out = kubectl(
        &region,
        &["drain", &capi_host, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=30s"],
    )
    .output()
    .await
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for id in [&a, &b] {
        assert_eq!(admin.server(id).await.unwrap()["status"], "ACTIVE");
        assert!(on_host(&admin, id, &spare).await, "{id} on the one host left in service");
    }
    // The Machine gone, the Node's mark goes with it.
    let done = json!({"metadata": {"finalizers": null}});
    machines.patch(&name, &PatchParams::default(), &Patch::Merge(&done)).await.unwrap();
    until(
        "the mark removed",
        SOON,
        || coord.tail(20),
        || async {
            let node = nodes.get(&capi_host).await.unwrap();
            let marked = node.annotations().contains_key(mark);
            hv_tests::wait::ready_when(!marked, marked)
        },
    )
    .await;
    drop(agents);
}
