//! Evictions on the real Nova (docs/eviction.md): maintenance empties a host of
//! servers of mixed sizes (disabled with our reason, one Migration object
//! per attempt) and clearing it brings the host back; stuck migrations are
//! aborted (Nova shows them cancelled), retried, and recorded
//! non-migratable once the attempts run out while the rest finish; an
//! Eviction deleted mid-way aborts what is in flight; a Migration left by
//! an earlier Eviction of the same name is never taken for ours (its
//! attempt counts as not sent); a coordinator killed
//! ten times loses and doubles nothing; a preflight stops before anything
//! moves and `force` skips named checks; termination (by spec or by
//! deleting the Node) cold-migrates and confirms, refuses while a server
//! remains, and decommissions the host without leaving anything in Nova.
//!
//! Each test moves servers within a zone of its own hosts
//! (`hosts::zone`), so what one eviction moves never lands on another
//! test's host, and the tests run side by side. Nova's fake
//! live-migration driver holds each migration about 5 s and reports no
//! progress counters, so only the completion clock can find one stuck.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hv_coordinator::api::eviction::{EvictionOptions, EvictionReason, EvictionSpec};
use hv_coordinator::api::eviction::{EvictionPhase, VmState};
use hv_coordinator::api::migration::{MigrationKind, MigrationPhase, MigrationSpec, migration_name};
use hv_coordinator::api::{Eviction, Hypervisor, Migration, Phase};
use hv_tests::hosts::{self, Zone};
use hv_tests::openstack::{Admin, FakeHost, fake_host};
use hv_tests::region::{Proc, Region};
use hv_tests::wait::{Poll, ready_when, until};
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};

/// A zone of its own (a source host and two to move to), the source
/// Active with servers of `flavors`.
struct Scene {
    region: Region,
    admin: Admin,
    host: String,
    coord: Proc,
    ids: Vec<String>,
    zone: Zone,
}

async fn scene(test: &str, flavors: &[&str], annotations: &[(&str, &str)]) -> Scene {
    let region = Region::start(test).await;
    let zone = hosts::zone(&region.env, 2).await;
    let admin = Admin::login(&region.env).await.unwrap();
    let (host, coord, ids) = region.active_host_with(&admin, &zone, flavors, annotations).await;
    Scene { region, admin, host, coord, ids, zone }
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
        EvictionSpec {
            hypervisor: host.into(),
            reason: EvictionReason::AdminRequest,
            options,
            dry_run: false,
        },
    );
    evs.create(&PostParams::default(), &ev).await.unwrap();
    evs
}

async fn wait_eviction(evs: &Api<Eviction>, name: &str, want: EvictionPhase, coord: &Proc) -> Eviction {
    until(
        &format!("{name} {want:?}"),
        Duration::from_secs(180),
        || coord.tail(30),
        || async {
            match evs.get_opt(name).await.unwrap() {
                Some(e) if e.status.as_ref().and_then(|s| s.phase) == Some(want) => Poll::Ready(e),
                other => Poll::Pending(format!("{:?}", other.and_then(|e| e.status))),
            }
        },
    )
    .await
}

/// One sample of the coordinator's `/metrics`; a missing one fails the test.
async fn metric(coord: &Proc, name: &str) -> f64 {
    let url = coord.metrics.clone().unwrap();
    hv_tests::region::metric(&url, name).await.unwrap_or_else(|| panic!("no {name} at {url}"))
}

/// What the coordinator's and the agent's `/metrics` say of an eviction.
#[derive(Debug)]
struct Figures {
    /// `POST servers/{id}/action` answered by Nova (live migrations and
    /// any other server action).
    live_migrations: f64,
    eviction_reconciles: f64,
    hypervisor_reconciles: f64,
    server_reads: f64,
    authenticated: f64,
    sessions: f64,
    heartbeats: f64,
    agent_connected: f64,
    agent_acked: f64,
}

