//! The Kubernetes API stand-in on its own, driven by unmodified kube-rs
//! clients and a real `kube::runtime::Controller`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use hv_coordinator::api::hypervisor::HypervisorStatus;
use hv_coordinator::api::{Hypervisor, HypervisorSpec, MaintenanceMode, Phase};
use hv_tests::kube_standin::StandIn;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::controller::{Action, Controller};
use serde_json::json;

async fn standin() -> (StandIn, kube::Client) {
    let s = StandIn::start(&hv_tests::repo_root().join("deploy/crds"), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let c = s.client().unwrap();
    (s, c)
}

fn hv(name: &str) -> Hypervisor {
    Hypervisor::new(name, HypervisorSpec { aggregates: vec!["az-a".into()], ..HypervisorSpec::default() })
}

fn code(e: &kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("not an API error: {other:?}"),
    }
}

#[tokio::test]
async fn a_watch_sees_a_hypervisor_change() {
    let (_s, c) = standin().await;
    let api: Api<Hypervisor> = Api::all(c);
    let created = api.create(&PostParams::default(), &hv("node-1")).await.unwrap();
    let rv = created.metadata.resource_version.clone().unwrap();
    let mut stream = api.watch(&WatchParams::default().timeout(10), &rv).await.unwrap().boxed();
    let patch = json!({"spec": {"maintenance": "auto"}});
    api.patch("node-1", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(8), stream.next()).await.unwrap().unwrap().unwrap();
        match ev {
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Modified(h) => break assert_eq!(h.spec.maintenance, MaintenanceMode::Auto),
            other => panic!("expected MODIFIED, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn status_is_a_separate_subresource_and_generation_follows_spec() {
    let (_s, c) = standin().await;
    let api: Api<Hypervisor> = Api::all(c);
    api.create(&PostParams::default(), &hv("node-1")).await.unwrap();
    // A status write changes status only, and not the generation.
    let st = json!({"status": {"phase": "Onboarding"}, "spec": {"skipTests": true}});
    let h = api.patch_status("node-1", &PatchParams::default(), &Patch::Merge(&st)).await.unwrap();
    assert_eq!(h.status.as_ref().and_then(|s| s.phase), Some(Phase::Onboarding));
    assert!(!h.spec.skip_tests, "a /status write must not change spec");
    assert_eq!(h.metadata.generation, Some(1));
    // A main-resource write changes spec, bumps the generation, keeps status.
    let sp = json!({"spec": {"skipTests": true}, "status": {"phase": "Active"}});
    let h = api.patch("node-1", &PatchParams::default(), &Patch::Merge(&sp)).await.unwrap();
    assert!(h.spec.skip_tests);
    assert_eq!(h.metadata.generation, Some(2));
    assert_eq!(h.status.and_then(|s| s.phase), Some(Phase::Onboarding));
    // A label change is not a spec change.
    let lbl = json!({"metadata": {"labels": {"a": "b"}}});
    let h = api.patch("node-1", &PatchParams::default(), &Patch::Merge(&lbl)).await.unwrap();
    assert_eq!(h.metadata.generation, Some(2));
}

#[tokio::test]
async fn server_side_apply_merges_conditions_by_type() {
    let (_s, c) = standin().await;
    let api: Api<Hypervisor> = Api::all(c);
    let apply = |manager: &str| PatchParams::apply(manager).force();
    let obj = json!({"apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Hypervisor", "metadata": {"name": "node-1"},
                     "spec": {"aggregates": ["az-a"]}});
    let h = api.patch("node-1", &apply("hv-coordinator"), &Patch::Apply(&obj)).await.unwrap();
    assert_eq!(h.spec.aggregates, vec!["az-a"], "apply creates a missing object");
    let cond = |t: &str, s: &str| json!({"type": t, "status": s, "reason": "R", "message": "", "lastTransitionTime": "2026-11-22T00:00:00Z"});
    let a = json!({"apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Hypervisor", "metadata": {"name": "node-1"},
                   "status": {"phase": "Active", "conditions": [cond("Tested", "True")]}});
    api.patch_status("node-1", &apply("lifecycle"), &Patch::Apply(&a)).await.unwrap();
    let b = json!({"apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Hypervisor", "metadata": {"name": "node-1"},
                   "status": {"conditions": [cond("AgentConnected", "True")]}});
    let h = api.patch_status("node-1", &apply("fleet"), &Patch::Apply(&b)).await.unwrap();
    let st: HypervisorStatus = h.status.unwrap();
    let types: Vec<&str> = st.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, vec!["Tested", "AgentConnected"], "each owner's condition survives the other's apply");
    assert_eq!(st.phase, Some(Phase::Active));
    let again = json!({"apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Hypervisor", "metadata": {"name": "node-1"},
                       "status": {"conditions": [cond("Tested", "False")]}});
    let h = api.patch_status("node-1", &apply("lifecycle"), &Patch::Apply(&again)).await.unwrap();
    let conds = h.status.unwrap().conditions;
    assert_eq!(conds.len(), 2);
    assert_eq!(conds[0].status, "False");
}

#[tokio::test]
async fn a_stale_resource_version_is_a_conflict() {
    let (_s, c) = standin().await;
    let api: Api<Hypervisor> = Api::all(c);
    let old = api.create(&PostParams::default(), &hv("node-1")).await.unwrap();
    let mut newer = old.clone();
    newer.spec.skip_tests = true;
    api.replace("node-1", &PostParams::default(), &newer).await.unwrap();
    let mut stale = old.clone();
    stale.spec.aggregates = vec!["az-b".into()];
    let err = api.replace("node-1", &PostParams::default(), &stale).await.unwrap_err();
    assert_eq!(code(&err), 409);
    let err = api.create(&PostParams::default(), &hv("node-1")).await.unwrap_err();
    assert_eq!(code(&err), 409, "AlreadyExists");
    let err = api.get("nope").await.unwrap_err();
    assert_eq!(code(&err), 404);
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let (_s, c) = standin().await;
    let api: Api<Hypervisor> = Api::all(c);
    let mut h = hv("node-1");
    h.metadata.finalizers = Some(vec!["hypervisor.cloud.sap/lifecycle".into()]);
    api.create(&PostParams::default(), &h).await.unwrap();
    api.delete("node-1", &DeleteParams::default()).await.unwrap();
    let marked = api.get("node-1").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    let p: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "hypervisor.cloud.sap/lifecycle"},
        {"op": "remove", "path": "/metadata/finalizers/0"}
    ]))
    .unwrap();
    api.patch("node-1", &PatchParams::default(), &Patch::<()>::Json(p)).await.unwrap();
    assert_eq!(code(&api.get("node-1").await.unwrap_err()), 404);
}

