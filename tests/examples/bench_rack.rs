//! `make bench` (cargo run --example bench_rack): a rack's power lost at
//! once, on the real ground. Sixteen Active hosts in one zone, each with a
//! BMC, labelled into three racks (`example.com/rack`: six, five, five);
//! the coordinator names the label its failure domain. Two losses that must
//! fence nothing come first, each undone after:
//!
//! - a storm: nine hosts across the three racks lose their power at once;
//! - a partition: the coordinator cut from nine hosts that still run (their
//!   agents and kubelets silent to it, their BMCs reading on).
//!
//! Then the six hosts of one rack lose their power at once, two servers on
//! each (their root disks rebuilt from the image:
//! `--evacuate-rebuild-from-image`). For each host, from its BMC reading
//! Off: fenced, and its servers ACTIVE on another host (p50 and max), and
//! from the first loss to the last host fenced and the last server back;
//! every server evacuated once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hv_coordinator::api::Hypervisor;
use hv_coordinator::api::hypervisor::HealthState;
use hv_tests::fencing::{give_fencing_means, wait_power};
use hv_tests::openstack::{Admin, FakeHost, fake_host};
use hv_tests::region::{AgentPeers, Proc, Region, healthy_active, wait_health};
use kube::Api;
use kube::api::{Patch, PatchParams};

const RACK_LABEL: &str = "example.com/rack";
/// Hosts per rack: the first rack is the one that loses its power.
const RACKS: [(&str, usize); 3] = [("rack-a", 6), ("rack-b", 5), ("rack-c", 5)];
const SERVERS: usize = 2;
/// How long a loss that must fence nothing is watched.
const WATCHED: Duration = Duration::from_secs(45);