impl Figures {
    async fn read(coord: &Proc, agent: &Proc) -> Figures {
        let c = coord.metrics.clone().unwrap();
        let a = agent.agent_metrics().expect("the agent's metrics address in its log");
        let sum = |url: &str, prefix: &str| {
            let (url, prefix) = (url.to_string(), prefix.to_string());
            async move { hv_tests::region::metric_sum(&url, &prefix).await.unwrap_or_else(|| panic!("no {url}")) }
        };
        Figures {
            live_migrations: sum(
                &c,
                "hv_openstack_requests_total{service=\"compute\",operation=\"POST servers/{id}/action\",status=\"202\"}",
            )
            .await,
            eviction_reconciles: sum(&c, "hv_reconciles_total{controller=\"eviction\",result=\"ok\"}").await,
            hypervisor_reconciles: sum(&c, "hv_reconcile_duration_seconds_count{controller=\"hypervisor\"}").await,
            server_reads: sum(&c, "hv_openstack_requests_total{service=\"compute\",operation=\"GET servers/").await,
            authenticated: sum(&c, "hv_openstack_requests_total{service=\"identity\",operation=\"authenticate\",status=\"ok\"}").await,
            sessions: sum(&c, "hv_coordinator_agent_sessions ").await,
            heartbeats: sum(&c, "hv_coordinator_agent_messages_total{kind=\"heartbeat\"}").await,
            agent_connected: sum(&a, "hv_agent_session_connected ").await,
            agent_acked: sum(&a, "hv_agent_acked_seq ").await,
        }
    }

