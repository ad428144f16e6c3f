//! Evictions on the real Nova (issue 6): maintenance empties a host of
//! servers of mixed sizes (disabled with our reason, one Migration object
//! per attempt) and clearing it brings the host back; stuck migrations are
//! aborted (Nova shows them cancelled), retried, and recorded
//! non-migratable once the attempts run out while the rest finish; an
//! Eviction deleted mid-way aborts what is in flight; a coordinator killed
//! ten times loses and doubles nothing; a preflight stops before anything
//! moves and `force` skips named checks; termination (by spec or by
//! deleting the Node) cold-migrates and confirms, refuses while a server
//! remains, and decommissions the host without leaving anything in Nova.
//!
//! The tests take turns: a VM evicted from one test's host may land on
//! another's, which would change what that eviction finds. Nova's fake
//! live-migration driver holds each migration about 5 s and reports no
//! progress counters, so only the completion clock can find one stuck.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hv_coordinator::api::eviction::{EvictionOptions, EvictionReason, EvictionSpec};
use hv_coordinator::api::eviction::{EvictionPhase, VmState};
use hv_coordinator::api::{Eviction, Hypervisor, Migration, Phase};
use hv_tests::openstack::Admin;
use hv_tests::region::{Proc, RETIRED_BY_TESTS, Region};
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A region with Nova host number `index` Active and servers of `flavors` on it.
async fn active_host_with(
    test: &str,
    index: usize,
    flavors: &[&str],
) -> (Region, Admin, String, Proc, Vec<String>) {
    let region = Region::start(test).await;
    let admin = Admin::login(&region.env).await.unwrap();
    let (host, coord, ids) = region.active_host_with(&admin, index, flavors, &[]).await;
    (region, admin, host, coord, ids)
}