/// kubectl cordon's strategic merge patch is served as a merge patch; one
/// with directives, which the stand-in cannot honour, is refused.
#[tokio::test]
async fn strategic_merge_patch_without_directives_is_a_merge_patch() {
    let (_s, c) = standin().await;
    let nodes: Api<Node> = Api::all(c);
    let n: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
    nodes.create(&PostParams::default(), &n).await.unwrap();
    let cordon = Patch::Strategic(json!({"spec": {"unschedulable": true}}));
    let cordoned = nodes.patch("n1", &PatchParams::default(), &cordon).await.unwrap();
    assert_eq!(cordoned.spec.unwrap().unschedulable, Some(true));
    let uncordon = Patch::Strategic(json!({"spec": {"unschedulable": null}}));
    let back = nodes.patch("n1", &PatchParams::default(), &uncordon).await.unwrap();
    assert_eq!(back.spec.and_then(|s| s.unschedulable), None);
    let directive = Patch::Strategic(json!({"spec": {"taints": [{"$patch": "delete", "key": "k"}]}}));
    let err = nodes.patch("n1", &PatchParams::default(), &directive).await;
    assert_eq!(code(&err.unwrap_err()), 415);
}

#[tokio::test]
async fn nodes_by_label_and_leases() {
    let (_s, c) = standin().await;
    let nodes: Api<Node> = Api::all(c.clone());
    for (name, role) in [("hv-1", "hypervisor"), ("hv-2", "hypervisor"), ("ctl-1", "control")] {
        let n: Node =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"role": role}}})).unwrap();
        nodes.create(&PostParams::default(), &n).await.unwrap();
    }
    let hvs = nodes.list(&ListParams::default().labels("role=hypervisor")).await.unwrap();
    let names: Vec<String> = hvs.items.iter().filter_map(|n| n.metadata.name.clone()).collect();
    assert_eq!(names, vec!["hv-1", "hv-2"]);
    let leases: Api<Lease> = Api::namespaced(c, "hv-system");
    let l: Lease = serde_json::from_value(json!({"metadata": {"name": "hv-coordinator"},
        "spec": {"holderIdentity": "pod-a", "leaseDurationSeconds": 15}}))
    .unwrap();
    let l = leases.create(&PostParams::default(), &l).await.unwrap();
    let mut taken = l.clone();
    taken.spec.as_mut().unwrap().holder_identity = Some("pod-b".into());
    leases.replace("hv-coordinator", &PostParams::default(), &taken).await.unwrap();
    // pod-a, holding the old version, cannot take it back.
    let err = leases.replace("hv-coordinator", &PostParams::default(), &l).await.unwrap_err();
    assert_eq!(code(&err), 409);
}

