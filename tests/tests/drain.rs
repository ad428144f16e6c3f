//! A rolling update's ask, on the real peers: the Node annotation
//! `hypervisor.cloud.sap/maintenance-required`, or a cordon where the site
//! says a cordon is one (`--cordon-starts-maintenance`), puts the host into
//! `auto` maintenance: disabled in Nova, its servers live-migrated away by a
//! RollingUpdate Eviction, held in Maintenance while the ask stands. Its
//! end (annotation removed, uncordon) brings the host back through its
//! checks to Active. And the node lock protocol: the Node says whether the
//! host may lose its dependents (label `hypervisor.cloud.sap/evictable`),
//! and a network agent's lock annotation stands while it may not
//! (docs/drain.md).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test that fails fails

use std::time::Duration;

use hv_coordinator::api::Phase;
use hv_coordinator::api::eviction::EvictionReason;
use hv_coordinator::drain::locks::{EVICTABLE, LOCK_PREFIX};
use hv_coordinator::k8s::hypervisor::MAINTENANCE_REQUIRED_ANNOTATION;
use hv_tests::openstack::Admin;
use hv_tests::region::{AgentPeers, Region};
use hv_tests::wait::{Poll, until};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};

const SOON: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread")]
async fn an_update_empties_the_host_by_live_migration_and_its_end_brings_it_back_through_its_checks() {
    let region = Region::start("drain-update").await;
    let env = region.env.clone();
    let zone = hv_tests::hosts::zone(&env, 1).await;
    let (host, target) = (zone.source.host.clone(), zone.targets[0].host.clone());
    let coord = region.coordinator(None, &["--cordon-starts-maintenance", "--node-lock", "neutron-l2"]);
    let mut agents = Vec::new();
    for h in [&host, &target] {
        agents.push(region.agent(h, &AgentPeers::default()));
        region.create_node(h, &[]).await;
    }
    for h in [&host, &target] {
        region.wait_phase(h, Phase::Active, SOON, &coord).await;
    }
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
    let server = admin.server(&id).await.unwrap();
    assert_eq!(server["OS-EXT-SRV-ATTR:host"], target.as_str(), "{server}");
    assert_eq!(server["status"], "ACTIVE");
    let migrations = admin.migrations_of(&id).await.unwrap();
    assert!(
        migrations.iter().any(|m| m["migration_type"] == "live-migration" && m["status"] == "completed"),
        "{migrations:?}"
    );
    let mine = region.evictions_of(&host).await;
    assert_eq!(mine.len(), 1, "one Eviction");
    assert_eq!(mine[0].spec.reason, EvictionReason::RollingUpdate);
    let svc = admin.service(&host).await.unwrap().unwrap();
    assert_eq!(svc["status"], "disabled", "{svc}");
    assert!(
        svc["disabled_reason"].as_str().unwrap().contains("maintenance (auto): the Node is cordoned"),
        "{svc}"
    );
    assert!(held.spec.maintenance_reason.is_empty(), "the spec is the SRE's: untouched");
    // Empty and held: evictable, the lock lifted.
    wait_locks(&nodes, &host, true).await;

    // Uncordoned: back through its checks (a new run) to Active, enabled.
    nodes.patch(&host, &PatchParams::default(), &Patch::Merge(&cordon(false))).await.unwrap();
    let back = region.wait_phase(&host, Phase::Active, SOON, &coord).await;
    assert!(runs(&back) > before, "checked again: run {} after {before}", runs(&back));
    let status = back.status.clone().unwrap();
    assert!(!status.checks.is_empty() && status.checks.iter().all(|c| c.passed), "{:?}", status.checks);
    assert_eq!(admin.service(&host).await.unwrap().unwrap()["status"], "enabled");
    // In service again, VMs may land: locked again.
    wait_locks(&nodes, &host, false).await;

    // The update protocol's annotation: the same, whatever the cordon.
    let ask =
        serde_json::json!({"metadata": {"annotations": {MAINTENANCE_REQUIRED_ANNOTATION: "os-update"}}});
    nodes.patch(&host, &PatchParams::default(), &Patch::Merge(&ask)).await.unwrap();
    region.wait_phase(&host, Phase::Maintenance, SOON, &coord).await;
    let svc = admin.service(&host).await.unwrap().unwrap();
    assert!(svc["disabled_reason"].as_str().unwrap().contains("maintenance-required"), "{svc}");
    let done = serde_json::json!({"metadata": {"annotations": {MAINTENANCE_REQUIRED_ANNOTATION: null}}});
    nodes.patch(&host, &PatchParams::default(), &Patch::Merge(&done)).await.unwrap();
    region.wait_phase(&host, Phase::Active, SOON, &coord).await;
    assert_eq!(admin.service(&host).await.unwrap().unwrap()["status"], "enabled");
    drop(agents);
}

/// Waits until the Node's lock protocol marks say `evictable`: the label,
/// and the neutron-l2 lock annotation there exactly while it is not.
async fn wait_locks(nodes: &Api<Node>, host: &str, evictable: bool) {
    let what = format!("{host} evictable={evictable}");
    until(&what, Duration::from_secs(60), String::new, || async {
        let node = nodes.get(host).await.unwrap();
        let label = node.labels().get(EVICTABLE).cloned();
        let locked = node.annotations().contains_key(&format!("{LOCK_PREFIX}neutron-l2"));
        if label.as_deref() == Some(&evictable.to_string()) && locked != evictable {
            Poll::Ready(())
        } else {
            Poll::Pending(format!("label {label:?}, locked {locked}"))
        }
    })
    .await;
}
