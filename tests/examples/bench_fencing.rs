//! `make bench` (cargo run --example bench_fencing): a dead host on the
//! real ground, from the moment it dies to its servers running again
//! elsewhere, over repeated failures: its verdict Failed, its fencing done,
//! the first evacuation asked of Nova, every server ACTIVE on another host
//! (p50 and max per milestone). Each failure is followed by the way back
//! (`hvctl clear-fenced`), so one host dies again and again.
//!
//! Two kinds of death. With a BMC: the host's power is cut (the clock starts
//! when its BMC reports Off; then its agent and nova-compute stop, its Node
//! stays Ready as Kubernetes would show it for its grace). Without one (its
//! storage fenced only): its agent and nova-compute stop, and Nova's service
//! group must see it down. Milestones are read every 100 ms from the
//! ground's API server and Nova.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use hv_coordinator::api::hypervisor::HealthState;
use hv_coordinator::api::{Eviction, Hypervisor, Phase};
use hv_tests::fencing::{address, fencing_coordinator, give_fencing_means, wait_power};
use hv_tests::openstack::{Admin, FakeHost, fake_host};
use hv_tests::region::{AgentPeers, Blocklisted, Proc, Region, healthy_active};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};

const SERVERS: usize = 2;

/// When each milestone was first seen, from the death.
#[derive(Default)]
struct Timeline {
    failed: Option<Duration>,
    fenced: Option<Duration>,
    requested: Option<Duration>,
    active: Option<Duration>,
}