    /// Once the agent's session is up at both ends.
    async fn wait_for_session(coord: &Proc, agent: &Proc) -> Figures {
        until(
            "the agent's session counted at both ends",
            Duration::from_secs(30),
            || agent.tail(10),
            || async {
                if agent.agent_metrics().is_none() {
                    return Poll::Pending("no metrics address yet".to_string());
                }
                let f = Figures::read(coord, agent).await;
                if f.sessions == 1.0 && f.agent_connected == 1.0 {
                    Poll::Ready(f)
                } else {
                    Poll::Pending(format!("{f:?}"))
                }
            },
        )
        .await
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn maintenance_empties_the_host_and_clearing_it_brings_the_host_back() {
    // Ten servers of three sizes (m1.tiny 512 MiB, m1.small 2 GiB, m1.medium 4 GiB).
    let flavors = ["1", "2", "3", "1", "2", "1", "3", "1", "2", "1"];
    let Scene { region, admin, host, coord, ids, zone } = scene("evict", &flavors, &[]).await;
    // An agent on the host, so that both ends' metrics move with the eviction.
    let agent = region.agent(&host, &hv_tests::region::AgentPeers::default());
    let before = Figures::wait_for_session(&coord, &agent).await;
    let hvs = request_maintenance(&region, &host, "firmware update").await;
    // Scraped while it runs: the host counted as Evicting, migrations started.
    let url = coord.metrics.clone().unwrap();
    let watching = tokio::spawn(async move {
        let mut seen = Vec::new();
        loop {
            let evicting =
                hv_tests::region::metric_sum(&url, "hv_hypervisors{phase=\"Evicting\"}").await.unwrap_or(0.0);
            let started = hv_tests::region::metric_sum(&url, "hv_eviction_migrations_started_total")
                .await
                .unwrap_or(0.0);
            seen.push((evicting, started));
            if started >= 10.0 && evicting == 0.0 {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let hv = region.wait_phase(&host, Phase::Maintenance, Duration::from_secs(240), &coord).await;
    let seen = tokio::time::timeout(Duration::from_secs(30), watching).await.expect("scrapes end").unwrap();
    assert!(
        seen.iter().any(|(evicting, started)| *evicting == 1.0 && (1.0..10.0).contains(started)),
        "the host Evicting with some migrations started, in a scrape: {seen:?}"
    );
    assert!(seen.windows(2).all(|w| w[0].1 <= w[1].1), "started only grows: {seen:?}");
    assert_eq!(hv.status.as_ref().map(|s| s.instances.as_ref().map_or(0, |i| i.count)), Some(0));

    // Nova: every server ACTIVE elsewhere; the host disabled with our reason.
    for id in &ids {
        let s = admin.server(id).await.unwrap();
        assert_eq!(s["status"], "ACTIVE", "{s}");
        let now_on = s["OS-EXT-SRV-ATTR:host"].as_str().unwrap_or_default();
        assert_ne!(now_on, host, "{id} still on {host}");
        assert!(zone.holds(now_on), "{id} left its zone for {now_on}");
    }
    let svc = admin.service(&host).await.unwrap().unwrap();
    assert_eq!(svc["status"], "disabled");
    assert!(svc["disabled_reason"].as_str().unwrap_or_default().contains("firmware update"), "{svc}");

    // The record: an Eviction with every VM migrated, largest first, and a Migration per attempt.
    let ev = region.evictions_of(&host).await.into_iter().next().unwrap();
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
    let after = Figures::read(&coord, &agent).await;
    assert!(after.live_migrations >= before.live_migrations + 10.0, "{before:?} then {after:?}");
    assert!(after.eviction_reconciles > before.eviction_reconciles, "{before:?} then {after:?}");
    assert!(after.hypervisor_reconciles > before.hypervisor_reconciles, "{before:?} then {after:?}");
    assert!(after.server_reads > before.server_reads, "its servers watched: {before:?} then {after:?}");
    assert!(after.heartbeats > before.heartbeats, "{before:?} then {after:?}");
    assert!(after.agent_acked > before.agent_acked, "{before:?} then {after:?}");
    assert_eq!((after.sessions, after.agent_connected), (1.0, 1.0));
    assert_eq!(metric(&coord, "hv_hypervisors{phase=\"Maintenance\"}").await, 1.0);
    assert_eq!(metric(&coord, "hv_hypervisors{phase=\"Evicting\"}").await, 0.0);
    assert!(after.authenticated >= 1.0, "Keystone's token counted: {after:?}");

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
    // Two 8 GiB servers (24 s allowed, done in about 5 s, more on a busy
    // machine) and two 512 MiB ones (3 s allowed, held: always stuck).
    let Scene { region, admin, host, coord, ids, zone: _zone } =
        scene("stuck", &["4", "4", "1", "1"], &[]).await;
    // The small ones never end unless aborted: their clock starts only once
    // Nova is seen running them, a moment after it does.
    for id in &ids[2..] {
        hv_tests::openstack::hold_live_migrations(&region.env.nova, id, 3600, false).await.unwrap();
    }
    let options = EvictionOptions {
        max_parallel: 1,
        completion_timeout_per_gib_seconds: 3,
        max_attempts: 2,
        re_enable: Some(true),
        // Aborted at once: forcing is shown in finishing.rs.
        force_complete: false,
        ..EvictionOptions::default()
    };
    let name = format!("stuck-{}", std::process::id());
    let evs = create_eviction(&region, &name, &host, options).await;
    let ev = wait_eviction(&evs, &name, EvictionPhase::Succeeded, &coord).await;
    let st = ev.status.unwrap();
    assert_eq!((st.total, st.migrated, st.non_migratable), (4, 2, 2), "{:?}", st.vms);
    for vm in st.vms.iter().filter(|v| v.state == VmState::NonMigratable) {
        assert_eq!(vm.attempts, 2);
        // Stuck on its clock, or queued in Nova past its bound behind the
        // migrations of tests running beside it (the ground's Nova runs
        // one at a time region-wide).
        let stuck = vm.reason.contains("over the 3s") || vm.reason.contains("queued in Nova");
        assert!(stuck, "{}", vm.reason);
        let s = admin.server(&vm.id).await.unwrap();
        assert_eq!(
            (s["status"].as_str(), s["OS-EXT-SRV-ATTR:host"].as_str()),
            (Some("ACTIVE"), Some(host.as_str()))
        );
    }
    let migs = region.migrations_of(&name).await;
    assert_eq!(migs.len(), 6, "2 attempts for each small server, 1 for each large one: {:?}", st.vms);
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
    let Scene { region, admin, host, coord, ids, zone: _zone } = scene("cancel", &["3"], &[]).await;
    let options = EvictionOptions { re_enable: Some(true), ..EvictionOptions::default() };
    let name = format!("cancel-{}", std::process::id());
    let evs = create_eviction(&region, &name, &host, options).await;
    until(
        "a migration running",
        Duration::from_secs(60),
        || coord.tail(30),
        || async {
            let migs = region.migrations_of(&name).await;
            let running = migs
                .iter()
                .any(|m| m.status.as_ref().and_then(|s| s.nova_status.as_deref()) == Some("running"));
            ready_when(running, migs.len())
        },
    )
    .await;
    evs.delete(&name, &DeleteParams::default()).await.unwrap();
    until(
        "the Eviction released",
        Duration::from_secs(60),
        || coord.tail(30),
        || async { ready_when(evs.get_opt(&name).await.unwrap().is_none(), ()) },
    )
    .await;
    let s = admin.server(&ids[0]).await.unwrap();
    assert_eq!(s["OS-EXT-SRV-ATTR:host"].as_str(), Some(host.as_str()), "the aborted VM stayed");
    // Nova: the migration was cancelled, nothing completed.
    let nova = admin.migrations_of(&ids[0]).await.unwrap();
    assert!(nova.iter().all(|m| m["status"] != "completed"), "nothing completed after the delete: {nova:?}");
    assert!(nova.iter().any(|m| m["status"] == "cancelled"), "{nova:?}");
    // Its Migration objects went with it (the garbage collector).
    assert!(region.migrations_of(&name).await.is_empty());
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
    let Scene { region, admin, host, mut coord, ids, zone: _zone } =
        scene("kill", &["1", "2", "3", "1", "2", "3"], &[]).await;
    request_maintenance(&region, &host, "kill test").await;
    // Ten SIGKILLs at random moments (0.2-2.5 s apart), each followed by a restart.
    let moments = hv_tests::wait::random_moments(10);
    for &ms in &moments {
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
    let region = Region::start("decom").await;
    let zone = hosts::zone(&region.env, 2).await;
    // This test deletes the host's compute service: no other test gets it.
    zone.source.retire();
    let admin = Admin::login(&region.env).await.unwrap();
    let agg = format!("decom-{}", region.id);
    admin.create_aggregate(&agg).await.unwrap();
    let annotations = [
        ("hypervisor.cloud.sap/aggregates", agg.as_str()),
        ("hypervisor.cloud.sap/custom-traits", "CUSTOM_HV_DECOM"),
    ];
    let (host, coord, ids) =
        region.active_host_with(&admin, &zone, &["2", "1", "1", "1"], &annotations).await;
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

    // The host is re-installed and its nova-compute starts again: Nova
    // registers a new service, enabled (the ground runs with Nova's default
    // enable_new_services = True). The coordinator disables it within one
    // drift interval and says so.
    fake_host(&region.env.nova, &host, FakeHost::Start).await.unwrap();
    // From the moment Nova lists the service again (our own polling adds up
    // to its interval) until it is disabled.
    let registered = std::sync::Mutex::new(None::<std::time::Instant>);
    let svc = until(
        "the re-registered service disabled",
        Duration::from_secs(60),
        || coord.tail(30),
        || async {
            // A passing error of Nova's is a poll that saw nothing.
            let svc = admin.service(&host).await.ok().flatten();
            if svc.is_some() {
                registered.lock().unwrap().get_or_insert_with(std::time::Instant::now);
            }
            match svc {
                Some(svc) if svc["status"] == "disabled" => Poll::Ready(svc),
                other => Poll::Pending(format!("{other:?}")),
            }
        },
    )
    .await;
    assert!(svc["disabled_reason"].as_str().unwrap_or_default().contains("decommissioned"), "{svc}");
    let took = registered.lock().unwrap().map(|t| t.elapsed()).unwrap_or_default();
    eprintln!("re-registered service disabled {took:?} after Nova listed it");
    // The drift interval here is 2 s: one interval, plus the reconcile's own
    // Nova round trips, with room for a loaded 2-core machine. A host left
    // enabled until some slower cycle (or never) fails here.
    assert!(took <= Duration::from_secs(10), "disabled {took:?} after it registered; drift interval 2 s");
    // The status is written right after Nova is told.
    region.wait_condition(&host, "SchedulingEnabled", "ReRegistered", &coord).await;
    let hv = region.hypervisor(&host).await.unwrap();
    assert_eq!(hv.status.as_ref().and_then(|s| s.phase), Some(Phase::Decommissioned));
    let events = region.events_for(&host).await;
    assert!(events.iter().any(|(r, _)| r == "ServiceReRegistered"), "{events:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn preflight_stops_before_anything_moves_naming_each_vm_and_force_skips_named_checks() {
    let region = Region::start("preflight").await;
    // One host to move to: capacity and constraints are judged against it.
    let zone = hosts::zone(&region.env, 1).await;
    let target = zone.targets[0].host.clone();
    let admin = Admin::login(&region.env).await.unwrap();
    let id = &region.id;
    let required = serde_json::json!({"trait:CUSTOM_HV_PREFLIGHT": "required"});
    let trait_flavor = admin.create_flavor(&format!("pf-trait-{id}"), 512, required).await.unwrap();
    let big = admin.create_flavor(&format!("pf-big-{id}"), 500_000, serde_json::json!({})).await.unwrap();
    let ballast =
        admin.create_flavor(&format!("pf-ballast-{id}"), 400_000, serde_json::json!({})).await.unwrap();
    // The host carries the trait nobody else has.
    let annotations = [("hypervisor.cloud.sap/custom-traits", "CUSTOM_HV_PREFLIGHT")];
    let (host, coord, _) = region.active_host_with(&admin, &zone, &[], &annotations).await;
    let traited = zone.boot(&admin, &format!("{id}-traited"), &host, &trait_flavor).await;
    let huge = zone.boot(&admin, &format!("{id}-huge"), &host, &big).await;
    let plain = zone.boot(&admin, &format!("{id}-plain"), &host, "1").await;
    // The host to move to keeps less than 500 000 MB free.
    let held = zone.boot(&admin, &format!("{id}-ballast"), &target, &ballast).await;

    let name = format!("pf-{id}");
    let options = EvictionOptions { max_attempts: 1, ..EvictionOptions::default() };
    let evs = create_eviction(&region, &name, &host, options).await;
    let ev = wait_eviction(&evs, &name, EvictionPhase::Failed, &coord).await;
    let st = ev.status.unwrap();
    let cond = st.conditions.iter().find(|c| c.type_ == "Preflight").cloned().unwrap();
    assert_eq!((cond.status.as_str(), cond.reason.as_str()), ("False", "Failed"));
    let msg = &cond.message;
    assert!(msg.starts_with("2 VM(s) cannot be moved"), "{msg}");
    assert!(msg.contains(&format!("constraints {traited}")) && msg.contains("CUSTOM_HV_PREFLIGHT"), "{msg}");
    assert!(msg.contains(&format!("capacity {huge}")) && msg.contains("MEMORY_MB 500000"), "{msg}");
    assert!(!msg.contains(&plain), "{msg}");
    // Nothing moved, nothing was asked of Nova.
    assert!(region.migrations_of(&name).await.is_empty());
    for s in [&traited, &huge, &plain] {
        assert_eq!(admin.server(s).await.unwrap()["OS-EXT-SRV-ATTR:host"].as_str(), Some(host.as_str()));
        assert!(admin.migrations_of(s).await.unwrap().is_empty(), "{s} was migrated");
    }

    // Forcing two checks runs it again; Nova's scheduler then refuses those
    // two itself, they end non-migratable, and the plain one moves.
    let patch = serde_json::json!({"spec": {"options": {"force": ["constraints", "capacity"]}}});
    evs.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let ev = wait_eviction(&evs, &name, EvictionPhase::Succeeded, &coord).await;
    let st = ev.status.unwrap();
    let cond = st.conditions.iter().find(|c| c.type_ == "Preflight").cloned().unwrap();
    assert_eq!(cond.status, "True");
    assert!(cond.message.contains("skipped (force): constraints, capacity"), "{}", cond.message);
    let state = |s: &str| st.vms.iter().find(|v| v.id == s).map(|v| v.state);
    assert_eq!(state(&plain), Some(VmState::Migrated));
    for s in [&traited, &huge] {
        assert_eq!(state(s), Some(VmState::NonMigratable), "{:?}", st.vms);
        assert_eq!(admin.server(s).await.unwrap()["status"], "ACTIVE", "{s} lost");
        assert_eq!(admin.server(s).await.unwrap()["OS-EXT-SRV-ATTR:host"].as_str(), Some(host.as_str()));
    }
    assert_eq!(admin.server(&plain).await.unwrap()["OS-EXT-SRV-ATTR:host"].as_str(), Some(target.as_str()));
    drop(coord);
    for s in [traited, huge, plain, held] {
        admin.delete_server(&s).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_migration_left_by_an_earlier_eviction_of_the_same_name_is_never_taken_for_ours() {
    let Scene { region, admin, host, coord, ids, zone: _zone } = scene("leftover", &["1"], &[]).await;
    let name = format!("leftover-{}", region.id);
    // What an earlier Eviction `name` left of the same server's first
    // attempt, saying it completed, its owner gone and not yet collected.
    let left = migration_name(&name, &ids[0], 1);
    let migs: Api<Migration> = Api::all(region.kube.client.clone());
    let spec = MigrationSpec {
        eviction: name.clone(),
        server_id: ids[0].clone(),
        server_name: String::new(),
        source_host: host.clone(),
        attempt: 1,
        policy: MigrationKind::LiveMigrate,
        block_migration: false,
        memory_bytes: 0,
    };
    migs.create(&PostParams::default(), &Migration::new(&left, spec)).await.unwrap();
    let done = serde_json::json!({"status": {"phase": "Completed", "targetHost": "elsewhere"}});
    migs.patch_status(&left, &PatchParams::default(), &Patch::Merge(&done)).await.unwrap();

    // The first attempt is never asked for: not sent, not failed; the
    // second, under a name of its own, moves the server once.
    let evs = create_eviction(&region, &name, &host, EvictionOptions::default()).await;
    let ev = wait_eviction(&evs, &name, EvictionPhase::Succeeded, &coord).await;
    let vm = ev.status.unwrap().vms.into_iter().next().unwrap();
    assert_eq!((vm.state, vm.attempts, vm.not_sent), (VmState::Migrated, 2, 1), "{vm:?}");
    let nova = admin.migrations_of(&ids[0]).await.unwrap();
    assert_eq!(nova.len(), 1, "moved once: {nova:?}");
    let now_on = admin.server(&ids[0]).await.unwrap()["OS-EXT-SRV-ATTR:host"].as_str().map(str::to_string);
    assert_eq!(now_on, vm.target_host, "the record names where Nova put it");
    let refusals = "hv_reconcile_errors_total{controller=\"eviction\",kind=\"leftover_migration\"}";
    let url = coord.metrics.clone().unwrap();
    assert_eq!(hv_tests::region::metric_sum(&url, refusals).await, Some(1.0), "the leftover met once");
    // The leftover, neither adopted nor written.
    let kept = migs.get(&left).await.unwrap();
    assert!(kept.metadata.owner_references.is_none(), "{kept:?}");
    let kept = kept.status.unwrap();
    assert_eq!(
        (kept.phase, kept.target_host.as_deref()),
        (Some(MigrationPhase::Completed), Some("elsewhere"))
    );
    migs.delete(&left, &DeleteParams::default()).await.unwrap();
    admin.delete_server(&ids[0]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_pinned_to_a_zone_with_no_other_host_fails_the_preflight() {
    let region = Region::start("pinned").await;
    // A zone of the host alone: its servers have nowhere to go.
    let zone = hosts::zone(&region.env, 0).await;
    let admin = Admin::login(&region.env).await.unwrap();
    let (host, coord, ids) = region.active_host_with(&admin, &zone, &["1"], &[]).await;
    let name = format!("pin-{}", region.id);
    let evs = create_eviction(&region, &name, &host, EvictionOptions::default()).await;
    let ev = wait_eviction(&evs, &name, EvictionPhase::Failed, &coord).await;
    let cond = ev.status.unwrap().conditions.into_iter().find(|c| c.type_ == "Preflight").unwrap();
    assert!(
        cond.message.contains(&format!("constraints {}", ids[0]))
            && cond.message.contains(&format!("availability zone {}", zone.name)),
        "{}",
        cond.message
    );
    assert!(admin.migrations_of(&ids[0]).await.unwrap().is_empty());
    drop(coord);
    admin.delete_server(&ids[0]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_the_node_decommissions_its_host_and_keeps_the_hypervisor_as_the_record() {
    let region = Region::start("nodedel").await;
    let zone = hosts::zone(&region.env, 2).await;
    // This test deletes the host's compute service: no other test gets it.
    zone.source.retire();
    let admin = Admin::login(&region.env).await.unwrap();
    let (host, coord, ids) = region.active_host_with(&admin, &zone, &["1", "2"], &[]).await;
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
    // collector leaves it.
    until(
        "the Node released",
        Duration::from_secs(30),
        || coord.tail(30),
        || async { ready_when(nodes.get_opt(&host).await.unwrap().is_none(), ()) },
    )
    .await;
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

#[tokio::test(flavor = "multi_thread")]
async fn deleting_the_hypervisor_of_a_host_in_service_waits_until_its_host_is_decommissioned() {
    let Scene { region, admin, host, coord, ids, zone } = scene("hvdel", &["1"], &[]).await;
    // The way out of the held deletion decommissions the host.
    zone.source.retire();
    let hvs: Api<Hypervisor> = Api::all(region.kube.client.clone());
    let uid = hvs.get(&host).await.unwrap().metadata.uid.unwrap();
    hvs.delete(&host, &DeleteParams::default()).await.unwrap();
    let held = until(
        "the deletion held",
        Duration::from_secs(30),
        || coord.tail(20),
        || async {
            let hv = region.hypervisor(&host).await.unwrap();
            let (status, reason, message) = Region::condition(&hv, "Deleting");
            ready_when(status == "False" && reason == "Held", message)
        },
    )
    .await;
    assert!(held.contains("1 instance(s)") && held.contains("termination"), "{held}");
    // Nothing changed in Nova, and the Node keeps its finalizer.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(admin.service(&host).await.unwrap().unwrap()["status"], "enabled");
    let s = admin.server(&ids[0]).await.unwrap();
    assert_eq!(
        (s["status"].as_str(), s["OS-EXT-SRV-ATTR:host"].as_str()),
        (Some("ACTIVE"), Some(host.as_str()))
    );
    let nodes: Api<Node> = Api::all(region.kube.client.clone());
    assert!(
        nodes.get(&host).await.unwrap().finalizers().iter().any(|f| f == "hypervisor.cloud.sap/decommission")
    );

    // Termination, as the condition says: the host is emptied and leaves
    // Nova, and then the Hypervisor goes.
    let patch = serde_json::json!({"spec": {"maintenance": "termination"}});
    hvs.patch(&host, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    until(
        "the Hypervisor gone",
        Duration::from_secs(240),
        || coord.tail(30),
        || async {
            let hv = region.hypervisor(&host).await;
            let phase = hv.as_ref().and_then(|h| h.status.as_ref()).and_then(|s| s.phase);
            ready_when(hv.is_none_or(|h| h.metadata.uid.as_deref() != Some(uid.as_str())), phase)
        },
    )
    .await;
    assert!(admin.service(&host).await.unwrap().is_none(), "the compute service was deleted");
    let s = admin.server(&ids[0]).await.unwrap();
    let now_on = s["OS-EXT-SRV-ATTR:host"].as_str().unwrap_or_default();
    assert!(s["status"] == "ACTIVE" && zone.holds(now_on) && now_on != host, "{s}");
    admin.delete_server(&ids[0]).await.unwrap();
}
