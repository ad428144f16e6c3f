//! `make bench` (cargo run --example bench_power): one host of the real
//! ground hibernated and woken again and again, its fake machine following
//! its BMC (the Redfish emulator): the time from `hvctl hibernate` of an
//! empty Active host to its BMC read Off twice (`Hibernating`), and from
//! `hvctl wake` to the host enabled in Nova and Active again, its checks
//! run (p50 and max). Milestones read every 250 ms from the API server.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use hv_coordinator::api::Phase;
use hv_coordinator::api::power::HostPower;
use hv_tests::bmc::machine_follows_bmc;
use hv_tests::fencing::{give_fencing_means, wait_power};
use hv_tests::region::{AgentPeers, Region};

const ROUNDS: usize = 3;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Runs `verb` and answers how long until `host`'s status is where `done` says.
async fn timed(
    region: &Region,
    host: &str,
    verb: &str,
    done: impl Fn(&hv_coordinator::api::Hypervisor) -> bool,
) -> Duration {
    let t0 = Instant::now();
    let out = region.hvctl().args([verb, host]).output().unwrap();
    assert!(out.status.success(), "hvctl {verb}: {}", String::from_utf8_lossy(&out.stderr));
    loop {
        let hv = region.hypervisor(host).await.unwrap();
        if done(&hv) {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(600),
            "{host}: {verb} not done in 10 min: {:?}",
            hv.status
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::main]
async fn main() {
    let region = Region::start("bench-power").await;
    let claim = hv_tests::hosts::claim(&region.env).await;
    let host = claim.host.clone();
    hv_tests::bmc::power_on(&region.env, &host).await.unwrap();
    wait_power(&region.env, &host, "On").await;
    let coord = region.coordinator(None, &[]);
    let _empty = hv_tests::hosts::WithoutDomains::take(&region.env, &host, &region.dir);
    let peers = AgentPeers { inventory_interval: Some("2s".into()), ..AgentPeers::default() };
    let rounds = async {
        region.create_node(&host, &[]).await;
        region.wait_phase(&host, Phase::Active, Duration::from_secs(180), &coord).await;
        give_fencing_means(&region, &host, None).await;
        let (mut off, mut back) = (Vec::new(), Vec::new());
        for round in 1..=ROUNDS {
            let power = |hv: &hv_coordinator::api::Hypervisor| hv.status.as_ref().and_then(|s| s.power_state);
            let t_off =
                timed(&region, &host, "hibernate", |hv| power(hv) == Some(HostPower::Hibernating)).await;
            let t_back = timed(&region, &host, "wake", |hv| {
                let enabled = Region::condition(hv, "SchedulingEnabled").0 == "True";
                power(hv) == Some(HostPower::Running) && enabled
            })
            .await;
            eprintln!(
                "round {round}: empty to off {:.1} s, wake to Active {:.1} s",
                t_off.as_secs_f64(),
                t_back.as_secs_f64()
            );
            off.push(t_off);
            back.push(t_back);
        }
        (off, back)
    };
    let (mut off, mut back) = tokio::select! {
        () = machine_follows_bmc(&region, &host, &peers) => panic!("the machine stopped following its BMC"),
        r = rounds => r,
    };
    off.sort();
    back.sort();
    println!(
        "power: one host hibernated and woken {ROUNDS} times (real coordinator, agent, Nova, Redfish emulator whose \
         fake driver lands a power change up to 11 s after it is asked; real API server)"
    );
    println!("{:<44} {:>3} {:>10} {:>10}", "milestone", "n", "p50", "max");
    for (label, s) in [
        ("hvctl hibernate to Hibernating (read Off x2)", &off),
        ("hvctl wake to Active, checks passed, enabled", &back),
    ] {
        let f = |d: Duration| format!("{:.1} s", d.as_secs_f64());
        println!("{label:<44} {:>3} {:>10} {:>10}", s.len(), f(percentile(s, 0.5)), f(percentile(s, 1.0)));
    }
    drop(coord);
}
