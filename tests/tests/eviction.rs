//! Maintenance on the real Nova (issue 6, first part): a host with servers
//! of mixed sizes is put into maintenance, the coordinator disables it with
//! our reason, live-migrates every server off through an Eviction with one
//! Migration object per attempt, and brings the host back when maintenance
//! is cleared.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hv_coordinator::api::eviction::{EvictionPhase, VmState};
use hv_coordinator::api::{Eviction, Hypervisor, Migration, Phase};
use hv_tests::openstack::Admin;
use hv_tests::region::Region;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};

#[tokio::test(flavor = "multi_thread")]
async fn maintenance_empties_the_host_and_clearing_it_brings_the_host_back() {
    let region = Region::start("evict").await;
    let admin = Admin::login(&region.env).await.unwrap();
    let host = region.env.nova.hosts[0].clone();
    let coord = region.coordinator(None, &["--skip-tests"]);
    region.create_node(&host, &[]).await;
    region.wait_phase(&host, Phase::Active, Duration::from_secs(60), &coord).await;

    // Ten servers of three sizes (m1.tiny 512 MiB, m1.small 2 GiB, m1.medium 4 GiB).
    let mut ids = Vec::new();
    for (i, flavor) in ["1", "2", "3", "1", "2", "1", "3", "1", "2", "1"].iter().enumerate() {
        ids.push(admin.boot_on(&format!("ev-{}-{i}", std::process::id()), &host, flavor).await.unwrap());
    }

    let hvs: Api<Hypervisor> = Api::all(region.kube.client.clone());
    let patch =
        serde_json::json!({"spec": {"maintenance": "manual", "maintenanceReason": "firmware update"}});
    hvs.patch(&host, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let hv = region.wait_phase(&host, Phase::Maintenance, Duration::from_secs(240), &coord).await;
    assert_eq!(hv.status.as_ref().map(|s| s.instances.as_ref().map_or(0, |i| i.count)), Some(0));

    // Nova: every server ACTIVE elsewhere; the host disabled with our reason.
    for id in &ids {
        let s = admin.server(id).await.unwrap();
        assert_eq!(s["status"], "ACTIVE", "{s}");
        assert_ne!(s["OS-EXT-SRV-ATTR:host"].as_str(), Some(host.as_str()), "{id} still on {host}");
    }
    let svc = admin.service(&host).await.unwrap().unwrap();
    assert_eq!(svc["status"], "disabled");
    assert!(svc["disabled_reason"].as_str().unwrap_or_default().contains("firmware update"), "{svc}");

    // The record: an Eviction with every VM migrated, largest first, and a Migration per attempt.
    let evs: Api<Eviction> = Api::all(region.kube.client.clone());
    let ev = evs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|e| e.spec.hypervisor == host)
        .unwrap();
    let st = ev.status.unwrap();
    assert_eq!(st.phase, Some(EvictionPhase::Succeeded));
    assert_eq!((st.total, st.migrated), (10, 10));
    assert_eq!(st.progress.as_deref(), Some("10/10"));
    assert!(st.vms.iter().all(|v| v.state == VmState::Migrated && v.target_host.is_some()));
    let sizes: Vec<u64> = st.vms.iter().map(|v| v.memory_bytes).collect();
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "largest first: {sizes:?}");
    let migs: Api<Migration> = Api::all(region.kube.client.clone());
    let migs = migs.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(migs.iter().filter(|m| m.spec.eviction == ev.metadata.name.clone().unwrap()).count(), 10);
    assert!(migs.iter().all(|m| m.status.as_ref().and_then(|s| s.nova_migration_id).is_some()));

    // Clear maintenance: back to Active, scheduling on.
    let patch = serde_json::json!({"spec": {"maintenance": "", "maintenanceReason": ""}});
    hvs.patch(&host, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    region.wait_phase(&host, Phase::Active, Duration::from_secs(60), &coord).await;
    assert_eq!(admin.service(&host).await.unwrap().unwrap()["status"], "enabled");

    for id in &ids {
        admin.delete_server(id).await.unwrap();
    }
}