#[tokio::test]
async fn a_watch_from_a_forgotten_version_is_gone() {
    let s = StandIn::start_with_history(
        &hv_tests::repo_root().join("deploy/crds"),
        "127.0.0.1:0".parse().unwrap(),
        3,
    )
    .await
    .unwrap();
    let api: Api<Hypervisor> = Api::all(s.client().unwrap());
    for i in 0..6 {
        api.create(&PostParams::default(), &hv(&format!("node-{i}"))).await.unwrap();
    }
    let mut stream = api.watch(&WatchParams::default().timeout(5), "2").await.unwrap().boxed();
    match stream.next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("expected 410 Gone, got {other:?}"),
    }
}

#[tokio::test]
async fn discovery_finds_the_crds() {
    let (_s, c) = standin().await;
    let d = kube::discovery::Discovery::new(c).run().await.unwrap();
    let found: Vec<String> =
        d.groups().flat_map(|g| g.recommended_resources().into_iter().map(|(r, _)| r.plural)).collect();
    for want in ["hypervisors", "evictions", "migrations", "nodes", "leases"] {
        assert!(found.iter().any(|f| f == want), "{want} missing: {found:?}");
    }
}

#[tokio::test]
async fn a_kube_runtime_controller_runs_unchanged() {
    let (_s, c) = standin().await;
    let api: Api<Hypervisor> = Api::all(c.clone());
    let reconcile = |h: Arc<Hypervisor>, api: Arc<Api<Hypervisor>>| async move {
        let name = h.metadata.name.clone().unwrap_or_default();
        if h.status.as_ref().and_then(|s| s.phase).is_none() {
            let st = json!({"status": {"phase": "Onboarding"}});
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&st)).await?;
        }
        Ok::<_, kube::Error>(Action::await_change())
    };
    let ctl = Controller::new(api.clone(), Default::default())
        .run(reconcile, |_, _, _| Action::requeue(Duration::from_secs(1)), Arc::new(api.clone()))
        .for_each(|_| async {});
    let handle = tokio::spawn(ctl);
    for i in 0..3 {
        api.create(&PostParams::default(), &hv(&format!("node-{i}"))).await.unwrap();
    }
    hv_tests::wait::until(
        "the controller to reconcile all 3",
        Duration::from_secs(10),
        String::new,
        || async {
            let all = api.list(&ListParams::default()).await.unwrap();
            let done = all
                .items
                .iter()
                .filter(|h| h.status.as_ref().and_then(|s| s.phase) == Some(Phase::Onboarding))
                .count();
            hv_tests::wait::ready_when(done == 3, done)
        },
    )
    .await;
    handle.abort();
}

