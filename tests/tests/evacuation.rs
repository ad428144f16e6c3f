//! A dead host's servers brought back elsewhere, on the real peers: the
//! real coordinator fences a host whose agent, kubelet and nova-compute
//! died (Nova forced down, its Ceph address blocklisted, its BMC system
//! powered off), puts it into `ha` maintenance, and its NodeFailure
//! Eviction evacuates each opted-in server exactly once through the real
//! Nova, restoring its power state; an opted-out one is left and named.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hv_coordinator::api::eviction::VmState;
use hv_coordinator::api::hypervisor::FenceStep;
use hv_coordinator::api::{Eviction, EvictionPhase, EvictionReason, Hypervisor, Migration, MigrationKind};
use hv_coordinator::eviction::plan::EVACUATE_METADATA;
use hv_tests::fencing::{
    FENCED_CEPH_ADDRESS, fencing_coordinator, give_fencing_means, kubelet_silent, wait_fencing, wait_power,
};
use hv_tests::openstack::{Admin, FakeHost, fake_host};
use hv_tests::region::{Blocklisted, Region, healthy_active, wait_health};
use hv_tests::wait::{Poll, until};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};

/// Nova's evacuations of one server (its `migration_type` evacuation records).
async fn evacuations(admin: &Admin, id: &str) -> usize {
    let migrations = admin.migrations_of(id).await.unwrap();
    migrations.iter().filter(|m| m["migration_type"] == "evacuation").count()
}

