//! What this project relies on from the Kubernetes API server, shown on the
//! ground's real one (tests/env/peers/kube.sh) with unmodified kube-rs
//! clients and a real `kube::runtime::Controller`: watches, the status
//! subresource and generations, server-side apply's field ownership,
//! optimistic locking, finalizers, strategic merge patches, Leases, the CEL
//! rules of our CRDs, 410 Gone after etcd's compaction and a watcher listing
//! again on it, the chart's FlowSchema for the coordinator's Lease, garbage
//! collection (background, foreground, orphans, two owners) and the eviction
//! API with its disruption budgets.
//!
//! Tests run at once on one API server: every object's name carries the
//! test's own prefix.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use hv_coordinator::api::hypervisor::HypervisorStatus;
use hv_coordinator::api::{Hypervisor, HypervisorSpec, MaintenanceMode, Phase};
use hv_tests::wait::{Poll, until};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;

const SOON: Duration = Duration::from_secs(60);

/// The ground's API server as its administrator, and a name prefix of this
/// test's own.
async fn api(test: &str) -> (kube::Client, String) {
    let env = hv_tests::env::require();
    let target = hv_tests::kube_target::admin(&env).await.unwrap();
    (target.client, format!("{test}-{}", std::process::id()))
}

fn hv(name: &str) -> Hypervisor {
    Hypervisor::new(name, HypervisorSpec { aggregates: vec!["az-a".into()], ..HypervisorSpec::default() })
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

fn code(e: &kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("not an API error: {other:?}"),
    }
}

/// Waits until `name` is gone from `api`.
async fn gone<K>(api: &Api<K>, name: &str, what: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    until(what, SOON, String::new, || async {
        match api.get_opt(name).await.unwrap() {
            None => Poll::Ready(()),
            Some(_) => Poll::Pending(format!("{name} still there")),
        }
    })
    .await;
}

#[tokio::test]
async fn a_watch_sees_a_hypervisor_change() {
    let (c, p) = api("watch").await;
    let name = format!("{p}-1");
    let api: Api<Hypervisor> = Api::all(c);
    let created = api.create(&PostParams::default(), &hv(&name)).await.unwrap();
    let rv = created.metadata.resource_version.clone().unwrap();
    let wp = WatchParams::default().fields(&format!("metadata.name={name}")).timeout(10);
    let mut stream = api.watch(&wp, &rv).await.unwrap().boxed();
    let patch = json!({"spec": {"maintenance": "auto"}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(8), stream.next()).await.unwrap().unwrap().unwrap();
        match ev {
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Modified(h) => break assert_eq!(h.spec.maintenance, MaintenanceMode::Auto),
            other => panic!("expected MODIFIED, got {other:?}"),
        }
    }
    api.delete(&name, &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn status_is_a_separate_subresource_and_generation_follows_spec() {
    let (c, p) = api("status").await;
    let name = format!("{p}-1");
    let api: Api<Hypervisor> = Api::all(c);
    api.create(&PostParams::default(), &hv(&name)).await.unwrap();
    // A status write changes status only, and not the generation.
    let st = json!({"status": {"phase": "Onboarding"}, "spec": {"skipTests": true}});
    let h = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&st)).await.unwrap();
    assert_eq!(h.status.as_ref().and_then(|s| s.phase), Some(Phase::Onboarding));
    assert!(!h.spec.skip_tests, "a /status write must not change spec");
    assert_eq!(h.metadata.generation, Some(1));
    // A main-resource write changes spec, bumps the generation, keeps status.
    let sp = json!({"spec": {"skipTests": true}, "status": {"phase": "Active"}});
    let h = api.patch(&name, &PatchParams::default(), &Patch::Merge(&sp)).await.unwrap();
    assert!(h.spec.skip_tests);
    assert_eq!(h.metadata.generation, Some(2));
    assert_eq!(h.status.and_then(|s| s.phase), Some(Phase::Onboarding));
    // A label change is not a spec change.
    let lbl = json!({"metadata": {"labels": {"a": "b"}}});
    let h = api.patch(&name, &PatchParams::default(), &Patch::Merge(&lbl)).await.unwrap();
    assert_eq!(h.metadata.generation, Some(2));
    api.delete(&name, &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn server_side_apply_merges_conditions_by_type() {
    let (c, p) = api("ssa-merge").await;
    let name = format!("{p}-1");
    let api: Api<Hypervisor> = Api::all(c);
    let apply = |manager: &str| PatchParams::apply(manager).force();
    let obj = |body: serde_json::Value| {
        let mut o = json!({"apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Hypervisor", "metadata": {"name": name}});
        o.as_object_mut().unwrap().extend(body.as_object().unwrap().clone());
        o
    };
    let h = api
        .patch(
            &name,
            &apply("hv-coordinator"),
            &Patch::Apply(&obj(json!({"spec": {"aggregates": ["az-a"]}}))),
        )
        .await
        .unwrap();
    assert_eq!(h.spec.aggregates, vec!["az-a"], "apply creates a missing object");
    let cond = |t: &str, s: &str| json!({"type": t, "status": s, "reason": "R", "message": "", "lastTransitionTime": "2026-11-22T00:00:00Z"});
    let a = obj(json!({"status": {"phase": "Active", "conditions": [cond("Tested", "True")]}}));
    api.patch_status(&name, &apply("lifecycle"), &Patch::Apply(&a)).await.unwrap();
    let b = obj(json!({"status": {"conditions": [cond("AgentConnected", "True")]}}));
    let h = api.patch_status(&name, &apply("fleet"), &Patch::Apply(&b)).await.unwrap();
    let st: HypervisorStatus = h.status.unwrap();
    let types: Vec<&str> = st.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, vec!["Tested", "AgentConnected"], "each owner's condition survives the other's apply");
    assert_eq!(st.phase, Some(Phase::Active));
    let again = obj(json!({"status": {"conditions": [cond("Tested", "False")]}}));
    let h = api.patch_status(&name, &apply("lifecycle"), &Patch::Apply(&again)).await.unwrap();
    let conds = h.status.unwrap().conditions;
    assert_eq!(conds.len(), 2);
    assert_eq!(conds[0].status, "False");
    api.delete(&name, &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn a_stale_resource_version_is_a_conflict() {
    let (c, p) = api("conflict").await;
    let name = format!("{p}-1");
    let api: Api<Hypervisor> = Api::all(c);
    let old = api.create(&PostParams::default(), &hv(&name)).await.unwrap();
    let mut newer = old.clone();
    newer.spec.skip_tests = true;
    api.replace(&name, &PostParams::default(), &newer).await.unwrap();
    let mut stale = old.clone();
    stale.spec.aggregates = vec!["az-b".into()];
    let err = api.replace(&name, &PostParams::default(), &stale).await.unwrap_err();
    assert_eq!(code(&err), 409);
    let err = api.create(&PostParams::default(), &hv(&name)).await.unwrap_err();
    assert_eq!(code(&err), 409, "AlreadyExists");
    let err = api.get(&format!("{p}-nope")).await.unwrap_err();
    assert_eq!(code(&err), 404);
    api.delete(&name, &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let (c, p) = api("finalizer").await;
    let name = format!("{p}-1");
    let api: Api<Hypervisor> = Api::all(c);
    let mut h = hv(&name);
    h.metadata.finalizers = Some(vec!["hypervisor.cloud.sap/lifecycle".into()]);
    api.create(&PostParams::default(), &h).await.unwrap();
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    let marked = api.get(&name).await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    let p: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "hypervisor.cloud.sap/lifecycle"},
        {"op": "remove", "path": "/metadata/finalizers/0"}
    ]))
    .unwrap();
    api.patch(&name, &PatchParams::default(), &Patch::<()>::Json(p)).await.unwrap();
    gone(&api, &name, "deleted once its finalizer is removed").await;
}

