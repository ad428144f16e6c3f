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
const MAX_AGE: Duration = Duration::from_secs(4);
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

/// Reads of the whole fleet among `requests`: one list of the services
/// each, less those of the hosts read on their own (one `servers` each).
fn fleet_reads(requests: &[NovaRequest]) -> usize {
    let count = |path: &str| requests.iter().filter(|r| r.method == "GET" && r.path == path).count();
    count("/os-services").saturating_sub(count("/servers"))
}

/// The coordinator's debug events on why it read a host on its own, and
/// its reads of the fleet, with their spans (the last 60).
fn why_read(coord: &Proc) -> String {
    let log = coord.tail(usize::MAX);
    let lines: Vec<&str> =
        log.lines().filter(|l| l.contains("reading it") || l.contains("fleet read")).collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
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
    let max_age = format!("{}s", MAX_AGE.as_secs());
    region.debug_coordinators(&["hv_coordinator::k8s::hypervisor", "hv_coordinator::nova::view"]);
    let coord = region.coordinator(None, &["--nova-view-max-age", &max_age]);
    let mut agents = active(&region, &hosts[..2], &coord).await;
    let two = counted(&region, &coord).await;
    agents.extend(active(&region, &hosts[2..], &coord).await);
    let eight = counted(&region, &coord).await;

    // A read of the fleet begins at most twice per bound, whatever the
    // hosts: the next is read ahead of the bound once the last is half the
    // bound old, when reads are slow (docs/nova.md, "The fleet view"); one
    // more at the window's edges.
    let most = (WINDOW.as_secs() * 2 / MAX_AGE.as_secs() + 1) as usize;
    let (r2, r8) = (fleet_reads(&two), fleet_reads(&eight));
    println!(
        "Nova requests in {WINDOW:?}: 2 hosts {} {}, 8 hosts {} {}",
        two.len(),
        summary(&two),
        eight.len(),
        summary(&eight)
    );
    assert!(!two.is_empty(), "the drift checks read Nova");
    // No host was read on its own (`servers?host=`) nor changed.
    let per_host: Vec<&NovaRequest> =
        eight.iter().filter(|r| r.path.ends_with("/servers") || r.method != "GET").collect();
    assert!(per_host.is_empty(), "{per_host:?}\n{}", why_read(&coord));
    assert!(r2 <= most && r8 <= most, "at most two fleet reads per bound: {r2}, {r8} > {most}");
    assert!(
        eight.len() <= most * PER_READ,
        "4 times the hosts, no more than the fleet reads: {}",
        eight.len()
    );

    // A change behind the coordinator's back (a disable of its own, left
    // behind: one by anyone else stands, tests/tests/sharing.rs) shows
    // through the view, and is repaired from the host's own reads: one
    // Event says so.
    let admin = hv_tests::openstack::Admin::login(&env).await.unwrap();
    let host = &hosts[3];
    let ours = serde_json::json!({"status": "disabled", "disabled_reason": region.our_disable(host).await});
    admin.set_service(host, ours).await.unwrap();
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