/// The host and status Nova shows for a server.
async fn placed(admin: &Admin, id: &str) -> (String, String) {
    let s = admin.server(id).await.unwrap();
    let host = s["OS-EXT-SRV-ATTR:host"].as_str().unwrap_or_default().to_string();
    (host, s["status"].as_str().unwrap_or_default().to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_hosts_opted_in_servers_are_evacuated_once_each_in_their_former_power_state() {
    let region = Region::start("evacuation").await;
    let env = region.env.clone();
    let zone = hv_tests::hosts::zone(&env, 2).await;
    let dead = zone.source.host.clone();
    let keyring = env.ceph.fence.keyring.display().to_string();
    let conf = env.ceph.conf.display().to_string();
    let coord = fencing_coordinator(
        &region,
        &[
            "--ceph-fence-id",
            &env.ceph.fence.id,
            "--ceph-fence-conf",
            &conf,
            "--ceph-fence-keyring",
            &keyring,
        ],
    );
    // The zone's three hosts in service: the dead one's two peers are the
    // agent quorum, and the targets Nova picks from.
    let mut agents = Vec::new();
    for host in std::iter::once(&dead).chain(zone.targets.iter().map(|t| &t.host)) {
        agents.push(healthy_active(&region, host, &coord).await.1);
    }
    give_fencing_means(&region, &dead).await;
    let hvs: Api<Hypervisor> = Api::all(region.kube.client.clone());
    let rbd = serde_json::json!({"spec": {"ceph": {"instanceDisksOnRbd": true}}});
    hvs.patch(&dead, &PatchParams::default(), &Patch::Merge(&rbd)).await.unwrap();
    wait_power(&env, &dead, "On").await;
    let _lift = Blocklisted::lift_later(&env, &format!("{FENCED_CEPH_ADDRESS}:0/0"));

    // Four servers: two running, one stopped, one opted out.
    let admin = Admin::login(&env).await.unwrap();
    let tag = std::process::id();
    let mut servers = Vec::new();
    for name in ["run-1", "run-2", "stopped", "out"] {
        servers.push(zone.boot(&admin, &format!("evac-{name}-{tag}"), &dead, "1").await);
    }
    let [run1, run2, stopped, out] = [0, 1, 2, 3].map(|i| servers[i].clone());
    admin.stop(&stopped).await.unwrap();
    admin.set_metadata(&out, EVACUATE_METADATA, "false").await.unwrap();

    // The host dies: its agent, its kubelet and its nova-compute.
    agents[0].kill();
    kubelet_silent(&region, &dead).await;
    fake_host(&env.nova, &dead, FakeHost::Stop).await.unwrap();
    wait_health(&region, &dead, hv_coordinator::api::hypervisor::HealthState::Failed, &coord).await;
    let fencing = wait_fencing(&region, &dead, "the host fenced", |f| f.fenced.is_some(), &coord).await;
    let all = [FenceStep::NovaForcedDown, FenceStep::CephBlocklisted, FenceStep::PoweredOff];
    assert_eq!(fencing.confirmed, all, "{fencing:?}");
    assert_eq!(admin.service(&dead).await.unwrap().unwrap()["forced_down"], true);
    assert!(hv_tests::region::blocklist(&env).unwrap().contains_key(&format!("{FENCED_CEPH_ADDRESS}:0/0")));
    assert_eq!(hv_tests::bmc::power_state(&env, &dead).await.unwrap(), "Off");

    // Its NodeFailure Eviction runs to the end.
    let evs: Api<Eviction> = Api::all(region.kube.client.clone());
    let ev = until(
        "the evacuation over",
        Duration::from_secs(120),
        || coord.tail(30),
        || async {
            let list = evs.list(&ListParams::default()).await.unwrap();
            let mine = list.items.into_iter().find(|e| e.spec.hypervisor == dead);
            match mine {
                Some(e) if e.status.as_ref().and_then(|s| s.phase) == Some(EvictionPhase::Succeeded) => {
                    Poll::Ready(e)
                }
                other => Poll::Pending(format!("{:?}", other.and_then(|e| e.status))),
            }
        },
    )
    .await;
    assert_eq!(ev.spec.reason, EvictionReason::NodeFailure);
    let status = ev.status.clone().unwrap();
    assert!(status.evacuating, "{status:?}");
    let hv = region.hypervisor(&dead).await.unwrap();
    assert!(hv.spec.maintenance_reason.starts_with("hv-fence: "), "{}", hv.spec.maintenance_reason);

    // In Nova: each opted-in server on another host of the zone, once, in
    // the power state it had; the opted-out one where it was.
    for (id, want) in [(&run1, "ACTIVE"), (&run2, "ACTIVE"), (&stopped, "SHUTOFF")] {
        let (host, state) = placed(&admin, id).await;
        assert!(host != dead && zone.holds(&host), "{id} on {host}");
        assert_eq!(state, want, "{id}");
        assert_eq!(evacuations(&admin, id).await, 1, "{id} evacuated once");
    }
    assert_eq!(placed(&admin, &out).await.0, dead);
    assert_eq!(evacuations(&admin, &out).await, 0);

    // In the Eviction: the three moved, the fourth left and named; one
    // Migration per attempt, each an evacuation, recorded before Nova was asked.
    let record = |id: &str| status.vms.iter().find(|v| v.id == id).cloned().unwrap();
    for id in [&run1, &run2, &stopped] {
        let vm = record(id);
        assert_eq!((vm.state, vm.attempts), (VmState::Migrated, 1), "{vm:?}");
    }
    assert_eq!(record(&run1).former_status.as_deref(), Some("ACTIVE"));
    assert_eq!(record(&stopped).former_status.as_deref(), Some("SHUTOFF"));
    let left = record(&out);
    assert_eq!(left.state, VmState::Skipped);
    assert!(left.reason.contains("opted out"), "{}", left.reason);
    let migs: Api<Migration> = Api::all(region.kube.client.clone());
    let mine: Vec<Migration> = migs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|m| m.spec.source_host == dead)
        .collect();
    assert_eq!(mine.len(), 3, "{:?}", mine.iter().map(|m| &m.spec.server_id).collect::<Vec<_>>());
    assert!(mine.iter().all(|m| m.spec.policy == MigrationKind::Evacuate && m.spec.attempt == 1));
    let message = until(
        "the host's eviction reported",
        Duration::from_secs(30),
        || coord.tail(30),
        || async {
            let hv = region.hypervisor(&dead).await.unwrap();
            match Region::condition(&hv, "Evicted") {
                (state, reason, message) if state == "False" && reason == "InstancesRemain" => {
                    Poll::Ready(message)
                }
                other => Poll::Pending(format!("{other:?}")),
            }
        },
    )
    .await;
    assert!(message.contains(&out), "the one left is named: {message}");

    // The figures of this run: detection, fenced, evacuation asked, running.
    let failed = hv.status.as_ref().and_then(|s| s.health.as_ref()).and_then(|h| h.since.clone());
    let asked = status.vms.iter().filter_map(|v| v.attempt_started.clone()).map(|t| t.0).min();
    if let (Some(failed), Some(fenced), Some(asked), Some(done)) =
        (failed, fencing.fenced, asked, status.completed_at.clone())
    {
        let s = |a: jiff::Timestamp, b: jiff::Timestamp| b.duration_since(a).as_secs_f64();
        eprintln!(
            "evacuation on the ground: Failed -> fenced {:.1} s, fenced -> evacuation asked {:.1} s, \
             asked -> all back {:.1} s",
            s(failed.0, fenced.0),
            s(fenced.0, asked),
            s(asked, done.0)
        );
    }
    drop(coord);
}