/// kubectl cordon's strategic merge patch on a Node, and a strategic merge
/// of a keyed list (a Node's conditions, by type) with a delete directive;
/// our own types take merge patches only (the API server refuses a
/// strategic one on a custom resource).
#[tokio::test]
async fn strategic_merge_patches_on_nodes_merge_patches_on_ours() {
    let (c, p) = api("smp").await;
    let name = format!("{p}-n1");
    let nodes: Api<Node> = Api::all(c.clone());
    nodes.create(&PostParams::default(), &node(&name)).await.unwrap();
    let cordon = Patch::Strategic(json!({"spec": {"unschedulable": true}}));
    let cordoned = nodes.patch(&name, &PatchParams::default(), &cordon).await.unwrap();
    assert_eq!(cordoned.spec.unwrap().unschedulable, Some(true));
    let uncordon = Patch::Strategic(json!({"spec": {"unschedulable": null}}));
    let back = nodes.patch(&name, &PatchParams::default(), &uncordon).await.unwrap();
    assert_eq!(back.spec.as_ref().and_then(|s| s.unschedulable), None);
    let cond = |t: &str| json!({"type": t, "status": "True", "reason": "R", "message": ""});
    let types = |n: Node| -> Vec<String> {
        let mut t: Vec<String> =
            n.status.and_then(|s| s.conditions).unwrap_or_default().into_iter().map(|c| c.type_).collect();
        t.retain(|t| t.starts_with("Hv"));
        t.sort();
        t
    };
    for t in ["HvA", "HvB"] {
        let add = Patch::Strategic(json!({"status": {"conditions": [cond(t)]}}));
        nodes.patch_status(&name, &PatchParams::default(), &add).await.unwrap();
    }
    let both = types(nodes.get(&name).await.unwrap());
    assert_eq!(both, ["HvA", "HvB"], "merged by type, not replaced");
    let directive =
        Patch::Strategic(json!({"status": {"conditions": [{"type": "HvA", "$patch": "delete"}]}}));
    let left = types(nodes.patch_status(&name, &PatchParams::default(), &directive).await.unwrap());
    assert_eq!(left, ["HvB"], "the directive deleted one condition by its type");
    let hvs: Api<Hypervisor> = Api::all(c);
    let h = format!("{p}-hv");
    hvs.create(&PostParams::default(), &hv(&h)).await.unwrap();
    let err =
        hvs.patch(&h, &PatchParams::default(), &Patch::Strategic(json!({"spec": {"skipTests": true}}))).await;
    assert_eq!(code(&err.unwrap_err()), 415);
    hvs.delete(&h, &DeleteParams::default()).await.unwrap();
    nodes.delete(&name, &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn nodes_by_label_and_leases() {
    let (c, p) = api("leases").await;
    let nodes: Api<Node> = Api::all(c.clone());
    let role = |r: &str| format!("{p}-{r}");
    for (name, r) in [("hv-1", "hypervisor"), ("hv-2", "hypervisor"), ("ctl-1", "control")] {
        let n: Node = serde_json::from_value(
            json!({"metadata": {"name": format!("{p}-{name}"), "labels": {"role": role(r)}}}),
        )
        .unwrap();
        nodes.create(&PostParams::default(), &n).await.unwrap();
    }
    let hvs =
        nodes.list(&ListParams::default().labels(&format!("role={}", role("hypervisor")))).await.unwrap();
    let names: Vec<String> = hvs.items.iter().filter_map(|n| n.metadata.name.clone()).collect();
    assert_eq!(names, vec![format!("{p}-hv-1"), format!("{p}-hv-2")]);
    let leases: Api<Lease> = Api::namespaced(c, "hv-system");
    let lease = format!("{p}-coordinator");
    let l: Lease = serde_json::from_value(json!({"metadata": {"name": lease},
        "spec": {"holderIdentity": "pod-a", "leaseDurationSeconds": 15}}))
    .unwrap();
    let l = leases.create(&PostParams::default(), &l).await.unwrap();
    let mut taken = l.clone();
    taken.spec.as_mut().unwrap().holder_identity = Some("pod-b".into());
    leases.replace(&lease, &PostParams::default(), &taken).await.unwrap();
    // pod-a, holding the old version, cannot take it back.
    let err = leases.replace(&lease, &PostParams::default(), &l).await.unwrap_err();
    assert_eq!(code(&err), 409);
    leases.delete(&lease, &DeleteParams::default()).await.unwrap();
    for name in ["hv-1", "hv-2", "ctl-1"] {
        nodes.delete(&format!("{p}-{name}"), &DeleteParams::default()).await.unwrap();
    }
}

/// The CRDs' CEL rules, enforced by the API server itself.
#[tokio::test]
async fn the_api_server_enforces_our_cel_rules() {
    use hv_coordinator::api::eviction::{Eviction, EvictionReason, EvictionSpec};
    let (c, p) = api("cel").await;
    let name = format!("{p}-1");
    let api: Api<Hypervisor> = Api::all(c.clone());
    // manual maintenance needs a reason.
    let mut h = hv(&name);
    h.spec.maintenance = MaintenanceMode::Manual;
    let err = api.create(&PostParams::default(), &h).await.unwrap_err();
    assert_eq!(code(&err), 422, "{err}");
    assert!(err.to_string().contains("maintenanceReason"), "{err}");
    // termination cannot be undone.
    let mut h = hv(&name);
    h.spec.maintenance = MaintenanceMode::Termination;
    api.create(&PostParams::default(), &h).await.unwrap();
    let undo = json!({"spec": {"maintenance": ""}});
    let err = api.patch(&name, &PatchParams::default(), &Patch::Merge(&undo)).await.unwrap_err();
    assert_eq!(code(&err), 422, "{err}");
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    gone(&api, &name, "the Hypervisor deleted").await;
    // customTraits must be CUSTOM_ ones, at most 64 of them.
    let mut h = hv(&name);
    h.spec.custom_traits = vec!["HW_CPU_X86_AVX2".into()];
    let err = api.create(&PostParams::default(), &h).await.unwrap_err();
    assert_eq!(code(&err), 422, "{err}");
    h.spec.custom_traits = (0..65).map(|i| format!("CUSTOM_T{i}")).collect();
    let err = api.create(&PostParams::default(), &h).await.unwrap_err();
    assert_eq!(code(&err), 422, "{err}");
    h.spec.custom_traits = (0..64).map(|i| format!("CUSTOM_T{i}")).collect();
    api.create(&PostParams::default(), &h).await.unwrap();
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    gone(&api, &name, "the Hypervisor deleted").await;
    // An Eviction may force known preflight checks only.
    let forced = |force: &[&str]| {
        let mut spec = EvictionSpec {
            hypervisor: name.clone(),
            reason: EvictionReason::AdminRequest,
            options: Default::default(),
            dry_run: false,
        };
        spec.options.force = force.iter().map(|s| s.to_string()).collect();
        Eviction::new(&format!("{p}-forced"), spec)
    };
    let evs_forced: Api<Eviction> = Api::all(api.clone().into_client());
    let err =
        evs_forced.create(&PostParams::default(), &forced(&["capacity", "everything"])).await.unwrap_err();
    assert_eq!(code(&err), 422, "{err}");
    evs_forced.create(&PostParams::default(), &forced(&["capacity", "constraints"])).await.unwrap();
    evs_forced.delete(&format!("{p}-forced"), &DeleteParams::default()).await.unwrap();
    // An Eviction's target is immutable.
    let evs: Api<Eviction> = Api::all(c);
    let ev = format!("{p}-ev");
    let spec = EvictionSpec {
        hypervisor: name.clone(),
        reason: EvictionReason::AdminRequest,
        options: Default::default(),
        dry_run: false,
    };
    evs.create(&PostParams::default(), &Eviction::new(&ev, spec)).await.unwrap();
    let retarget = json!({"spec": {"hypervisor": format!("{p}-other")}});
    let err = evs.patch(&ev, &PatchParams::default(), &Patch::Merge(&retarget)).await.unwrap_err();
    assert_eq!(code(&err), 422, "{err}");
    evs.delete(&ev, &DeleteParams::default()).await.unwrap();
}

/// Held by a test whose watch a compaction by another test would disturb.
static COMPACTIONS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Compacts the ground's etcd up to its current revision, through etcd's
/// own JSON gateway: every version before now is gone.
async fn compact_etcd(env: &hv_tests::env::TestEnv) {
    let http = reqwest::Client::new();
    let range: serde_json::Value = http
        .post(format!("{}/v3/kv/range", env.kube.etcd))
        .json(&json!({"key": "AA=="}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let revision = range["header"]["revision"].as_str().unwrap().to_string();
    let compacted = http
        .post(format!("{}/v3/kv/compaction", env.kube.etcd))
        .json(&json!({"revision": revision, "physical": true}))
        .send()
        .await
        .unwrap();
    assert!(compacted.status().is_success(), "{:?}", compacted.text().await);
}

/// A watch from a resource version that etcd has compacted away and the
/// API server's watch cache no longer holds is answered 410 Gone (the API
/// server's "Efficient detection of changes"): a watcher that was away that
/// long must list again.
#[tokio::test]
async fn a_watch_from_a_compacted_version_is_gone() {
    let (c, p) = api("gone").await;
    let env = hv_tests::env::require();
    let api: Api<Hypervisor> = Api::all(c);
    for i in 0..4 {
        api.create(&PostParams::default(), &hv(&format!("{p}-{i}"))).await.unwrap();
    }
    {
        let _alone = COMPACTIONS.lock().await;
        compact_etcd(&env).await;
    }
    // The API server's watch cache keeps a window of its own; version 1,
    // from before it started, is older than both.
    let gone = match api.watch(&WatchParams::default().timeout(5), "1").await {
        Err(e) => code(&e) == 410,
        Ok(s) => matches!(s.boxed().next().await, Some(Ok(WatchEvent::Error(e))) if e.code == 410),
    };
    assert!(gone, "a watch from resource version 1 is 410 Gone");
    for i in 0..4 {
        api.delete(&format!("{p}-{i}"), &DeleteParams::default()).await.unwrap();
    }
}

/// A kube-runtime watcher composed as the coordinator composes its own
/// (backoff, a reflector's store) resumes its watch after being away, is
/// answered 410 Gone by the API server, lists again, and its store then
/// holds what changed while it was away: nothing missed, nothing stale.
/// ConfigMaps, because the ground's API server keeps no watch cache for
/// them (tests/env/peers/kube.sh): the resumed watch reaches etcd, which
/// has compacted the version it resumes from.
#[tokio::test]
async fn a_watcher_lists_again_after_410_gone() {
    let (c, p) = api("relist").await;
    let env = hv_tests::env::require();
    // No other test's compaction meanwhile. (The API server's own, every
    // five minutes, may land in the quiet phase: that is a 410 and a list
    // with nothing changed, which the quiet phase lets by.)
    let _alone = COMPACTIONS.lock().await;
    let cms: Api<ConfigMap> = Api::namespaced(c, "default");
    let cm = |n: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": format!("{p}-{n}"), "labels": {"test": p}}}))
            .unwrap()
    };
    cms.create(&PostParams::default(), &cm("before")).await.unwrap();
    let (store, writer) = reflector::store();
    let mine = format!("test={p}");
    // Each watch ends after 1 s on the server's side; the watcher resumes it.
    let config = watcher::Config::default().labels(&mine).timeout(1);
    let mut events = watcher(cms.clone(), config).default_backoff().reflect(writer).boxed();
    let names = || {
        let mut n: Vec<String> = store.state().iter().filter_map(|c| c.metadata.name.clone()).collect();
        n.sort();
        n
    };
    let within = Duration::from_secs(20);
    loop {
        match tokio::time::timeout(within, events.next()).await.expect("an event within 20 s") {
            Some(Ok(watcher::Event::InitDone)) => break,
            Some(Ok(_)) => {}
            other => panic!("listing: {other:?}"),
        }
    }
    assert_eq!(names(), [format!("{p}-before")]);
    // Watching for 2 s: its watches open and end, nothing changes.
    let quiet = tokio::time::Instant::now() + Duration::from_secs(2);
    while let Ok(event) = tokio::time::timeout_at(quiet, events.next()).await {
        match event {
            Some(Ok(e @ (watcher::Event::Apply(_) | watcher::Event::Delete(_)))) => {
                panic!("nothing changed, yet: {e:?}")
            }
            Some(_) => {}
            None => panic!("the watcher ended"),
        }
    }
    assert_eq!(names(), [format!("{p}-before")]);
    // Away: nobody polls, so no watch is open (the last ended after 1 s);
    // two changes, then etcd compacts them and the version it left off at.
    tokio::time::sleep(Duration::from_secs(2)).await;
    cms.delete(&format!("{p}-before"), &DeleteParams::default()).await.unwrap();
    cms.create(&PostParams::default(), &cm("after")).await.unwrap();
    compact_etcd(&env).await;
    // Back: the resumed watch is 410 Gone, the watcher lists again.
    let mut gone = false;
    loop {
        match tokio::time::timeout(within, events.next()).await.expect("an event within 20 s") {
            Some(Err(watcher::Error::WatchError(e))) if e.code == 410 => gone = true,
            Some(Ok(watcher::Event::InitDone)) if gone => break,
            Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) if gone => {}
            other => panic!("after a compaction, before a 410 and a new list: {other:?}"),
        }
    }
    assert_eq!(names(), [format!("{p}-after")], "the store as the API server has it");
    cms.delete(&format!("{p}-after"), &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn discovery_finds_the_crds() {
    let (c, _) = api("discovery").await;
    let d = kube::discovery::Discovery::new(c).run().await.unwrap();
    let found: Vec<String> =
        d.groups().flat_map(|g| g.recommended_resources().into_iter().map(|(r, _)| r.plural)).collect();
    for want in ["hypervisors", "evictions", "migrations", "nodes", "leases"] {
        assert!(found.iter().any(|f| f == want), "{want} missing: {found:?}");
    }
}

#[tokio::test]
async fn a_kube_runtime_controller_runs_unchanged() {
    let (c, p) = api("controller").await;
    let api: Api<Hypervisor> = Api::all(c.clone());
    let reconcile = |h: Arc<Hypervisor>, api: Arc<Api<Hypervisor>>| async move {
        let name = h.metadata.name.clone().unwrap_or_default();
        if h.status.as_ref().and_then(|s| s.phase).is_none() {
            let st = json!({"status": {"phase": "Onboarding"}});
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&st)).await?;
        }
        Ok::<_, kube::Error>(Action::await_change())
    };
    let mine = format!("test={p}");
    let ctl = Controller::new(api.clone(), kube::runtime::watcher::Config::default().labels(&mine))
        .run(reconcile, |_, _, _| Action::requeue(Duration::from_secs(1)), Arc::new(api.clone()))
        .for_each(|_| async {});
    let handle = tokio::spawn(ctl);
    for i in 0..3 {
        let mut h = hv(&format!("{p}-{i}"));
        h.metadata.labels = Some([("test".to_string(), p.clone())].into());
        api.create(&PostParams::default(), &h).await.unwrap();
    }
    until("the controller to reconcile all 3", Duration::from_secs(20), String::new, || async {
        let all = api.list(&ListParams::default().labels(&mine)).await.unwrap();
        let done = all
            .items
            .iter()
            .filter(|h| h.status.as_ref().and_then(|s| s.phase) == Some(Phase::Onboarding))
            .count();
        hv_tests::wait::ready_when(done == 3, done)
    })
    .await;
    handle.abort();
    for i in 0..3 {
        api.delete(&format!("{p}-{i}"), &DeleteParams::default()).await.unwrap();
    }
}

/// Server-side apply with field ownership, as the API server documents it
/// ("Server-Side Apply": a field a manager applied and now omits is removed
/// unless someone else owns it; another applier's field is a conflict unless
/// forced, and forcing takes it over).
#[tokio::test]
async fn apply_removes_what_a_manager_stopped_applying_and_keeps_what_others_own() {
    let (c, p) = api("ssa-owners").await;
    let name = format!("{p}-1");
    let api: Api<Hypervisor> = Api::all(c);
    api.create(&PostParams::default(), &hv(&name)).await.unwrap();
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
    api.patch_status(&name, &apply("lifecycle", false), &Patch::Apply(&a)).await.unwrap();
    let b = status(json!({"agent": {"connected": true}, "conditions": [cond("AgentConnected", "True")]}));
    api.patch_status(&name, &apply("fleet", false), &Patch::Apply(&b)).await.unwrap();
    // The first omits hypervisorVersion and its condition: both go, the
    // other manager's stay.
    let a2 = status(json!({"phase": "Maintenance"}));
    let h = api.patch_status(&name, &apply("lifecycle", false), &Patch::Apply(&a2)).await.unwrap();
    let st = h.status.unwrap();
    assert_eq!(st.phase, Some(Phase::Maintenance));
    assert_eq!(st.hypervisor_version, None, "a field the manager stopped applying is removed");
    let types: Vec<&str> = st.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, vec!["AgentConnected"], "the other manager's condition stays");
    assert_eq!(st.agent.map(|a| a.connected), Some(true));
    // Setting the other's field to another value: a conflict, unless forced.
    let grab = status(json!({"agent": {"connected": false}}));
    let e = api.patch_status(&name, &apply("lifecycle", false), &Patch::Apply(&grab)).await.unwrap_err();
    assert_eq!(code(&e), 409, "{e}");
    assert!(e.to_string().contains("fleet") && e.to_string().contains(".status.agent.connected"), "{e}");
    let h = api.patch_status(&name, &apply("lifecycle", true), &Patch::Apply(&grab)).await.unwrap();
    assert_eq!(h.status.unwrap().agent.map(|a| a.connected), Some(false));
    // Taken over: when the lifecycle now omits it, it goes, though the fleet
    // once applied it.
    let h = api.patch_status(&name, &apply("lifecycle", false), &Patch::Apply(&a2)).await.unwrap();
    assert_eq!(h.status.unwrap().agent.map(|a| a.connected), None);
    // The same value is no conflict: shared ownership, kept while either applies it.
    let both = status(json!({"phase": "Maintenance"}));
    api.patch_status(&name, &apply("fleet", false), &Patch::Apply(&both)).await.unwrap();
    let h =
        api.patch_status(&name, &apply("lifecycle", false), &Patch::Apply(&status(json!({})))).await.unwrap();
    assert_eq!(h.status.unwrap().phase, Some(Phase::Maintenance), "still owned by the fleet");
    api.delete(&name, &DeleteParams::default()).await.unwrap();
}

/// The garbage collector (the API server's "Garbage Collection" doc): when
/// an owner goes, its dependents are deleted in the background (their own
/// finalizers respected), before it in the foreground, or orphaned with
/// `propagationPolicy: Orphan`; a dependent whose owner reference was
/// removed stays.
#[tokio::test]
async fn owners_going_take_their_dependents_or_orphan_them() {
    use hv_coordinator::api::eviction::{Eviction, EvictionReason, EvictionSpec};
    use kube::Resource;
    let (c, p) = api("gc").await;
    let nodes: Api<Node> = Api::all(c.clone());
    let hvs: Api<Hypervisor> = Api::all(c.clone());
    let evs: Api<Eviction> = Api::all(c.clone());
    let n = |i: u8| format!("{p}-n{i}");
    // In the foreground only dependents that block their owner's deletion
    // hold it (n4's); the coordinator's own references block nothing.
    let owner_ref = |o: &dyn Fn()
        -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
                     block: bool| {
        let mut r = o().unwrap();
        r.block_owner_deletion = block.then_some(true);
        vec![r]
    };
    for i in 1..=4 {
        let node = nodes.create(&PostParams::default(), &node(&n(i))).await.unwrap();
        let mut h = hv(&n(i));
        h.metadata.owner_references = Some(owner_ref(&|| node.controller_owner_ref(&()), i == 4));
        let h = hvs.create(&PostParams::default(), &h).await.unwrap();
        let spec = EvictionSpec {
            hypervisor: n(i),
            reason: EvictionReason::AdminRequest,
            options: Default::default(),
            dry_run: false,
        };
        let mut e = Eviction::new(&format!("{}-ev", n(i)), spec);
        e.metadata.owner_references = Some(owner_ref(&|| h.controller_owner_ref(&()), i == 4));
        e.metadata.finalizers = Some(vec!["hypervisor.cloud.sap/eviction".into()]);
        evs.create(&PostParams::default(), &e).await.unwrap();
    }
    // Background: the Hypervisor goes; its Eviction is held by its finalizer.
    nodes.delete(&n(1), &DeleteParams::default()).await.unwrap();
    gone(&hvs, &n(1), "the Hypervisor deleted with its Node").await;
    let ev1 = format!("{}-ev", n(1));
    until("the Eviction marked for deletion", SOON, String::new, || async {
        let e = evs.get(&ev1).await.unwrap();
        hv_tests::wait::ready_when(e.metadata.deletion_timestamp.is_some(), "not yet")
    })
    .await;
    let rm = json!({"metadata": {"finalizers": null}});
    evs.patch(&ev1, &PatchParams::default(), &Patch::Merge(&rm)).await.unwrap();
    gone(&evs, &ev1, "the Eviction deleted once its finalizer is removed").await;
    // Orphan: the Hypervisor stays, without the reference.
    let orphan =
        DeleteParams { propagation_policy: Some(kube::api::PropagationPolicy::Orphan), ..Default::default() };
    nodes.delete(&n(2), &orphan).await.unwrap();
    gone(&nodes, &n(2), "the Node deleted").await;
    let h = hvs.get(&n(2)).await.unwrap();
    assert!(h.metadata.owner_references.unwrap_or_default().is_empty());
    // A reference removed before the owner goes: the dependent stays.
    let drop_ref = json!({"metadata": {"ownerReferences": null}});
    hvs.patch(&n(3), &PatchParams::default(), &Patch::Merge(&drop_ref)).await.unwrap();
    nodes.delete(&n(3), &DeleteParams::default()).await.unwrap();
    gone(&nodes, &n(3), "the Node deleted").await;
    tokio::time::sleep(Duration::from_secs(3)).await; // a collector's pass
    assert!(hvs.get_opt(&n(3)).await.unwrap().is_some(), "no longer a dependent");
    assert!(evs.get_opt(&format!("{}-ev", n(3))).await.unwrap().is_some());
    // Foreground: the Node waits, marked, until its dependents are gone; the
    // Eviction's finalizer holds the Hypervisor, and so the Node.
    let fg = DeleteParams::foreground();
    nodes.delete(&n(4), &fg).await.unwrap();
    let ev4 = format!("{}-ev", n(4));
    until("the Eviction marked in the foreground", SOON, String::new, || async {
        let e = evs.get(&ev4).await.unwrap();
        hv_tests::wait::ready_when(e.metadata.deletion_timestamp.is_some(), "not yet")
    })
    .await;
    let node4 = nodes.get(&n(4)).await.unwrap();
    assert!(node4.metadata.deletion_timestamp.is_some(), "the owner waits for its dependents");
    assert!(node4.metadata.finalizers.unwrap_or_default().iter().any(|f| f == "foregroundDeletion"));
    evs.patch(&ev4, &PatchParams::default(), &Patch::Merge(&rm)).await.unwrap();
    gone(&nodes, &n(4), "the Node deleted after its dependents").await;
    assert!(hvs.get_opt(&n(4)).await.unwrap().is_none());
    for i in [2, 3] {
        hvs.delete(&n(i), &DeleteParams::default()).await.unwrap();
    }
    let ev3 = format!("{}-ev", n(3));
    evs.patch(&ev3, &PatchParams::default(), &Patch::Merge(&rm)).await.unwrap();
    let _ = evs.delete(&ev3, &DeleteParams::default()).await;
    let _ = evs.patch(&format!("{}-ev", n(2)), &PatchParams::default(), &Patch::Merge(&rm)).await;
}

/// An object with two owners (the API server's "Garbage Collection" doc: a
/// dependent is deleted once none of its owners is left): the first owner
/// going removes only its reference; the second going deletes it.
#[tokio::test]
async fn a_dependent_with_two_owners_goes_only_with_the_last() {
    use kube::Resource;
    let (c, p) = api("gc-two").await;
    let nodes: Api<Node> = Api::all(c.clone());
    let hvs: Api<Hypervisor> = Api::all(c.clone());
    let (a, b, shared) = (format!("{p}-owner-a"), format!("{p}-owner-b"), format!("{p}-shared"));
    let mut refs = vec![];
    for name in [&a, &b] {
        let n = nodes.create(&PostParams::default(), &node(name)).await.unwrap();
        let mut r = n.controller_owner_ref(&()).unwrap();
        r.controller = Some(name == &a); // at most one controller
        refs.push(r);
    }
    let mut h = hv(&shared);
    h.metadata.owner_references = Some(refs);
    hvs.create(&PostParams::default(), &h).await.unwrap();

    nodes.delete(&a, &DeleteParams::default()).await.unwrap();
    until("owner-a's reference removed", SOON, String::new, || async {
        let h = hvs.get_opt(&shared).await.unwrap().expect("kept while owner-b exists");
        let left: Vec<_> =
            h.metadata.owner_references.unwrap_or_default().into_iter().map(|r| r.name).collect();
        hv_tests::wait::ready_when(left == [b.clone()], left)
    })
    .await;
    nodes.delete(&b, &DeleteParams::default()).await.unwrap();
    gone(&hvs, &shared, "deleted with its last owner").await;
}

/// Whether the pod `name` is being deleted (or gone).
async fn deleting(pods: &Api<k8s_openapi::api::core::v1::Pod>, name: &str) -> bool {
    pods.get_opt(name).await.unwrap().is_none_or(|p| p.metadata.deletion_timestamp.is_some())
}

/// The eviction subresource as `kubectl drain` uses it: a pod without a
/// budget goes; a budget's arithmetic over its Ready pods decides; a dry run
/// deletes nothing; a name that does not match the URL is refused. Raw
/// requests (as the administrator), so that nothing retries a 429.
#[tokio::test]
async fn evictions_check_the_pods_budget() {
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let (c, p) = api("evict").await;
    let env = hv_tests::env::require();
    let ns = p.clone();
    let namespaces: Api<Namespace> = Api::all(c.clone());
    namespaces
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
    for (name, app, ready) in
        [("a-1", "a", true), ("a-2", "a", true), ("a-3", "a", false), ("free", "b", true)]
    {
        let pod = json!({"metadata": {"name": name, "labels": {"app": app}},
            "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "i"}]}});
        pods.create(&PostParams::default(), &serde_json::from_value(pod).unwrap()).await.unwrap();
        let status = json!({"status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    }
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(c, &ns);
    let pdb = json!({"metadata": {"name": "a"}, "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "a"}}}});
    pdbs.create(&PostParams::default(), &serde_json::from_value(pdb).unwrap()).await.unwrap();
    // The disruption controller has counted the pods.
    let counted = |healthy: i32| {
        let pdbs = pdbs.clone();
        async move {
            until("the budget's status", SOON, String::new, || async {
                let b = pdbs.get("a").await.unwrap();
                let generation = b.metadata.generation;
                let s = b.status.unwrap_or_default();
                hv_tests::wait::ready_when(
                    s.observed_generation == generation && s.current_healthy == healthy,
                    s,
                )
            })
            .await
        }
    };
    counted(2).await;
    let admin = std::fs::read_to_string(&env.kube.admin_kubeconfig).unwrap();
    let field = |key: &str| {
        let line = admin.lines().find(|l| l.trim_start().starts_with(key)).unwrap();
        std::fs::read(line.split_once(':').unwrap().1.trim()).unwrap()
    };
    let mut identity = field("client-certificate:");
    identity.extend(field("client-key:"));
    let http = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&env.kube.ca_file).unwrap()).unwrap(),
        )
        .identity(reqwest::Identity::from_pem(&identity).unwrap())
        .build()
        .unwrap();
    let url = env.kube.url.clone();
    let evict = |name: &str, body: serde_json::Value| {
        http.post(format!("{url}/api/v1/namespaces/{ns}/pods/{name}/eviction")).json(&body).send()
    };
    let eviction =
        |name: &str| json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}});
    // Two Ready of three, at least two available: none may go.
    let r = evict("a-1", eviction("a-1")).await.unwrap();
    assert_eq!(r.status().as_u16(), 429);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["reason"], "TooManyRequests", "{body}");
    assert!(!deleting(&pods, "a-1").await);
    // No budget: evicted, deleted (gracefully: marked, until its kubelet,
    // which runs nowhere here, would confirm).
    assert_eq!(evict("free", eviction("free")).await.unwrap().status().as_u16(), 201);
    assert!(deleting(&pods, "free").await, "the evicted pod is being deleted");
    // The budget loosened: one may go; a dry run first deletes nothing.
    pdbs.patch("a", &PatchParams::default(), &Patch::Merge(json!({"spec": {"minAvailable": 1}})))
        .await
        .unwrap();
    counted(2).await;
    let mut dry = eviction("a-1");
    dry["deleteOptions"] = json!({"dryRun": ["All"]});
    assert_eq!(evict("a-1", dry).await.unwrap().status().as_u16(), 201);
    assert!(!deleting(&pods, "a-1").await, "a dry run");
    assert_eq!(evict("a-1", eviction("a-2")).await.unwrap().status().as_u16(), 400, "name mismatch");
    assert_eq!(evict("a-1", eviction("a-1")).await.unwrap().status().as_u16(), 201);
    assert!(deleting(&pods, "a-1").await);
    assert_eq!(
        evict("a-2", eviction("a-2")).await.unwrap().status().as_u16(),
        429,
        "one Ready left, one required"
    );
    assert_eq!(evict("gone", eviction("gone")).await.unwrap().status().as_u16(), 404);
    namespaces.delete(&ns, &DeleteParams::default()).await.unwrap();
}

/// The flow schema and priority level the API server put a request of
/// `client` in (its priority and fairness answer headers), and its status;
/// `body` sent as JSON unless null.
async fn classified(
    client: &kube::Client,
    method: http::Method,
    path: &str,
    body: &serde_json::Value,
) -> (String, String, u16) {
    let req = http::Request::builder()
        .method(method.clone())
        .uri(path)
        .header("content-type", "application/json")
        .body(match body {
            serde_json::Value::Null => kube::client::Body::empty(),
            body => kube::client::Body::from(serde_json::to_vec(body).unwrap()),
        })
        .unwrap();
    let res = client.send(req).await.unwrap();
    let header = |h: &str| {
        let value = res.headers().get(h).and_then(|v| v.to_str().ok());
        value.unwrap_or_else(|| panic!("{method} {path}: no {h}")).to_string()
    };
    (
        header("X-Kubernetes-PF-FlowSchema-UID"),
        header("X-Kubernetes-PF-PriorityLevel-UID"),
        res.status().as_u16(),
    )
}

/// The chart's FlowSchema: the coordinator's Lease requests (the election
/// reads, renews with a PUT and takes with a POST) are in the
/// leader-election priority level, so a burst of its own writes does not
/// hold up a renewal; its other requests stay where they were.
#[tokio::test]
async fn the_coordinators_lease_requests_ride_the_leader_election_level() {
    use http::Method;
    use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
    let env = hv_tests::env::require();
    let (admin, p) = api("flow").await;
    let chart = &env.kube.chart;
    let schema = Api::<FlowSchema>::all(admin.clone())
        .get(&format!("{}-coordinator-lease", chart.release))
        .await
        .expect("the chart installs its FlowSchema");
    let level = Api::<PriorityLevelConfiguration>::all(admin).get("leader-election").await.unwrap();
    let ours = (schema.metadata.uid.unwrap(), level.metadata.uid.unwrap());

    let kubeconfig = std::env::temp_dir().join(format!("{p}-coordinator.kubeconfig"));
    hv_tests::kube_target::account_kubeconfig(
        &env,
        (&chart.namespace, &chart.coordinator_account, None),
        None,
        &kubeconfig,
    )
    .unwrap();
    let coordinator = hv_tests::kube_target::client_from(&kubeconfig).await.unwrap();
    let _ = std::fs::remove_file(&kubeconfig);
    // Dry runs: the API server classifies a request before it is
    // authorized, admitted or answered, and a dry run changes nothing.
    let leases = format!("/apis/coordination.k8s.io/v1/namespaces/{}/leases", chart.namespace);
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": p},
        "spec": {"holderIdentity": "flow-test", "leaseDurationSeconds": 15}});
    for (method, path, body, answer) in [
        (Method::GET, format!("{leases}/{p}"), json!(null), 404),
        (Method::POST, format!("{leases}?dryRun=All"), lease.clone(), 201),
        // A Lease may be created by a PUT: the dry run answers 201.
        (Method::PUT, format!("{leases}/{p}?dryRun=All"), lease.clone(), 201),
    ] {
        let (schema, level, status) = classified(&coordinator, method.clone(), &path, &body).await;
        assert_eq!(status, answer, "{method} {path}: the coordinator may do this to Leases in its namespace");
        assert_eq!((schema, level), ours, "{method} {path}: in the chart's FlowSchema and leader-election");
    }

    let (schema, level, status) =
        classified(&coordinator, Method::GET, "/api/v1/nodes?limit=1", &json!(null)).await;
    assert_eq!(status, 200);
    assert!(schema != ours.0 && level != ours.1, "the coordinator's other requests keep their level");
}
