//! `make bench` (cargo run --example bench_eviction, dev profile: the
//! figures are Nova's time, not ours): an eviction of N servers on the real Nova region (ground
//! up), through the real coordinator. Prints the makespan against its lower
//! bound, max(longest migration, total migration time / parallelism), and
//! the Nova API calls per migrated VM (from Nova's own access log).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hv_coordinator::api::Eviction;
use hv_coordinator::api::eviction::{EvictionOptions, EvictionPhase, EvictionReason, EvictionSpec};
use hv_tests::openstack::Admin;
use hv_tests::region::Region;
use kube::Api;
use kube::api::PostParams;

const SERVERS: usize = 12;
const PARALLEL: u32 = 3;

#[tokio::main]
async fn main() {
    let region = Region::start("bench-evict").await;
    let admin = Admin::login(&region.env).await.unwrap();
    let flavors: Vec<&str> = (0..SERVERS).map(|i| ["1", "2", "3"][i % 3]).collect();
    let zone = hv_tests::hosts::zone(&region.env, 2).await;
    let (host, coord, ids) = region.active_host_with(&admin, &zone, &flavors, &[]).await;
    let log = region.env.dir.join("logs/nova-api-access.log");
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let lines = || read().lines().count();
    let before = lines();

    let evs: Api<Eviction> = Api::all(region.kube.client.clone());
    let name = format!("bench-{}", std::process::id());
    let options = EvictionOptions { max_parallel: PARALLEL, ..EvictionOptions::default() };
    let spec = EvictionSpec { hypervisor: host.clone(), reason: EvictionReason::AdminRequest, options };
    evs.create(&PostParams::default(), &Eviction::new(&name, spec)).await.unwrap();
    let ev = loop {
        let ev = evs.get(&name).await.unwrap();
        if ev.status.as_ref().and_then(|s| s.phase) == Some(EvictionPhase::Succeeded) {
            break ev;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Requests only (the log also holds the odd traceback line).
    let requests = |text: &str| -> Vec<String> {
        text.lines().filter(|l| l.contains("\" ") && l.contains(" HTTP/")).map(str::to_string).collect()
    };
    let all = read();
    let new: Vec<String> = requests(&all.lines().skip(before).collect::<Vec<_>>().join("\n"));
    let calls = new.len();
    let st = ev.status.unwrap();
    let distinct: std::collections::BTreeSet<&str> = st.vms.iter().map(|v| v.id.as_str()).collect();
    if distinct.len() != st.vms.len() {
        eprintln!(
            "DUPLICATE RECORDS: {} records, {} distinct; log {}",
            st.vms.len(),
            distinct.len(),
            coord.log.display()
        );
    }
    let durations: Vec<f64> = region
        .migrations_of(&name)
        .await
        .into_iter()
        .filter_map(|m| m.status)
        .filter_map(|s| Some(s.finished_at?.0.duration_since(s.started_at?.0).as_secs_f64()))
        .collect();
    let start = st.started_at.unwrap().0;
    let end = st.completed_at.unwrap().0;
    let makespan = end.duration_since(start).as_secs_f64();
    let longest = durations.iter().cloned().fold(0.0, f64::max);
    let total: f64 = durations.iter().sum();
    let bound = longest.max(total / f64::from(PARALLEL));
    println!(
        "eviction of {SERVERS} servers (three sizes), maxParallel {PARALLEL}, real Nova, fake live-migration driver"
    );
    println!("  migrated:                  {}/{}", st.migrated, st.total);
    println!("  makespan:                  {makespan:.1} s (eviction start to Succeeded)");
    println!(
        "  lower bound:               {bound:.1} s (longest {longest:.1} s, total {total:.1} s / {PARALLEL})"
    );
    println!("  makespan / lower bound:    {:.2}", makespan / bound);
    println!(
        "  Nova API calls:            {calls} ({:.1} per migrated VM, from Nova's access log)",
        calls as f64 / f64::from(st.migrated.max(1))
    );
    // Which calls: method and path, ids replaced, counted.
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    for line in &new {
        let request = line.split('"').nth(1).unwrap_or_default();
        let mut parts = request.split(' ');
        let method = parts.next().unwrap_or_default();
        let path = parts.next().unwrap_or_default().split('?').next().unwrap_or_default();
        let shape: Vec<&str> = path
            .split('/')
            .map(|seg| {
                if seg.len() >= 32 || seg.chars().all(|c| c.is_ascii_digit()) && !seg.is_empty() {
                    "{id}"
                } else {
                    seg
                }
            })
            .collect();
        *kinds.entry(format!("{method} {}", shape.join("/"))).or_default() += 1;
    }
    let mut kinds: Vec<(String, usize)> = kinds.into_iter().collect();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
    println!("  by kind (per migrated VM):");
    for (kind, n) in kinds {
        println!("    {:>5.1}  {kind}", n as f64 / f64::from(st.migrated.max(1)));
    }
    for id in &ids {
        if let Err(e) = admin.delete_server(id).await {
            eprintln!("could not delete {id}: {e}");
        }
    }
}
