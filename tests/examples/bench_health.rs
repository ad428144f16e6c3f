//! `make bench` (cargo run --example bench_health): the time from a cause on
//! the real ground to the verdict the coordinator records for it, p50 and
//! p99 per cause. The clock starts when the test makes the cause happen and
//! stops when the Hypervisor's status (read from the API every 20 ms) shows
//! the verdict: detection by the agent (or the watch), the stream, the
//! reconcile and the status write, all in. Host signals are read every
//! 10 s by the agent, so their figure is mostly that period.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use hv_coordinator::api::Phase;
use hv_coordinator::api::hypervisor::HealthState;
use hv_tests::region::{AgentPeers, Region};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};

async fn wait(region: &Region, host: &str, want: HealthState) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = region.hypervisor(host).await.and_then(|h| h.status).and_then(|s| s.health);
        if now.as_ref().is_some_and(|h| h.state == want) {
            return;
        }
        assert!(Instant::now() < deadline, "{host} never {want}: {now:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The Node's Ready condition set by hand, so the cause has an exact time
/// (the Node lifecycle controller's own change is stamped to the second).
/// kwok must not manage the Node meanwhile: it sets any Node it manages
/// that is not Ready back to Ready at once.
async fn node_not_ready(nodes: &Api<Node>, host: &str) {
    let patch = serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown",
        "lastTransitionTime": jiff::Timestamp::now().to_string()}]}});
    nodes.patch_status(host, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() {
    let region = Region::start("bench-health").await;
    let host = hv_tests::hosts::claim(&region.env).await.host;
    // Nothing is acted on (no ha maintenance, no disabling): only the
    // verdict is timed. The Node's grace is 0 s: its figure is the watch's.
    let coord = region
        .coordinator(None, &["--skip-tests", "--node-not-ready-grace", "0s", "--ha-maintenance-limit", "0"]);
    let root = hv_tests::region::healthy_host(&region.dir.join("host"));
    let peers = AgentPeers { host_root: Some(root.clone()), ..Default::default() };
    let mut agent = region.agent(&host, &peers);
    region.create_node(&host, &[]).await;
    region.wait_phase(&host, Phase::Active, Duration::from_secs(60), &coord).await;
    wait(&region, &host, HealthState::Healthy).await;
    let nodes: Api<Node> = Api::all(region.kube.client.clone());
    let mounts = root.join("proc/1/mounts");
    let mut rows: Vec<(&str, Vec<Duration>)> = Vec::new();

    let mut samples = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        agent.kill();
        wait(&region, &host, HealthState::Unreachable).await;
        samples.push(t.elapsed());
        agent = region.agent(&host, &peers);
        wait(&region, &host, HealthState::Healthy).await;
    }
    rows.push(("agent killed -> Unreachable", samples));

    let mut samples = Vec::new();
    for _ in 0..10 {
        agent.kill();
        wait(&region, &host, HealthState::Unreachable).await;
        region.kwok_manages(&host, false).await;
        let t = Instant::now();
        node_not_ready(&nodes, &host).await;
        wait(&region, &host, HealthState::Failed).await;
        samples.push(t.elapsed());
        region.kubelet_returns(&host).await;
        agent = region.agent(&host, &peers);
        wait(&region, &host, HealthState::Healthy).await;
    }
    rows.push(("then Node not Ready -> Failed", samples));

    let mut samples = Vec::new();
    for i in 0..8 {
        // Spread over the agent's 10 s period (Healthy is seen just after
        // one of its reads: writing at once would always wait a whole one).
        tokio::time::sleep(Duration::from_millis(1250 * i)).await;
        let t = Instant::now();
        std::fs::write(&mounts, "/dev/vda1 / ext4 ro,relatime 0 0\n").unwrap();
        wait(&region, &host, HealthState::Degraded).await;
        samples.push(t.elapsed());
        std::fs::write(&mounts, "/dev/vda1 / ext4 rw,relatime 0 0\n").unwrap();
        wait(&region, &host, HealthState::Healthy).await;
    }
    rows.push(("root read-only -> Degraded", samples));

    println!(
        "node health: from the cause to the recorded verdict (real coordinator, agent, real API server)"
    );
    println!("{:<32} {:>4} {:>10} {:>10} {:>10}", "cause -> verdict", "n", "p50", "p99", "max");
    for (what, mut s) in rows {
        s.sort();
        let ms = |d: Duration| format!("{} ms", d.as_millis());
        let (p50, p99, max) = (percentile(&s, 0.5), percentile(&s, 0.99), s[s.len() - 1]);
        println!("{what:<32} {:>4} {:>10} {:>10} {:>10}", s.len(), ms(p50), ms(p99), ms(max));
    }
    drop(agent);
    drop(coord);
}