/// Server-side apply with field ownership, as the API server documents it
/// ("Server-Side Apply": a field a manager applied and now omits is removed
/// unless someone else owns it; another applier's field is a conflict unless
/// forced, and forcing takes it over).
#[tokio::test]
async fn apply_removes_what_a_manager_stopped_applying_and_keeps_what_others_own() {
    let (_s, c) = standin().await;
    let api: Api<Hypervisor> = Api::all(c);
    api.create(&PostParams::default(), &hv("node-1")).await.unwrap();
    let apply = |manager: &'static str, force: bool| {
        let pp = PatchParams::apply(manager);
        if force { pp.force() } else { pp }
    };
    let status = |s: serde_json::Value| json!({"apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Hypervisor", "status": s});
    let cond = |t: &str, s: &str| json!({"type": t, "status": s, "reason": "R", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"});
    // Two managers own different fields.
    let a = status(
        json!({"phase": "Evicting", "hypervisorVersion": "QEMU 8", "conditions": [cond("Onboarded", "True")]}),
    );
    api.patch_status("node-1", &apply("lifecycle", false), &Patch::Apply(&a)).await.unwrap();
    let b = status(json!({"agent": {"connected": true}, "conditions": [cond("AgentConnected", "True")]}));
    api.patch_status("node-1", &apply("fleet", false), &Patch::Apply(&b)).await.unwrap();
    // The first omits hypervisorVersion and its condition: both go, the
    // other manager's stay.
    let a2 = status(json!({"phase": "Maintenance"}));
    let h = api.patch_status("node-1", &apply("lifecycle", false), &Patch::Apply(&a2)).await.unwrap();
    let st = h.status.unwrap();
    assert_eq!(st.phase, Some(Phase::Maintenance));
    assert_eq!(st.hypervisor_version, None, "a field the manager stopped applying is removed");
    let types: Vec<&str> = st.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, vec!["AgentConnected"], "the other manager's condition stays");
    assert_eq!(st.agent.map(|a| a.connected), Some(true));
    // Setting the other's field to another value: a conflict, unless forced.
    let grab = status(json!({"agent": {"connected": false}}));
    let e = api.patch_status("node-1", &apply("lifecycle", false), &Patch::Apply(&grab)).await.unwrap_err();
    assert_eq!(code(&e), 409, "{e}");
    assert!(e.to_string().contains("fleet") && e.to_string().contains(".status.agent.connected"), "{e}");
    let h = api.patch_status("node-1", &apply("lifecycle", true), &Patch::Apply(&grab)).await.unwrap();
    assert_eq!(h.status.unwrap().agent.map(|a| a.connected), Some(false));
    // Taken over: when the lifecycle now omits it, it goes, though the fleet
    // once applied it.
    let h = api.patch_status("node-1", &apply("lifecycle", false), &Patch::Apply(&a2)).await.unwrap();
    assert_eq!(h.status.unwrap().agent.map(|a| a.connected), None);
    // The same value is no conflict: shared ownership, kept while either applies it.
    let both = status(json!({"phase": "Maintenance"}));
    api.patch_status("node-1", &apply("fleet", false), &Patch::Apply(&both)).await.unwrap();
    let h = api
        .patch_status("node-1", &apply("lifecycle", false), &Patch::Apply(&status(json!({}))))
        .await
        .unwrap();
    assert_eq!(h.status.unwrap().phase, Some(Phase::Maintenance), "still owned by the fleet");
}