struct Host {
    name: String,
    rack: &'static str,
    root: std::path::PathBuf,
    agent: Proc,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The hosts whose fencing started, and those Nova shows forced down.
async fn fenced_any(region: &Region, admin: &Admin, hosts: &[Host]) -> (usize, usize) {
    let (mut started, mut forced) = (0, 0);
    for h in hosts {
        let status = region.hypervisor(&h.name).await.and_then(|hv| hv.status);
        started += usize::from(status.and_then(|s| s.fencing).is_some());
        let svc = admin.service(&h.name).await.unwrap();
        forced += usize::from(svc.is_some_and(|s| s["forced_down"] == true));
    }
    (started, forced)
}

/// Watches `hosts` for `WATCHED` after a loss that must fence nothing;
/// answers the most that were ever seen with a fencing started, or forced
/// down, and the gates that said why.
async fn watch_nothing_fenced(
    region: &Region,
    admin: &Admin,
    hosts: &[Host],
    lost: &[usize],
) -> (usize, Vec<String>) {
    let until = Instant::now() + WATCHED;
    let mut most = 0;
    while Instant::now() < until {
        let (started, forced) = fenced_any(region, admin, hosts).await;
        most = most.max(started).max(forced);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut gates = Vec::new();
    for i in lost {
        let hv = region.hypervisor(&hosts[*i].name).await.unwrap();
        let (_, reason, _) = Region::condition(&hv, "Fenced");
        gates.push(if reason.is_empty() { "-".to_string() } else { reason });
    }
    gates.sort();
    gates.dedup();
    (most, gates)
}

/// The hosts `lost` come back: powered on and nova-compute started where
/// `power`, kubelet and agent running, Healthy and enabled again.
async fn restore(region: &Region, coord: &Proc, hosts: &mut [Host], lost: &[usize], power: bool) {
    // Their kubelets first: a host whose kubelet lives is never Failed, so
    // none is fenced while the others come back and the quorum with them.
    for i in lost {
        if power {
            hv_tests::bmc::power_on(&region.env, &hosts[*i].name).await.unwrap();
        }
        region.kubelet_returns(&hosts[*i].name).await;
    }
    for i in lost {
        let h = &mut hosts[*i];
        if power {
            fake_host(&region.env.nova, &h.name, FakeHost::Start).await.unwrap();
        }
        let peers = AgentPeers { host_root: Some(h.root.clone()), ..Default::default() };
        h.agent = region.agent(&h.name, &peers);
    }
    let admin = Admin::login(&region.env).await.unwrap();
    for i in lost {
        let name = &hosts[*i].name;
        if power {
            wait_power(&region.env, name, "On").await;
        }
        wait_health(region, name, HealthState::Healthy, coord).await;
        // Back for Nova's scheduler too: the rack's servers go to these.
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let enabled = admin.enabled_hosts().await.unwrap().contains(name)
                && !admin.traits_of(name).await.unwrap().iter().any(|t| t == "COMPUTE_STATUS_DISABLED");
            if enabled {
                break;
            }
            assert!(Instant::now() < deadline, "{name} not enabled again: {}", coord.tail(30));
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Cuts the hosts `lost` from the coordinator at once: their kubelets and
/// agents go silent; where `power`, as a power loss does, their
/// nova-compute stops too and their power is switched off (the emulator
/// lands it up to 11 s later). Answers when it began.
async fn lose(region: &Region, hosts: &mut [Host], lost: &[usize], power: bool) -> Instant {
    let env = &region.env;
    let t0 = Instant::now();
    for i in lost {
        region.kwok_manages(&hosts[*i].name, false).await;
        hosts[*i].agent.kill();
    }
    for i in lost.iter().filter(|_| power) {
        fake_host(&env.nova, &hosts[*i].name, FakeHost::Stop).await.unwrap();
        hv_tests::bmc::power_off(env, &hosts[*i].name).await.unwrap();
    }
    t0
}

#[tokio::main]
async fn main() {
    let region = Region::start("bench-rack").await;
    let env = region.env.clone();
    let total: usize = RACKS.iter().map(|(_, n)| n).sum();
    let zone = hv_tests::hosts::zone(&env, total - 1).await;
    let names: Vec<String> = std::iter::once(zone.source.host.clone())
        .chain(zone.targets.iter().map(|t| t.host.clone()))
        .collect();
    // The fencing tests' graces, but a host unseen is disabled in Nova
    // only after 60 s (the default is 5 min): a disable sent while Nova
    // still counts the dead host up waits up to a minute on its
    // nova-compute, and the host's fencing behind it.
    let coord = region.coordinator(
        None,
        &[
            "--node-not-ready-grace",
            "1s",
            "--unreachable-grace",
            "60s",
            "--ha-maintenance-limit",
            "0",
            "--fence-fresh-heartbeat",
            "3s",
            "--fence-domain-label",
            RACK_LABEL,
            "--evacuate-rebuild-from-image",
        ],
    );
    let racks = RACKS.iter().flat_map(|(rack, n)| std::iter::repeat_n(*rack, *n));
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(region.kube.client.clone());
    let mut hosts = Vec::new();
    for (name, rack) in names.iter().zip(racks) {
        let (root, agent) = healthy_active(&region, name, &coord).await;
        let label = serde_json::json!({"metadata": {"labels": {RACK_LABEL: rack}}});
        nodes.patch(name, &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
        give_fencing_means(&region, name, None).await;
        wait_power(&env, name, "On").await;
        hosts.push(Host { name: name.clone(), rack, root, agent });
    }
    let admin = Admin::login(&env).await.unwrap();

    // Nine of sixteen across the racks: three of each.
    let spread: Vec<usize> = [0, 1, 2, 6, 7, 8, 11, 12, 13].to_vec();
    let _ = lose(&region, &mut hosts, &spread, true).await;
    let storm = watch_nothing_fenced(&region, &admin, &hosts, &spread).await;
    restore(&region, &coord, &mut hosts, &spread, true).await;
    let _ = lose(&region, &mut hosts, &spread, false).await;
    let partition = watch_nothing_fenced(&region, &admin, &hosts, &spread).await;
    restore(&region, &coord, &mut hosts, &spread, false).await;

    // The rack.
    let rack: Vec<usize> = (0..hosts.len()).filter(|i| hosts[*i].rack == RACKS[0].0).collect();
    let mut servers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in &rack {
        let name = &hosts[*i].name;
        for s in 0..SERVERS {
            let id = zone.boot(&admin, &format!("rack-{name}-{s}-{}", std::process::id()), name, "1").await;
            servers.entry(name.clone()).or_default().push(id);
        }
    }
    let lost = lose(&region, &mut hosts, &rack, true).await;
    let (fenced, back) = follow(&region, &admin, &servers).await;
    let twice = evacuated_twice(&admin, &servers).await;
    let held = (storm.0, partition.0);
    report(lost, &fenced, &back, twice, storm, partition);
    assert_eq!(held, (0, 0), "a storm or a partition fenced hosts");
    assert_eq!((fenced.len(), twice), (rack.len(), 0), "every host of the rack fenced, no server twice");
    for id in servers.values().flatten() {
        let _ = admin.delete_server(id).await;
    }
    // The rack's hosts stay fenced: never handed out again on this ground.
    zone.source.retire();
    for t in zone.targets.iter().filter(|t| rack.iter().any(|i| hosts[*i].name == t.host)) {
        t.retire();
    }
    drop(coord);
}

/// When each host counted fenced, and when its servers were all ACTIVE on
/// another host.
async fn follow(
    region: &Region,
    admin: &Admin,
    servers: &BTreeMap<String, Vec<String>>,
) -> (BTreeMap<String, Instant>, BTreeMap<String, Instant>) {
    let hvs: Api<Hypervisor> = Api::all(region.kube.client.clone());
    let (mut fenced, mut back) = (BTreeMap::new(), BTreeMap::new());
    let deadline = Instant::now() + Duration::from_secs(600);
    while back.len() < servers.len() {
        assert!(Instant::now() < deadline, "not every server back within 600 s: {back:?}");
        for (host, ids) in servers {
            if !fenced.contains_key(host) {
                let f = hvs.get(host).await.unwrap().status.and_then(|s| s.fencing);
                if f.is_some_and(|f| f.fenced.is_some()) {
                    fenced.insert(host.clone(), Instant::now());
                }
            }
            if !back.contains_key(host) {
                let mut all = true;
                for id in ids {
                    let s = admin.server(id).await.unwrap();
                    all &= s["status"] == "ACTIVE"
                        && s["OS-EXT-SRV-ATTR:host"].as_str().is_some_and(|h| h != host);
                }
                if all {
                    back.insert(host.clone(), Instant::now());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (fenced, back)
}

/// Servers with more than one evacuation in Nova.
async fn evacuated_twice(admin: &Admin, servers: &BTreeMap<String, Vec<String>>) -> usize {
    let mut twice = 0;
    for id in servers.values().flatten() {
        let migrations = admin.migrations_of(id).await.unwrap();
        twice += usize::from(migrations.iter().filter(|m| m["migration_type"] == "evacuation").count() > 1);
    }
    twice
}

fn report(
    t0: Instant,
    fenced: &BTreeMap<String, Instant>,
    back: &BTreeMap<String, Instant>,
    twice: usize,
    storm: (usize, Vec<String>),
    partition: (usize, Vec<String>),
) {
    let since = |at: &BTreeMap<String, Instant>| {
        let mut d: Vec<Duration> = at.values().map(|t| t.duration_since(t0)).collect();
        d.sort();
        d
    };
    let cell = |d: &[Duration]| match d.last() {
        Some(max) => format!("{:.1} / {:.1} s", percentile(d, 0.5).as_secs_f64(), max.as_secs_f64()),
        None => "-".into(),
    };
    let hosts = RACKS[0].1;
    println!(
        "rack-scale recovery: the {hosts} hosts of one rack (of 16, three racks) lose their power at once (real coordinator, agents, Nova, Redfish emulator; real API server)"
    );
    println!(
        "settings: --fence-domain-label {RACK_LABEL}, --fence-max-domains 2, fleet and zone shares 50 %, --fence-fresh-heartbeat 3 s, --unreachable-grace 60 s, \
         kubelet Lease 8 s, {SERVERS} servers per host rebuilt from the image, maxParallel 2, --cluster-max-evacuations 20"
    );
    println!("{:<36} {:>18} {:>24}", "per host, from the loss", "fenced", "its servers ACTIVE");
    println!("{:<36} {:>18} {:>24}", "p50 / max", cell(&since(fenced)), cell(&since(back)));
    println!("hosts fenced: {} of {hosts}; servers evacuated more than once: {twice}", fenced.len());
    println!(
        "storm (9 of 16 across the racks lose power at once): {} fenced or forced down at most, watched {} s; gates: {}",
        storm.0,
        WATCHED.as_secs(),
        storm.1.join(", ")
    );
    println!(
        "partition (the coordinator cut from 9 of 16 running hosts at once): {} fenced or forced down at most, watched {} s; gates: {}",
        partition.0,
        WATCHED.as_secs(),
        partition.1.join(", ")
    );
    println!(
        "(the loss: the hosts' kubelets, agents and nova-compute stopped and their power switched off at once; the emulator lands the power off up to 11 s later)"
    );
}