struct Host {
    name: String,
    root: std::path::PathBuf,
    agent: Proc,
    bmc: bool,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Kills `host` its way; answers the moment it died.
async fn kill(region: &Region, host: &mut Host) -> Instant {
    let env = &region.env;
    let t0 = if host.bmc {
        hv_tests::bmc::power_off(env, &host.name).await.unwrap();
        loop {
            if hv_tests::bmc::power_state(env, &host.name).await.is_ok_and(|s| s == "Off") {
                break Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    } else {
        Instant::now()
    };
    region.kwok_manages(&host.name, false).await;
    host.agent.kill();
    fake_host(&env.nova, &host.name, FakeHost::Stop).await.unwrap();
    t0
}

/// Follows one death to every server running elsewhere.
async fn follow(
    region: &Region,
    admin: &Admin,
    host: &str,
    ids: &[String],
    t0: Instant,
    old: &BTreeSet<String>,
) -> Timeline {
    let evs: Api<Eviction> = Api::all(region.kube.client.clone());
    let mut t = Timeline::default();
    let deadline = t0 + Duration::from_secs(240);
    while t.active.is_none() {
        assert!(Instant::now() < deadline, "{host}: not every server back within 240 s");
        let status = region.hypervisor(host).await.and_then(|h| h.status);
        let health = status.as_ref().and_then(|s| s.health.as_ref()).map(|h| h.state);
        if t.failed.is_none() && health == Some(HealthState::Failed) {
            t.failed = Some(t0.elapsed());
        }
        if t.fenced.is_none()
            && status.as_ref().and_then(|s| s.fencing.as_ref()).is_some_and(|f| f.fenced.is_some())
        {
            t.fenced = Some(t0.elapsed());
        }
        if t.requested.is_none() {
            let list = evs.list(&ListParams::default()).await.unwrap().items;
            let asked = list
                .iter()
                .filter(|e| e.spec.hypervisor == host && !old.contains(&kube::ResourceExt::name_any(*e)))
                .any(|e| e.status.as_ref().is_some_and(|s| s.vms.iter().any(|v| v.attempts > 0)));
            if asked {
                t.requested = Some(t0.elapsed());
            }
        } else {
            let mut back = 0;
            for id in ids {
                let s = admin.server(id).await.unwrap();
                if s["status"] == "ACTIVE" && s["OS-EXT-SRV-ATTR:host"].as_str().is_some_and(|h| h != host) {
                    back += 1;
                }
            }
            if back == ids.len() {
                t.active = Some(t0.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    t
}

/// The way back: the fence cleared, the host revived, Active again.
async fn revive(region: &Region, coord: &Proc, host: &mut Host) {
    let out = region.hvctl().args(["clear-fenced", &host.name]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    if host.bmc {
        hv_tests::bmc::power_on(&region.env, &host.name).await.unwrap();
        wait_power(&region.env, &host.name, "On").await;
    }
    fake_host(&region.env.nova, &host.name, FakeHost::Start).await.unwrap();
    region.kubelet_returns(&host.name).await;
    let peers = AgentPeers { host_root: Some(host.root.clone()), ..Default::default() };
    host.agent = region.agent(&host.name, &peers);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let hv = region.hypervisor(&host.name).await.unwrap();
        let status = hv.status.unwrap_or_default();
        // Back for Nova's scheduler too: enabled, up, its provider no longer
        // marked disabled (the next round boots servers onto it).
        let admin = Admin::login(&region.env).await.unwrap();
        let schedulable = admin.enabled_hosts().await.unwrap().contains(&host.name)
            && !admin.traits_of(&host.name).await.unwrap().iter().any(|t| t == "COMPUTE_STATUS_DISABLED");
        if status.phase == Some(Phase::Active) && status.fencing.is_none() && schedulable {
            break;
        }
        assert!(Instant::now() < deadline, "{} not back: {}", host.name, coord.tail(30));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::main]
async fn main() {
    let region = Region::start("bench-fencing").await;
    let env = region.env.clone();
    // Four hosts in one zone: the one with a BMC, two targets, the one without.
    let zone = hv_tests::hosts::zone(&env, 3).await;
    let settings = [
        "--ceph-fence-id",
        &env.ceph.fence.id,
        "--ceph-fence-conf",
        &env.ceph.conf.display().to_string(),
        "--ceph-fence-keyring",
        &env.ceph.fence.keyring.display().to_string(),
    ]
    .map(String::from);
    let coord = fencing_coordinator(&region, &settings.iter().map(String::as_str).collect::<Vec<_>>());
    let names: Vec<String> = std::iter::once(zone.source.host.clone())
        .chain(zone.targets.iter().map(|t| t.host.clone()))
        .collect();
    let mut hosts = Vec::new();
    for name in &names {
        let (root, agent) = healthy_active(&region, name, &coord).await;
        hosts.push(Host { name: name.clone(), root, agent, bmc: false });
    }
    let hvs: Api<Hypervisor> = Api::all(region.kube.client.clone());
    give_fencing_means(&region, &names[0], Some(address::CONTROLLER)).await;
    hosts[0].bmc = true;
    wait_power(&env, &names[0], "On").await;
    let other = serde_json::json!({"spec": {"fencing": {"cephAddresses": [address::BENCH_NO_BMC]}}});
    hvs.patch(&names[3], &PatchParams::default(), &Patch::Merge(&other)).await.unwrap();
    let rbd = serde_json::json!({"spec": {"ceph": {"instanceDisksOnRbd": true}}});
    for name in [&names[0], &names[3]] {
        hvs.patch(name, &PatchParams::default(), &Patch::Merge(&rbd)).await.unwrap();
    }
    let _lift = [address::CONTROLLER, address::BENCH_NO_BMC]
        .map(|a| Blocklisted::lift_later(&env, &format!("{a}:0/0")));
    let admin = Admin::login(&env).await.unwrap();
    let evs: Api<Eviction> = Api::all(region.kube.client.clone());

    let mut rows: Vec<(&str, Vec<Timeline>)> = Vec::new();
    for (label, index, rounds) in [
        ("power lost, BMC reports Off", 0usize, 10usize),
        ("no BMC: agent, kubelet, nova-compute stop", 3, 3),
    ] {
        let mut timelines = Vec::new();
        for round in 0..rounds {
            let host = &mut hosts[index];
            let mut ids = Vec::new();
            for s in 0..SERVERS {
                ids.push(
                    zone.boot(
                        &admin,
                        &format!("bench-{index}-{round}-{s}-{}", std::process::id()),
                        &host.name,
                        "1",
                    )
                    .await,
                );
            }
            let old: BTreeSet<String> = evs
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .map(kube::ResourceExt::name_any)
                .collect();
            let t0 = kill(&region, host).await;
            let t = follow(&region, &admin, &host.name, &ids, t0, &old).await;
            let secs = |d: Option<Duration>| d.map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64()));
            eprintln!(
                "{label} #{}: Failed {} s, fenced {} s, evacuation asked {} s, servers ACTIVE {} s",
                round + 1,
                secs(t.failed),
                secs(t.fenced),
                secs(t.requested),
                secs(t.active)
            );
            timelines.push(t);
            revive(&region, &coord, host).await;
            for id in &ids {
                admin.delete_server(id).await.unwrap();
            }
        }
        rows.push((label, timelines));
    }

    report(rows);
    drop(coord);
}

/// The table: per kind of death, p50 and max of each moment.
fn report(rows: Vec<(&str, Vec<Timeline>)>) {
    println!(
        "fencing and evacuation: from a host's death to its servers running elsewhere (real coordinator, agents, Nova, Ceph, Redfish emulator; real API server)"
    );
    println!(
        "settings: agent heartbeat 1 s, --fence-fresh-heartbeat 3 s, --unreachable-grace 3 s, BMC read every 2 s while the stream is gone, \
         Nova service_down_time 60 s (report_interval 10 s), {SERVERS} servers per host (disks in Ceph), maxParallel 2"
    );
    println!(
        "{:<38} {:>3} {:>18} {:>18} {:>18} {:>18}",
        "death", "n", "Failed", "fenced", "evacuation asked", "servers ACTIVE"
    );
    for (label, timelines) in rows {
        let cell = |pick: fn(&Timeline) -> Option<Duration>| {
            let mut s: Vec<Duration> = timelines.iter().filter_map(pick).collect();
            s.sort();
            if s.is_empty() {
                return "-".to_string();
            }
            format!("{:.1} / {:.1} s", percentile(&s, 0.5).as_secs_f64(), s[s.len() - 1].as_secs_f64())
        };
        println!(
            "{label:<38} {:>3} {:>18} {:>18} {:>18} {:>18}",
            timelines.len(),
            cell(|t| t.failed),
            cell(|t| t.fenced),
            cell(|t| t.requested),
            cell(|t| t.active)
        );
    }
    println!(
        "(each cell: p50 / max, from the death: the BMC reporting Off, or the agent, kubelet and nova-compute stopped)"
    );
}
