//! The fleet view on the real peers: Nova's requests for the drift checks
//! of Active hosts do not grow with the number of hosts, counted in Nova's
//! own request log (each request names the replica that sent it), and a
//! change made behind the coordinator's back still shows through it and is
//! repaired from the host's own reads (docs/nova.md, "The fleet view").

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test that fails fails

use std::time::Duration;

use hv_tests::openstack::NovaRequest;
use hv_tests::region::{Proc, Region};

const SOON: Duration = Duration::from_secs(120);
/// The window requests are counted in: ten of the test coordinator's
/// two-second drift intervals.
const WINDOW: Duration = Duration::from_secs(20);
/// The fleet view's bound in this test: two drift intervals, so that two
/// hosts' drift checks already come often enough to read the fleet as
/// often as the bound lets (with a bound under the interval, fewer hosts
/// would read it less often than more).
const MAX_AGE: &str = "4s";
/// Nova requests in one read of the fleet: services, aggregates, one page
/// of hypervisors and the empty one that ends the list (Placement's aside).
const PER_READ: usize = 4;

/// The requests Nova took from `coord` within `WINDOW` from now.
async fn counted(region: &Region, coord: &Proc) -> Vec<NovaRequest> {
    let tag = format!("({})", coord.pod.as_deref().expect("a coordinator in a Pod"));
    let from = jiff::Timestamp::now();
    tokio::time::sleep(WINDOW).await;
    let to = jiff::Timestamp::now();
    hv_tests::openstack::nova_requests(&region.env)
        .into_iter()
        .filter(|r| r.user_agent.contains(&tag) && r.at >= from && r.at < to)
        .collect()
}

/// Agents and Nodes for `hosts`, once each is Active and its first moments
/// are over: the transition's quick looks read the host on its own, and a
/// read of the fleet begun before them cannot answer for it, so the window
/// starts once every read of the fleet in use began after them (a bound and
/// a drift interval). With 3 s a host was once read on its own in the window.
async fn active(region: &Region, hosts: &[String], coord: &Proc) -> Vec<Proc> {
    let agents = region.active_with_agents(hosts, coord, SOON).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    agents
}

fn summary(requests: &[NovaRequest]) -> String {
    let mut by: std::collections::BTreeMap<String, usize> = Default::default();
    for r in requests {
        *by.entry(format!("{} {}", r.method, r.path)).or_default() += 1;
    }
    format!("{by:?}")
}

#[tokio::test(flavor = "multi_thread")]
async fn nova_requests_for_drift_checks_do_not_grow_with_the_active_hosts() {
    let region = Region::start("fleet-view").await;
    let env = region.env.clone();
    let mut claims = Vec::new();
    for _ in 0..8 {
        claims.push(hv_tests::hosts::claim(&env).await);
    }
    let hosts: Vec<String> = claims.iter().map(|c| c.host.clone()).collect();
    let coord = region.coordinator(None, &["--nova-view-max-age", MAX_AGE]);
    let mut agents = active(&region, &hosts[..2], &coord).await;
    let two = counted(&region, &coord).await;
    agents.extend(active(&region, &hosts[2..], &coord).await);
    let eight = counted(&region, &coord).await;

    // Per host, as every drift check read before: its service, its
    // hypervisor, the aggregates and its servers (Placement's two reads
    // aside), ten intervals in the window.
    let per_host_reads = 4 * 8 * 10;
    // At most one read of the fleet per bound, and one more at the edges.
    let bound = (WINDOW.as_secs() as usize / 4 + 1) * PER_READ;
    let (n2, n8) = (two.len(), eight.len());
    println!("Nova requests in {WINDOW:?}: 2 hosts {n2} {}, 8 hosts {n8} {}", summary(&two), summary(&eight));
    assert!(n2 > 0, "the drift checks read Nova");
    assert!(n2 <= bound && n8 <= bound, "at most one fleet read per bound: {n2}, {n8} > {bound}");
    assert!(n8 <= n2 + 2 * PER_READ, "4 times the hosts, the same reads: 2 hosts {n2}, 8 hosts {n8}");
    assert!(n8 * 10 < per_host_reads, "{n8} requests for 8 hosts: well under one per host per interval");
    // No host was read on its own (`servers?host=`) nor changed.
    let per_host: Vec<&NovaRequest> =
        eight.iter().filter(|r| r.path.ends_with("/servers") || r.method != "GET").collect();
    assert!(per_host.is_empty(), "{per_host:?}");

    // A change behind the coordinator's back shows through the view, and is
    // repaired from the host's own reads: one Event says so.
    let admin = hv_tests::openstack::Admin::login(&env).await.unwrap();
    let host = &hosts[3];
    let by_hand = serde_json::json!({"status": "disabled", "disabled_reason": "by hand"});
    admin.set_service(host, by_hand).await.unwrap();
    hv_tests::wait::until(
        "the drift repaired",
        Duration::from_secs(30),
        || coord.tail(20),
        || async {
            let svc = admin.service(host).await.unwrap().unwrap_or_default();
            let repaired = region.events_for(host).await.iter().any(|e| e.0 == "DriftRepaired");
            match (svc["status"] == "enabled", repaired) {
                (true, true) => hv_tests::wait::Poll::Ready(()),
                _ => hv_tests::wait::Poll::Pending(format!("{svc}")),
            }
        },
    )
    .await;
    drop(agents);
}