/// The garbage collector (the API server's "Garbage Collection" doc): when
/// an owner goes, its dependents are deleted in the background (their own
/// finalizers respected), or orphaned with `propagationPolicy: Orphan`; a
/// dependent whose owner reference was removed stays.
#[tokio::test]
async fn owners_going_take_their_dependents_or_orphan_them() {
    use hv_coordinator::api::eviction::{Eviction, EvictionReason, EvictionSpec};
    use kube::Resource;
    let (_s, c) = standin().await;
    let nodes: Api<Node> = Api::all(c.clone());
    let hvs: Api<Hypervisor> = Api::all(c.clone());
    let evs: Api<Eviction> = Api::all(c.clone());
    let owned =
        |owner: &dyn Fn() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference| vec![owner()];
    for name in ["n1", "n2", "n3"] {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        let n = nodes.create(&PostParams::default(), &n).await.unwrap();
        let mut h = hv(name);
        h.metadata.owner_references = Some(owned(&|| n.controller_owner_ref(&()).unwrap()));
        let h = hvs.create(&PostParams::default(), &h).await.unwrap();
        let mut e = Eviction::new(
            &format!("{name}-ev"),
            EvictionSpec {
                hypervisor: name.into(),
                reason: EvictionReason::AdminRequest,
                options: Default::default(),
            },
        );
        e.metadata.owner_references = Some(owned(&|| h.controller_owner_ref(&()).unwrap()));
        e.metadata.finalizers = Some(vec!["hypervisor.cloud.sap/eviction".into()]);
        evs.create(&PostParams::default(), &e).await.unwrap();
    }
    // Background: the Hypervisor goes; its Eviction is held by its finalizer.
    nodes.delete("n1", &DeleteParams::default()).await.unwrap();
    assert!(hvs.get_opt("n1").await.unwrap().is_none(), "dependent deleted with its owner");
    let e = evs.get("n1-ev").await.unwrap();
    assert!(e.metadata.deletion_timestamp.is_some(), "marked; its finalizer holds it");
    let rm = json!({"metadata": {"finalizers": null}});
    evs.patch("n1-ev", &PatchParams::default(), &Patch::Merge(&rm)).await.unwrap();
    assert!(evs.get_opt("n1-ev").await.unwrap().is_none());
    // Orphan: the Hypervisor stays, without the reference.
    nodes
        .delete(
            "n2",
            &DeleteParams {
                propagation_policy: Some(kube::api::PropagationPolicy::Orphan),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let h = hvs.get("n2").await.unwrap();
    assert!(h.metadata.owner_references.unwrap_or_default().is_empty());
    // A reference removed before the owner goes: the dependent stays.
    let drop_ref = json!({"metadata": {"ownerReferences": null}});
    hvs.patch("n3", &PatchParams::default(), &Patch::Merge(&drop_ref)).await.unwrap();
    nodes.delete("n3", &DeleteParams::default()).await.unwrap();
    assert!(hvs.get_opt("n3").await.unwrap().is_some(), "no longer a dependent");
    assert!(evs.get_opt("n3-ev").await.unwrap().is_some());
}

/// An object with two owners (the API server's "Garbage Collection" doc: a
/// dependent is deleted once none of its owners is left): the first owner
/// going removes only its reference; the second going deletes it.
#[tokio::test]
async fn a_dependent_with_two_owners_goes_only_with_the_last() {
    use kube::Resource;
    let (_s, c) = standin().await;
    let nodes: Api<Node> = Api::all(c.clone());
    let hvs: Api<Hypervisor> = Api::all(c.clone());
    let mut refs = vec![];
    for name in ["owner-a", "owner-b"] {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        let n = nodes.create(&PostParams::default(), &n).await.unwrap();
        let mut r = n.controller_owner_ref(&()).unwrap();
        r.controller = Some(name == "owner-a"); // at most one controller
        refs.push(r);
    }
    let mut h = hv("shared");
    h.metadata.owner_references = Some(refs);
    hvs.create(&PostParams::default(), &h).await.unwrap();

    nodes.delete("owner-a", &DeleteParams::default()).await.unwrap();
    let h = hvs.get_opt("shared").await.unwrap().expect("kept while owner-b exists");
    let left: Vec<_> = h.metadata.owner_references.unwrap_or_default().into_iter().map(|r| r.name).collect();
    assert_eq!(left, ["owner-b"], "only the gone owner's reference is removed");

    nodes.delete("owner-b", &DeleteParams::default()).await.unwrap();
    assert!(hvs.get_opt("shared").await.unwrap().is_none(), "deleted with its last owner");

    // An owner that no longer exists does not keep a dependent alive.
    let mut n = Node::default();
    n.metadata.name = Some("owner-c".into());
    let n = nodes.create(&PostParams::default(), &n).await.unwrap();
    let mut dangling = n.controller_owner_ref(&()).unwrap();
    dangling.controller = Some(false);
    dangling.name = "long-gone".into();
    dangling.uid = "uid-of-a-node-deleted-long-ago".into();
    let mut h = hv("half-orphaned");
    h.metadata.owner_references = Some(vec![n.controller_owner_ref(&()).unwrap(), dangling]);
    hvs.create(&PostParams::default(), &h).await.unwrap();
    nodes.delete("owner-c", &DeleteParams::default()).await.unwrap();
    assert!(hvs.get_opt("half-orphaned").await.unwrap().is_none(), "its only live owner went");
}

/// The eviction subresource as `kubectl drain` uses it: a pod without a
/// budget goes; a budget's arithmetic over its Ready pods decides; a dry run
/// deletes nothing; a name that does not match the URL is refused. Raw
/// requests: kube's client would retry a 429 for minutes.
#[tokio::test]
async fn evictions_check_the_pods_budget() {
    let (s, c) = standin().await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.clone(), "ns");
    for (name, app, ready) in
        [("a-1", "a", true), ("a-2", "a", true), ("a-3", "a", false), ("free", "b", true)]
    {
        let pod = json!({"metadata": {"name": name, "labels": {"app": app}},
            "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "i"}]},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
        pods.create(&PostParams::default(), &serde_json::from_value(pod).unwrap()).await.unwrap();
    }
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> = Api::namespaced(c, "ns");
    let pdb = json!({"metadata": {"name": "a"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "a"}}}});
    pdbs.create(&PostParams::default(), &serde_json::from_value(pdb).unwrap()).await.unwrap();
    let http = reqwest::Client::new();
    let evict = |name: &str, body: serde_json::Value| {
        http.post(format!("{}/api/v1/namespaces/ns/pods/{name}/eviction", s.url())).json(&body).send()
    };
    let eviction =
        |name: &str| json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}});
    // Discovery says evictions are served, so kubectl drain evicts.
    let core: serde_json::Value =
        http.get(format!("{}/api/v1", s.url())).send().await.unwrap().json().await.unwrap();
    assert!(
        core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "pods/eviction" && r["group"] == "policy")
    );
    // Two Ready of three, at least two available: none may go.
    let r = evict("a-1", eviction("a-1")).await.unwrap();
    assert_eq!(r.status().as_u16(), 429);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["reason"], "TooManyRequests");
    assert!(pods.get_opt("a-1").await.unwrap().is_some());
    // No budget: evicted, deleted.
    assert_eq!(evict("free", eviction("free")).await.unwrap().status().as_u16(), 201);
    assert!(pods.get_opt("free").await.unwrap().is_none());
    // The budget loosened: one may go; a dry run first deletes nothing.
    pdbs.patch("a", &PatchParams::default(), &Patch::Merge(json!({"spec": {"minAvailable": 1}})))
        .await
        .unwrap();
    let mut dry = eviction("a-1");
    dry["deleteOptions"] = json!({"dryRun": ["All"]});
    assert_eq!(evict("a-1", dry).await.unwrap().status().as_u16(), 201);
    assert!(pods.get_opt("a-1").await.unwrap().is_some(), "a dry run");
    assert_eq!(evict("a-1", eviction("a-2")).await.unwrap().status().as_u16(), 400, "name mismatch");
    assert_eq!(evict("a-1", eviction("a-1")).await.unwrap().status().as_u16(), 201);
    assert_eq!(
        evict("a-2", eviction("a-2")).await.unwrap().status().as_u16(),
        429,
        "one Ready left, one required"
    );
    assert_eq!(evict("gone", eviction("gone")).await.unwrap().status().as_u16(), 404);
}
