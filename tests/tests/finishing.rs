//! Evictions that finish, on the real Nova (docs/eviction.md): a live
//! migration that will not converge is forced to complete through Nova's
//! `force_complete` and lands on its first attempt, while one that ignores
//! the force is aborted after the grace; a server of policy
//! `liveMigrateIfPossible` that Nova cannot move live (it is stopped) is
//! cold-migrated from its first attempt; a server of policy `external` is marked in
//! its metadata, left to its owner, and unmarked once its owner moved it;
//! the preflight keeps the members of an anti-affinity group apart, as
//! Nova's scheduler then does.
//!
//! The region's control port holds a server's live migrations as long as
//! a test asks (a guest whose memory changes faster than it is copied),
//! and lets them obey or ignore a force to complete.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hv_coordinator::api::eviction::{EvictionOptions, EvictionPhase, EvictionReason, VmState};
use hv_coordinator::api::keys::{EVICT_FROM_METADATA, POLICY_METADATA};
use hv_coordinator::api::migration::{MigrationKind, MigrationPhase};
use hv_tests::hosts;
use hv_tests::openstack::{Admin, hold_live_migrations, live_migrations_at_once};
use hv_tests::region::{Proc, Region};
use hv_tests::wait::{Poll, until};

async fn outcome(coord: &Proc, outcome: &str) -> f64 {
    let name = format!("hv_eviction_migration_outcomes_total{{outcome=\"{outcome}\"}}");
    hv_tests::region::metric(coord.metrics.as_deref().unwrap(), &name).await.unwrap_or(-1.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stuck_live_migration_is_forced_to_complete_and_one_that_ignores_it_is_aborted() {
    let region = Region::start("forced").await;
    let zone = hosts::zone(&region.env, 2).await;
    let admin = Admin::login(&region.env).await.unwrap();
    let (host, coord, ids) = region.active_host_with(&admin, &zone, &["1", "1"], &[]).await;
    let (obeys, ignores) = (&ids[0], &ids[1]);
    // The ground's Nova runs one live migration at a time region-wide
    // (production: per host). Held ones here would hold up every other
    // test's: from here on it runs three at once, as hosts would.
    live_migrations_at_once(&region.env.nova, 3).await.unwrap();
    // Live if it can: forced all the same (its status reads MIGRATING
    // while it moves, which must not make it count as cold).
    admin.set_metadata(obeys, POLICY_METADATA, "live-if-possible").await.unwrap();
    // Neither would end within the test without a word from us.
    hold_live_migrations(&region.env.nova, obeys, 3600, true).await.unwrap();
    hold_live_migrations(&region.env.nova, ignores, 3600, false).await.unwrap();
    // 512 MiB counts as 1 GiB: stuck after 5 s; 10 s of grace after the
    // force. One at a time: Nova runs one live migration at a time here,
    // and one it queues cannot be forced (it is aborted when stuck).
    let options = EvictionOptions {
        max_parallel: 1,
        completion_timeout_per_gib_seconds: 5,
        progress_timeout_seconds: 10,
        max_attempts: 1,
        re_enable: Some(true),
        ..EvictionOptions::default()
    };
    let name = format!("forced-{}", std::process::id());
    region.create_eviction(&name, &host, EvictionReason::AdminRequest, options).await;
    let ev = region.wait_eviction(&name, EvictionPhase::Succeeded, Duration::from_secs(180), &coord).await;
    let st = ev.status.unwrap();
    let vm = |id: &str| st.vms.iter().find(|v| v.id == id).cloned().unwrap();

    // Forced, and moved by its first and only attempt.
    let moved = vm(obeys);
    assert_eq!((moved.state, moved.attempts), (VmState::Migrated, 1), "{moved:?}");
    let s = admin.server(obeys).await.unwrap();
    assert_eq!(s["status"], "ACTIVE");
    assert!(
        zone.holds(s["OS-EXT-SRV-ATTR:host"].as_str().unwrap_or_default())
            && s["OS-EXT-SRV-ATTR:host"] != host.as_str()
    );
    let nova_migs = admin.migrations_of(obeys).await.unwrap();
    let statuses: Vec<&str> = nova_migs.iter().filter_map(|m| m["status"].as_str()).collect();
    assert_eq!(statuses, ["completed"], "one migration, completed");
    let actions = admin.actions_of(obeys).await.unwrap();
    let forces = actions.iter().filter(|a| *a == "live_migration_force_complete").count();
    assert_eq!(forces, 1, "Nova recorded one force: {actions:?}");

    // Forced, ignored, aborted after the grace: it stays, recorded.
    let stayed = vm(ignores);
    assert_eq!(stayed.state, VmState::NonMigratable, "{stayed:?}");
    assert!(stayed.reason.contains("after it was forced to complete"), "{}", stayed.reason);
    let s = admin.server(ignores).await.unwrap();
    assert_eq!(
        (s["status"].as_str(), s["OS-EXT-SRV-ATTR:host"].as_str()),
        (Some("ACTIVE"), Some(host.as_str()))
    );
    let actions = admin.actions_of(ignores).await.unwrap();
    let forces = actions.iter().filter(|a| *a == "live_migration_force_complete").count();
    assert_eq!(forces, 1, "{actions:?}");
    let statuses: Vec<String> = admin
        .migrations_of(ignores)
        .await
        .unwrap()
        .iter()
        .filter_map(|m| m["status"].as_str().map(String::from))
        .collect();
    assert_eq!(statuses, ["cancelled"], "aborted in Nova");

    // Each attempt's record says when it was forced.
    let migs = region.migrations_of(&name).await;
    assert_eq!(migs.len(), 2);
    for m in &migs {
        let ms = m.status.clone().unwrap_or_default();
        assert!(ms.force_completed_at.is_some(), "{}: {ms:?}", m.spec.server_id);
        let want =
            if &m.spec.server_id == obeys { MigrationPhase::Completed } else { MigrationPhase::Aborted };
        assert_eq!(ms.phase, Some(want), "{}", m.spec.server_id);
    }
    assert_eq!(outcome(&coord, "forced").await, 2.0);
    assert_eq!(outcome(&coord, "aborted").await, 1.0);
    for id in &ids {
        admin.delete_server(id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_server_goes_cold_and_an_external_one_is_left_to_its_owner() {
    let region = Region::start("policies").await;
    let zone = hosts::zone(&region.env, 2).await;
    let admin = Admin::login(&region.env).await.unwrap();
    let (host, coord, ids) = region.active_host_with(&admin, &zone, &["1", "1"], &[]).await;
    let (owned, stopped) = (&ids[0], &ids[1]);
    admin.set_metadata(owned, POLICY_METADATA, "external").await.unwrap();
    admin.set_metadata(stopped, POLICY_METADATA, "live-if-possible").await.unwrap();
    // Nova moves only a running server live.
    admin.stop(stopped).await.unwrap();
    let options = EvictionOptions { re_enable: Some(true), ..EvictionOptions::default() };
    let name = format!("policies-{}", std::process::id());
    region.create_eviction(&name, &host, EvictionReason::AdminRequest, options).await;

    // The owner's tooling sees the mark naming the host, and moves it.
    until(
        "the evict-from mark",
        Duration::from_secs(90),
        || coord.tail(30),
        || async {
            let meta = admin.metadata_of(owned).await.unwrap();
            match meta.get(EVICT_FROM_METADATA).and_then(|v| v.as_str()) {
                Some(h) if h == host => Poll::Ready(()),
                other => Poll::Pending(format!("{other:?}")),
            }
        },
    )
    .await;
    let waiting = region.eviction(&name).await.and_then(|e| e.status).unwrap();
    assert_eq!(waiting.phase, Some(EvictionPhase::Migrating));
    let w = waiting.vms.iter().find(|v| &v.id == owned).unwrap();
    assert_eq!(w.state, VmState::External, "{w:?}");
    admin.live_migrate(owned).await.unwrap();

    let ev = region.wait_eviction(&name, EvictionPhase::Succeeded, Duration::from_secs(180), &coord).await;
    let st = ev.status.unwrap();
    let vm = |id: &str| st.vms.iter().find(|v| v.id == id).cloned().unwrap();
    let o = vm(owned);
    assert_eq!((o.state, o.attempts, o.reason.as_str()), (VmState::Migrated, 0, "moved off by its owner"));
    let meta = admin.metadata_of(owned).await.unwrap();
    assert!(!meta.contains_key(EVICT_FROM_METADATA), "the mark taken off: {meta:?}");
    assert_eq!(admin.migrations_of(owned).await.unwrap().len(), 1, "its owner's migration only");

    // Not running: moved cold from the first attempt, and confirmed.
    let c = vm(stopped);
    assert_eq!((c.state, c.attempts, c.cold_after_failures), (VmState::Migrated, 1, Some(0)), "{c:?}");
    let s = admin.server(stopped).await.unwrap();
    assert_eq!(s["status"], "SHUTOFF");
    assert_ne!(s["OS-EXT-SRV-ATTR:host"].as_str(), Some(host.as_str()));
    let nova_migs = admin.migrations_of(stopped).await.unwrap();
    let kinds: Vec<(&str, &str)> = nova_migs
        .iter()
        .map(|m| (m["migration_type"].as_str().unwrap_or_default(), m["status"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(kinds, [("migration", "confirmed")], "no live migration ever started in Nova");
    let mut migs = region.migrations_of(&name).await;
    migs.sort_by_key(|m| m.spec.attempt);
    let record: Vec<(String, MigrationKind, Option<MigrationPhase>)> = migs
        .iter()
        .map(|m| (m.spec.server_id.clone(), m.spec.policy, m.status.as_ref().and_then(|s| s.phase)))
        .collect();
    assert_eq!(
        record,
        [(stopped.clone(), MigrationKind::ColdMigrate, Some(MigrationPhase::Completed))],
        "no Migration for the owner's server"
    );
    for id in &ids {
        admin.delete_server(id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_preflight_keeps_an_anti_affinity_group_apart_as_nova_does() {
    let region = Region::start("groups").await;
    let zone = hosts::zone(&region.env, 2).await;
    let admin = Admin::login(&region.env).await.unwrap();
    let (host, coord, _) = region.active_host_with(&admin, &zone, &[], &[]).await;
    let (t1, t2) = (zone.targets[0].host.clone(), zone.targets[1].host.clone());
    // Two members of a group allowing two per host on the host, two on
    // t1 (full), one on t2 (room for one more).
    let group = admin.create_anti_affinity_group(&format!("{}-apart", region.id), 2).await.unwrap();
    let mut members = Vec::new();
    let mut others = Vec::new();
    for (i, on) in [&host, &host, &t1, &t1, &t2].into_iter().enumerate() {
        let id =
            admin.boot_in_group(&format!("{}-m{i}", region.id), (&zone.name, on), "1", &group).await.unwrap();
        if on == &host { members.push(id) } else { others.push(id) }
    }
    let last_on_t2 = others.pop().unwrap();

    // t2 has room in the group for one: one of the two fits, the other is named.
    let dry = EvictionOptions::default();
    let name = format!("groups-dry-{}", std::process::id());
    let evs: kube::Api<hv_coordinator::api::Eviction> = kube::Api::all(region.kube.client.clone());
    let mut ev = hv_coordinator::api::Eviction::new(
        &name,
        hv_coordinator::api::eviction::EvictionSpec {
            hypervisor: host.clone(),
            reason: EvictionReason::AdminRequest,
            options: dry,
            dry_run: true,
        },
    );
    ev.metadata.name = Some(name.clone());
    evs.create(&Default::default(), &ev).await.unwrap();
    let planned = region.wait_eviction(&name, EvictionPhase::Planned, Duration::from_secs(90), &coord).await;
    let plan = planned.status.unwrap().preflight;
    let on: Vec<Option<String>> = plan.iter().map(|p| p.fits_on.clone()).collect();
    assert_eq!(on.iter().filter(|h| h.as_deref() == Some(t2.as_str())).count(), 1, "{plan:?}");
    assert!(!on.iter().any(|h| h.as_deref() == Some(t1.as_str())), "t1 runs two members: {plan:?}");
    let named: Vec<&str> = plan.iter().filter_map(|p| p.finding.as_deref()).collect();
    assert_eq!(named.len(), 1, "{plan:?}");
    assert!(named[0].starts_with("constraints: anti-affinity group"), "{}", named[0]);

    // The member on t2 gone: both fit there, and Nova's scheduler, which
    // keeps the group's rule as well, moves them there.
    admin.delete_server(&last_on_t2).await.unwrap();
    until("the member on t2 gone", Duration::from_secs(60), String::new, || async {
        match admin.server(&last_on_t2).await {
            Ok(s) if s["status"] != "DELETED" => Poll::Pending(format!("{}", s["status"])),
            _ => Poll::Ready(()),
        }
    })
    .await;
    let name = format!("groups-{}", std::process::id());
    let options = EvictionOptions { re_enable: Some(true), ..EvictionOptions::default() };
    region.create_eviction(&name, &host, EvictionReason::AdminRequest, options).await;
    let ev = region.wait_eviction(&name, EvictionPhase::Succeeded, Duration::from_secs(180), &coord).await;
    let plan = ev.status.unwrap().preflight;
    let planned_on: Vec<String> = plan.iter().filter_map(|p| p.fits_on.clone()).collect();
    assert_eq!(planned_on, [t2.clone(), t2.clone()], "both counted on t2, t1 being full: {plan:?}");
    for id in &members {
        let s = admin.server(id).await.unwrap();
        assert_eq!(s["OS-EXT-SRV-ATTR:host"].as_str(), Some(t2.as_str()), "Nova kept the rule too");
    }
    for id in members.iter().chain(&others) {
        admin.delete_server(id).await.unwrap();
    }
}