/// Sets `spec.maintenance: manual` with `reason`.
async fn request_maintenance(region: &Region, host: &str, reason: &str) -> Api<Hypervisor> {
    let hvs: Api<Hypervisor> = Api::all(region.kube.client.clone());
    let patch = serde_json::json!({"spec": {"maintenance": "manual", "maintenanceReason": reason}});
    hvs.patch(host, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    hvs
}

async fn create_eviction(region: &Region, name: &str, host: &str, options: EvictionOptions) -> Api<Eviction> {
    let evs: Api<Eviction> = Api::all(region.kube.client.clone());
    let ev = Eviction::new(
        name,
        EvictionSpec { hypervisor: host.into(), reason: EvictionReason::AdminRequest, options },
    );
    evs.create(&PostParams::default(), &ev).await.unwrap();
    evs
}

async fn wait_eviction(evs: &Api<Eviction>, name: &str, want: EvictionPhase, coord: &Proc) -> Eviction {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let ev = evs.get_opt(name).await.unwrap();
        if let Some(e) = &ev
            && e.status.as_ref().and_then(|s| s.phase) == Some(want)
        {
            return e.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never {want:?}: {:?}\n{}",
            ev.and_then(|e| e.status),
            coord.tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One sample of the coordinator's `/metrics`; a missing one fails the test.
async fn metric(coord: &Proc, name: &str) -> f64 {
    let url = coord.metrics.clone().unwrap();
    let text = reqwest::get(&url).await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.parse().ok()))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn maintenance_empties_the_host_and_clearing_it_brings_the_host_back() {
    let _turn = TURN.lock().await;
    // Ten servers of three sizes (m1.tiny 512 MiB, m1.small 2 GiB, m1.medium 4 GiB).
    let flavors = ["1", "2", "3", "1", "2", "1", "3", "1", "2", "1"];
    let (region, admin, host, coord, ids) = active_host_with("evict", 0, &flavors).await;
    let hvs = request_maintenance(&region, &host, "firmware update").await;
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
    let ev_name = ev.name_any();
    let st = ev.status.unwrap();
    assert_eq!(st.phase, Some(EvictionPhase::Succeeded));
    assert_eq!((st.total, st.migrated), (10, 10));
    assert_eq!(st.progress.as_deref(), Some("10/10"));
    assert!(st.vms.iter().all(|v| v.state == VmState::Migrated && v.target_host.is_some()));
    let sizes: Vec<u64> = st.vms.iter().map(|v| v.memory_bytes).collect();
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "largest first: {sizes:?}");
    let migs = region.migrations_of(&ev_name).await;
    assert_eq!(migs.len(), 10);
    assert!(migs.iter().all(|m| m.status.as_ref().and_then(|s| s.nova_migration_id).is_some()));
    // The same story in the coordinator's metrics.
    assert_eq!(metric(&coord, "hv_eviction_migrations_started_total").await, 10.0);
    assert_eq!(metric(&coord, "hv_eviction_migrations_succeeded_total").await, 10.0);
    assert_eq!(metric(&coord, "hv_eviction_migrations_aborted_total").await, 0.0);
    assert_eq!(metric(&coord, "hv_eviction_migration_duration_seconds_count").await, 10.0);
    let mean = metric(&coord, "hv_eviction_migration_duration_seconds_sum").await / 10.0;
    assert!((3.0..60.0).contains(&mean), "Nova's fake driver takes about 5 s per migration: {mean}");
    assert_eq!(metric(&coord, "hv_coordinator_leader").await, 1.0);

    // Clear maintenance: back to Active, scheduling on.
    let patch = serde_json::json!({"spec": {"maintenance": "", "maintenanceReason": ""}});
    hvs.patch(&host, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    region.wait_phase(&host, Phase::Active, Duration::from_secs(60), &coord).await;
    assert_eq!(admin.service(&host).await.unwrap().unwrap()["status"], "enabled");

    for id in &ids {
        admin.delete_server(id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn stuck_migrations_are_aborted_retried_and_given_up_while_the_rest_finish() {
    let _turn = TURN.lock().await;
    // Two 4 GiB servers (8 s allowed, done in 5 s) and two 512 MiB ones (2 s allowed).
    let (region, admin, host, coord, ids) = active_host_with("stuck", 1, &["3", "3", "1", "1"]).await;
    let options = EvictionOptions {
        max_parallel: 1,
        completion_timeout_per_gi_b_seconds: 2,
        max_attempts: 2,
        re_enable: Some(true),
        ..EvictionOptions::default()
    };
    let name = format!("stuck-{}", std::process::id());
    let evs = create_eviction(&region, &name, &host, options).await;
    let ev = wait_eviction(&evs, &name, EvictionPhase::Succeeded, &coord).await;
    let st = ev.status.unwrap();
    assert_eq!((st.total, st.migrated, st.non_migratable), (4, 2, 2), "{:?}", st.vms);
    for vm in st.vms.iter().filter(|v| v.state == VmState::NonMigratable) {
        assert_eq!(vm.attempts, 2);
        assert!(vm.reason.contains("over the 2s"), "{}", vm.reason);
        let s = admin.server(&vm.id).await.unwrap();
        assert_eq!(
            (s["status"].as_str(), s["OS-EXT-SRV-ATTR:host"].as_str()),
            (Some("ACTIVE"), Some(host.as_str()))
        );
    }
    let migs = region.migrations_of(&name).await;
    assert_eq!(migs.len(), 6, "2 attempts for each small server, 1 for each large one");
    let cancelled = migs
        .iter()
        .filter(|m| m.status.as_ref().and_then(|s| s.nova_status.as_deref()) == Some("cancelled"))
        .count();
    assert_eq!(cancelled, 4, "Nova shows every aborted attempt cancelled");
    assert_eq!(metric(&coord, "hv_eviction_migrations_started_total").await, 6.0);
    assert_eq!(metric(&coord, "hv_eviction_migrations_retried_total").await, 2.0);
    assert!(metric(&coord, "hv_eviction_migrations_aborted_total").await >= 4.0);
    assert_eq!(metric(&coord, "hv_eviction_migrations_succeeded_total").await, 2.0);
    assert_eq!(metric(&coord, "hv_eviction_migrations_non_migratable_total").await, 2.0);
    // AdminRequest with reEnable: the host goes back into service.
    region.wait_phase(&host, Phase::Active, Duration::from_secs(60), &coord).await;
    for id in &ids {
        admin.delete_server(id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_an_eviction_aborts_what_is_in_flight() {
    let _turn = TURN.lock().await;
    let (region, admin, host, coord, ids) = active_host_with("cancel", 2, &["3"]).await;
    let options = EvictionOptions { re_enable: Some(true), ..EvictionOptions::default() };
    let name = format!("cancel-{}", std::process::id());
    let evs = create_eviction(&region, &name, &host, options).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let running = region
            .migrations_of(&name)
            .await
            .iter()
            .any(|m| m.status.as_ref().and_then(|s| s.nova_status.as_deref()) == Some("running"));
        if running {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no migration started:\n{}", coord.tail(30));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    evs.delete(&name, &DeleteParams::default()).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while evs.get_opt(&name).await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Eviction was never released:\n{}",
            coord.tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let s = admin.server(&ids[0]).await.unwrap();
    assert_eq!(s["OS-EXT-SRV-ATTR:host"].as_str(), Some(host.as_str()), "the aborted VM stayed");
    let migs = region.migrations_of(&name).await;
    assert!(
        migs.iter().all(|m| m.status.as_ref().and_then(|s| s.nova_status.as_deref()) != Some("completed")),
        "nothing completed after the delete"
    );
    region.wait_phase(&host, Phase::Active, Duration::from_secs(60), &coord).await;
    assert_eq!(
        admin.service(&host).await.unwrap().unwrap()["status"],
        "enabled",
        "re-enabled, as the reason allows"
    );
    for id in &ids {
        admin.delete_server(id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_coordinator_killed_at_ten_moments_of_an_eviction_loses_and_doubles_nothing() {
    let _turn = TURN.lock().await;
    let (region, admin, host, mut coord, ids) =
        active_host_with("kill", 3, &["1", "2", "3", "1", "2", "3"]).await;
    request_maintenance(&region, &host, "kill test").await;
    // Ten SIGKILLs at random moments (0.2-2.5 s apart), each followed by a restart.
    let mut seed = jiff::Timestamp::now().as_nanosecond() as u64 | 1;
    let mut moments = Vec::new();
    for _ in 0..10 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let ms = 200 + seed % 2300;
        moments.push(ms);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        coord.kill();
        coord = region.coordinator(None, &["--skip-tests"]);
    }
    region.wait_phase(&host, Phase::Maintenance, Duration::from_secs(300), &coord).await;

    let mut completed_total = 0;
    for id in &ids {
        // No VM lost: every server is ACTIVE, elsewhere.
        let s = admin.server(id).await.unwrap();
        assert_eq!(s["status"], "ACTIVE", "{s}");
        assert_ne!(
            s["OS-EXT-SRV-ATTR:host"].as_str(),
            Some(host.as_str()),
            "{id} still on {host} (kills after {moments:?} ms)"
        );
        // None migrated twice: one completed Nova migration per server, and
        // never more Nova migrations than recorded attempts.
        let migs = admin.migrations_of(id).await.unwrap();
        let completed = migs.iter().filter(|m| m["status"] == "completed").count();
        assert_eq!(completed, 1, "{id}: {migs:?}");
        completed_total += completed;
        let attempts: Vec<Migration> =
            region.migrations().await.into_iter().filter(|m| &m.spec.server_id == id).collect();
        assert!(
            migs.len() <= attempts.len(),
            "{id}: {} Nova migrations for {} recorded attempts",
            migs.len(),
            attempts.len()
        );
    }
    assert_eq!(completed_total, ids.len());
    for id in &ids {
        admin.delete_server(id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn termination_cold_migrates_confirms_refuses_while_a_server_remains_then_decommissions() {
    let _turn = TURN.lock().await;
    let region = Region::start("decom").await;
    let admin = Admin::login(&region.env).await.unwrap();
    let agg = format!("decom-{}", region.id);
    admin.create_aggregate(&agg).await.unwrap();
    let annotations = [
        ("hypervisor.cloud.sap/aggregates", agg.as_str()),
        ("hypervisor.cloud.sap/custom-traits", "CUSTOM_HV_DECOM"),
    ];
    // compute-9: the host this test retires (nothing else uses it).
    let (host, coord, ids) = region.active_host_with(&admin, 8, &["2", "1", "1", "1"], &annotations).await;
    assert_eq!(host, RETIRED_BY_TESTS[0]);
    assert!(admin.aggregates_of(&host).await.unwrap().contains(&agg));
    assert!(admin.traits_of(&host).await.unwrap().contains(&"CUSTOM_HV_DECOM".to_string()));
    // One server cold-migrates, one is left to "somebody else".
    let (cold, skipped) = (ids[2].clone(), ids[3].clone());
    admin.set_metadata(&cold, "hypervisor.cloud.sap:eviction", "cold").await.unwrap();
    admin.set_metadata(&skipped, "hypervisor.cloud.sap:eviction", "skip").await.unwrap();

    let hvs: Api<Hypervisor> = Api::all(region.kube.client.clone());
    let patch = serde_json::json!({"spec": {"maintenance": "termination"}});
    hvs.patch(&host, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();

    // The eviction ends with the skipped server still there: refused, and it says which.
    let msg = region.wait_condition(&host, "Evicted", "InstancesRemain", &coord).await;
    assert!(msg.contains(&skipped) && msg.contains("refusing to decommission"), "{msg}");
    assert!(!ids[..3].iter().any(|id| msg.contains(id.as_str())), "{msg}");
    assert!(admin.service(&host).await.unwrap().is_some(), "the service stays while a server remains");
    assert_eq!(
        region.hypervisor(&host).await.and_then(|h| h.status).and_then(|s| s.phase),
        Some(Phase::Evicting)
    );

    // The cold migration was confirmed: ACTIVE elsewhere, Nova's migration confirmed.
    let s = admin.server(&cold).await.unwrap();
    assert_eq!(s["status"], "ACTIVE", "{s}");
    assert_ne!(s["OS-EXT-SRV-ATTR:host"].as_str(), Some(host.as_str()));
    let migs = admin.migrations_of(&cold).await.unwrap();
    assert!(
        migs.iter().any(|m| m["migration_type"] == "migration" && m["status"] == "confirmed"),
        "{migs:?}"
    );
    for id in &ids[..2] {
        let s = admin.server(id).await.unwrap();
        assert_eq!(s["status"], "ACTIVE", "{s}");
        assert_ne!(s["OS-EXT-SRV-ATTR:host"].as_str(), Some(host.as_str()));
    }

    // Somebody else moves the skipped server; the decommission goes on by itself.
    admin.live_migrate(&skipped).await.unwrap();
    let hv = region.wait_phase(&host, Phase::Decommissioned, Duration::from_secs(120), &coord).await;
    assert_eq!(Region::condition(&hv, "Evicted").1, "Decommissioned");
    assert_eq!(admin.server(&skipped).await.unwrap()["status"], "ACTIVE");

    // Nothing left behind in Nova or Placement, and it stays so while the
    // compute's periodic resource update (every 10 s here) runs twice.
    for round in 0..2 {
        assert!(admin.service(&host).await.unwrap().is_none(), "round {round}: service left");
        assert!(admin.providers_named(&host).await.unwrap().is_empty(), "round {round}: provider left");
        assert!(admin.aggregates_of(&host).await.unwrap().is_empty(), "round {round}: aggregate left");
        if round == 0 {
            tokio::time::sleep(Duration::from_secs(25)).await;
        }
    }
    // The Hypervisor stays as the record.
    assert_eq!(
        region.hypervisor(&host).await.and_then(|h| h.status).and_then(|s| s.phase),
        Some(Phase::Decommissioned)
    );
    for id in &ids {
        admin.delete_server(id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn preflight_stops_before_anything_moves_naming_each_vm_and_force_skips_named_checks() {
    let _turn = TURN.lock().await;
    let region = Region::start("preflight").await;
    let admin = Admin::login(&region.env).await.unwrap();
    let id = &region.id;
    let zone = format!("pf-az-{id}");
    let zone_id = admin.create_zone(&zone).await.unwrap();
    let required = serde_json::json!({"trait:CUSTOM_HV_PREFLIGHT": "required"});
    let trait_flavor = admin.create_flavor(&format!("pf-trait-{id}"), 512, required).await.unwrap();
    let big = admin.create_flavor(&format!("pf-big-{id}"), 500_000, serde_json::json!({})).await.unwrap();
    let ballast =
        admin.create_flavor(&format!("pf-ballast-{id}"), 400_000, serde_json::json!({})).await.unwrap();
    // compute-6 joins its own zone and carries the trait nobody else has.
    let annotations = [
        ("hypervisor.cloud.sap/aggregates", zone.as_str()),
        ("hypervisor.cloud.sap/custom-traits", "CUSTOM_HV_PREFLIGHT"),
    ];
    let (host, coord, _) = region.active_host_with(&admin, 5, &[], &annotations).await;
    let pinned = admin.boot_in(&format!("{id}-pinned"), &host, "1", Some(&zone)).await.unwrap();
    let traited = admin.boot_on(&format!("{id}-traited"), &host, &trait_flavor).await.unwrap();
    let huge = admin.boot_on(&format!("{id}-huge"), &host, &big).await.unwrap();
    let plain = admin.boot_on(&format!("{id}-plain"), &host, "1").await.unwrap();
    // Every other host keeps less than 500 000 MB free.
    let mut ballasts = Vec::new();
    for other in admin.enabled_hosts().await.unwrap().into_iter().filter(|h| *h != host) {
        ballasts.push(admin.boot_on(&format!("{id}-ballast-{other}"), &other, &ballast).await.unwrap());
    }

    let name = format!("pf-{id}");
    let options = EvictionOptions { max_attempts: 1, ..EvictionOptions::default() };
    let evs = create_eviction(&region, &name, &host, options).await;
    let ev = wait_eviction(&evs, &name, EvictionPhase::Failed, &coord).await;
    let st = ev.status.unwrap();
    let cond = st.conditions.iter().find(|c| c.type_ == "Preflight").cloned().unwrap();
    assert_eq!((cond.status.as_str(), cond.reason.as_str()), ("False", "Failed"));
    let msg = &cond.message;
    assert!(msg.starts_with("3 VM(s) cannot be moved"), "{msg}");
    assert!(
        msg.contains(&format!("constraints {pinned}")) && msg.contains(&format!("availability zone {zone}")),
        "{msg}"
    );
    assert!(msg.contains(&format!("constraints {traited}")) && msg.contains("CUSTOM_HV_PREFLIGHT"), "{msg}");
    assert!(msg.contains(&format!("capacity {huge}")) && msg.contains("MEMORY_MB 500000"), "{msg}");
    assert!(!msg.contains(&plain), "{msg}");
    // Nothing moved, nothing was asked of Nova.
    assert!(region.migrations_of(&name).await.is_empty());
    for s in [&pinned, &traited, &huge, &plain] {
        assert_eq!(admin.server(s).await.unwrap()["OS-EXT-SRV-ATTR:host"].as_str(), Some(host.as_str()));
        assert!(admin.migrations_of(s).await.unwrap().is_empty(), "{s} was migrated");
    }

    // Forcing two checks runs it again; Nova's scheduler then refuses those
    // three itself, they end non-migratable, and the plain one moves.
    let patch = serde_json::json!({"spec": {"options": {"force": ["constraints", "capacity"]}}});
    evs.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let ev = wait_eviction(&evs, &name, EvictionPhase::Succeeded, &coord).await;
    let st = ev.status.unwrap();
    let cond = st.conditions.iter().find(|c| c.type_ == "Preflight").cloned().unwrap();
    assert_eq!(cond.status, "True");
    assert!(cond.message.contains("skipped (force): constraints, capacity"), "{}", cond.message);
    let state = |s: &str| st.vms.iter().find(|v| v.id == s).map(|v| v.state);
    assert_eq!(state(&plain), Some(VmState::Migrated));
    for s in [&pinned, &traited, &huge] {
        assert_eq!(state(s), Some(VmState::NonMigratable), "{:?}", st.vms);
        assert_eq!(admin.server(s).await.unwrap()["status"], "ACTIVE", "{s} lost");
        assert_eq!(admin.server(s).await.unwrap()["OS-EXT-SRV-ATTR:host"].as_str(), Some(host.as_str()));
    }
    assert_ne!(admin.server(&plain).await.unwrap()["OS-EXT-SRV-ATTR:host"].as_str(), Some(host.as_str()));

    // Leave compute-6 as it was: no servers, out of the zone.
    drop(coord);
    for s in [pinned, traited, huge, plain].iter().chain(&ballasts) {
        admin.delete_server(s).await.unwrap();
    }
    for _ in 0..100 {
        if admin.remove_from_aggregate(zone_id, &host).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_the_node_decommissions_its_host_and_keeps_the_hypervisor_as_the_record() {
    let _turn = TURN.lock().await;
    let region = Region::start("nodedel").await;
    let admin = Admin::login(&region.env).await.unwrap();
    // compute-10: the host this test retires.
    let (host, coord, ids) = region.active_host_with(&admin, 9, &["1", "2"], &[]).await;
    assert_eq!(host, RETIRED_BY_TESTS[1]);
    let nodes: Api<Node> = Api::all(region.kube.client.clone());
    let node = nodes.get(&host).await.unwrap();
    assert!(
        node.finalizers().iter().any(|f| f == "hypervisor.cloud.sap/decommission"),
        "{:?}",
        node.finalizers()
    );
    assert!(region.hypervisor(&host).await.unwrap().metadata.owner_references.is_some_and(|o| !o.is_empty()));

    nodes.delete(&host, &DeleteParams::default()).await.unwrap();
    // Held while the host is emptied and removed from Nova.
    let held = nodes.get_opt(&host).await.unwrap();
    assert!(
        held.is_some_and(|n| n.metadata.deletion_timestamp.is_some()),
        "the Node waits for the decommission"
    );
    region.wait_phase(&host, Phase::Decommissioned, Duration::from_secs(120), &coord).await;
    for id in &ids {
        let s = admin.server(id).await.unwrap();
        assert_eq!(s["status"], "ACTIVE", "{s}");
        assert_ne!(s["OS-EXT-SRV-ATTR:host"].as_str(), Some(host.as_str()));
    }
    assert!(admin.service(&host).await.unwrap().is_none());
    assert!(admin.providers_named(&host).await.unwrap().is_empty());

    // Then the Node goes, and the Hypervisor stays, orphaned so the garbage
    // collector leaves it (the stand-in has none; the owner reference is what it reads).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while nodes.get_opt(&host).await.unwrap().is_some() {
        assert!(tokio::time::Instant::now() < deadline, "the Node was never released:\n{}", coord.tail(30));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let hv = region.hypervisor(&host).await.unwrap();
    assert!(
        hv.metadata.owner_references.as_ref().is_none_or(Vec::is_empty),
        "{:?}",
        hv.metadata.owner_references
    );
    assert_eq!(hv.status.and_then(|s| s.phase), Some(Phase::Decommissioned));
    for id in &ids {
        admin.delete_server(id).await.unwrap();
    }
}
