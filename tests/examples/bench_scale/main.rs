//! `make bench` (cargo run --example bench_scale): the coordinator's cost
//! with N hosts, N = 100, 1,000 and 5,000 (about 40 minutes; e.g.
//! `HV_BENCH_SCALE=100,1000` for fewer). For each N: N hosts
//! registered in the ground's Nova (compute service, hypervisor, host
//! mapping and resource provider records, no nova-compute behind them), N
//! Nodes (kept alive by kwok) and N Hypervisors on the ground's API server as a leader left them
//! settled, Active and Healthy (host 0 settled by a leader of its own, its
//! status and marks given to the others with their names and ids), the release
//! coordinator binary (`HV_BIN_DIR`), and N simulated agents (`sim`) with a
//! 10 s heartbeat, run in this process (they share the two cores with the
//! coordinator, the API server and Nova). It prints:
//!
//! - coordinator RSS before any session (the caches and a read of the
//!   fleet) and with N, and the difference per session;
//! - its CPU over the steady window (share of one core);
//! - the heartbeat round trip as a simulated agent sees it (sent to
//!   acknowledged; the Ack follows the registry's intake), p50 and p99;
//! - reconciles per second and Nova requests per second over the steady
//!   window (Nova's own request log, this coordinator's requests only);
//! - how long N agents took to connect at first ("connect");
//! - after a failover (the leader killed, another started on its address):
//!   from the new leader's election, the time until all N agents are back
//!   ("storm") and until every host is judged again once it settled
//!   ("judged"), the agents' failed attempts, and Nova's requests from the
//!   kill until ten seconds after.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod sim;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use hv_coordinator::api::hypervisor::HealthState;
use hv_coordinator::api::{Hypervisor, HypervisorSpec, Phase};
use hv_tests::openstack::Admin;
use hv_tests::region::{Proc, Region};
use k8s_openapi::api::core::v1::Node;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};

const PREFIX: &str = "sim-";
const HEARTBEAT: Duration = Duration::from_secs(10);
/// The steady window: a minute, or two of the fleet view's bounds if
/// longer, so that it holds the same share of the fleet's reads at any N.
fn steady(n: usize) -> Duration {
    let bound: u64 = view_bound(n).trim_end_matches('s').parse().unwrap_or(30);
    Duration::from_secs(60.max(2 * bound))
}
const DRIFT: &str = "60s";

fn host(i: usize) -> String {
    format!("{PREFIX}{i:05}")
}

/// Kibibytes of resident memory of `pid`.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Clock ticks of CPU `pid` used so far (user and system).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces) in ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after ')'.
    n(11) + n(12)
}

fn ticks_per_second() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().map_or(100.0, |v| v as f64)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn metric(coord: &Proc, name: &str) -> f64 {
    hv_tests::region::metric_sum(coord.metrics.as_deref().unwrap(), name).await.unwrap_or(f64::NAN)
}

/// Nova requests from `coord` between `from` and `to`.
fn nova_requests(region: &Region, coord: &Proc, from: jiff::Timestamp, to: jiff::Timestamp) -> usize {
    let tag = format!("({})", coord.pod.as_deref().expect("a coordinator in a Pod"));
    hv_tests::openstack::nova_requests(&region.env)
        .into_iter()
        .filter(|r| r.user_agent.contains(&tag) && r.at >= from && r.at < to)
        .count()
}

/// What a leader left on one settled host: its Hypervisor's status and
/// metadata and its Node's marks, to be given to every other host with its
/// own name and Nova ids.
struct Left {
    hypervisor: serde_json::Value,
    node: serde_json::Value,
    service: String,
    hypervisor_id: String,
}

impl Left {
    /// `what` of `Left` for host `i`: host 0's name and ids replaced by its own.
    fn for_host(
        &self,
        what: &serde_json::Value,
        i: usize,
        service: &str,
        hypervisor: &str,
    ) -> serde_json::Value {
        let text = what
            .to_string()
            .replace(&host(0), &host(i))
            .replace(&self.service, service)
            .replace(&self.hypervisor_id, hypervisor);
        serde_json::from_str(&text).unwrap()
    }
}

/// Host `i`'s Node and Hypervisor, Active, with the ids Nova has for it:
/// as `left` says, or (no `left`) Active and Healthy with nothing else.
async fn create_host(region: &Region, admin: &Admin, ids: &Ids, i: usize, left: Option<&Left>) {
    let nodes: Api<Node> = Api::all(region.kube.client.clone());
    let hvs: Api<Hypervisor> = Api::all(region.kube.client.clone());
    let name = host(i);
    let (service, hypervisor) = ids.get(&name).cloned().unwrap_or_else(|| panic!("{name} not in Nova"));
    assert!(
        !service.is_empty() && !hypervisor.is_empty(),
        "{name}'s service or hypervisor not listed by Nova"
    );
    admin.ensure_provider(&name, &hypervisor).await.unwrap();
    let mut node = serde_json::json!({
        "metadata": {"name": name, "labels": {"hv-e2e": region.id}},
    });
    let mut hv = serde_json::to_value(Hypervisor::new(
        &name,
        HypervisorSpec { skip_tests: true, ..HypervisorSpec::default() },
    ))
    .unwrap();
    let status = match left {
        Some(left) => {
            let marks = left.for_host(&left.node, i, &service, &hypervisor);
            for key in ["labels", "annotations", "finalizers"] {
                node["metadata"][key] = marks[key].clone();
            }
            let theirs = left.for_host(&left.hypervisor, i, &service, &hypervisor);
            for key in ["labels", "annotations", "finalizers"] {
                hv["metadata"][key] = theirs["metadata"][key].clone();
            }
            serde_json::json!({"status": theirs["status"]})
        }
        None => serde_json::json!({"status": {
            "phase": "Active", "phaseSince": jiff::Timestamp::now().to_string(),
            "serviceId": service, "hypervisorId": hypervisor,
            "health": {"state": "Healthy"},
        }}),
    };
    // A kubelet of kwok's keeps the Node alive.
    let (kwok, fake) = hv_tests::region::KWOK_MANAGED;
    node["metadata"]["labels"][kwok] = fake.into();
    nodes.create(&PostParams::default(), &serde_json::from_value(node).unwrap()).await.unwrap();
    // This install's, as the coordinator labels what it makes.
    hv["metadata"]["labels"][hv_coordinator::api::keys::INSTANCE_LABEL] = region.instance().into();
    let hv: Hypervisor = serde_json::from_value(hv).unwrap();
    hvs.create(&PostParams::default(), &hv).await.unwrap();
    hvs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
}

type Ids = std::collections::HashMap<String, (String, String)>;

/// Host 0 settled by a leader of its own with its agent connected (health
/// settling 5 s), then that leader gone: what it left, for the others.
async fn warm_up(region: &Region, admin: &Admin, ids: &Ids, flags: &[&str]) -> Left {
    create_host(region, admin, ids, 0, None).await;
    let mut flags = flags.to_vec();
    let settle = flags.iter().position(|f| *f == "--health-settle").expect("a settle") + 1;
    flags[settle] = "5s";
    let mut coord = region.coordinator(None, &flags);
    let from = jiff::Timestamp::now();
    let stats = Arc::new(sim::Stats::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let agent = sim::Agent {
        tls: region.pki.node(&host(0)),
        node: host(0),
        url: region.grpc_url(),
        heartbeat: HEARTBEAT,
        domains: 20,
    };
    let agent = tokio::spawn(sim::run(agent, stats, stop_rx));
    // Its first look waits for a read of the whole fleet, which on the
    // ground's one-process Nova takes minutes at 5,000 hosts and may take
    // three tries (docs/benchmarks.md).
    settled(region, 1, &coord, from, Duration::from_secs(420)).await;
    // Its last writes, the Node's marks, follow the status that settled it.
    let nodes = Api::<Node>::all(region.kube.client.clone());
    let marked = |n: &Node| {
        let has = |m: &Option<std::collections::BTreeMap<String, String>>, k: &str| {
            m.as_ref().is_some_and(|m| m.contains_key(k))
        };
        let (labels, notes) = (&n.metadata.labels, &n.metadata.annotations);
        has(labels, hv_coordinator::api::keys::SCHEDULABLE_LABEL)
            && (has(labels, hv_coordinator::api::keys::EVICTABLE_LABEL)
                || has(notes, hv_coordinator::api::keys::EVICTABLE_LABEL))
    };
    let started = Instant::now();
    while !marked(&nodes.get(&host(0)).await.unwrap()) {
        assert!(started.elapsed() < Duration::from_secs(60), "{} not marked:\n{}", host(0), coord.tail(30));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    coord.kill();
    let _ = stop_tx.send(true);
    let _ = agent.await;
    let hv = Api::<Hypervisor>::all(region.kube.client.clone()).get(&host(0)).await.unwrap();
    let node = nodes.get(&host(0)).await.unwrap();
    let (service, hypervisor_id) = ids[&host(0)].clone();
    Left {
        hypervisor: serde_json::to_value(&hv).unwrap(),
        node: serde_json::json!({"labels": node.metadata.labels, "annotations": node.metadata.annotations,
            "finalizers": node.metadata.finalizers}),
        service,
        hypervisor_id,
    }
}

/// N Nodes and N Hypervisors as a leader left them (`warm_up`).
async fn seed(region: &Region, admin: &Admin, n: usize, flags: &[&str]) {
    let ids = admin.compute_ids().await.unwrap();
    let left = warm_up(region, admin, &ids, flags).await;
    futures_util::stream::iter(1..n)
        .map(|i| create_host(region, admin, &ids, i, Some(&left)))
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
}

/// Waits until every Hypervisor of the region is Active and judged Healthy
/// (no longer "not judged" as a new leader settles) with its agent
/// connected since `since` or later; answers how long it took.
async fn settled(
    region: &Region,
    n: usize,
    coord: &Proc,
    since: jiff::Timestamp,
    limit: Duration,
) -> Duration {
    // The status records whole seconds.
    let since = since - jiff::SignedDuration::from_secs(1);
    let started = Instant::now();
    let hvs: Api<Hypervisor> = Api::all(region.kube.client.clone());
    loop {
        let list = hvs.list(&ListParams::default()).await.unwrap();
        let is_good = |h: &Hypervisor| {
            let st = h.status.as_ref();
            st.and_then(|s| s.phase) == Some(Phase::Active)
                && st.and_then(|s| s.health.as_ref()).is_some_and(|x| x.state == HealthState::Healthy)
                && st
                    .and_then(|s| s.agent.as_ref())
                    .is_some_and(|a| a.connected && a.since.as_ref().is_some_and(|t| t.0 >= since))
                && st.is_some_and(|s| {
                    s.conditions.iter().any(|c| {
                        c.type_ == "NodeHealthy" && c.status == "True" && !c.message.starts_with("not judged")
                    })
                })
        };
        let good = list.items.iter().filter(|h| is_good(h)).count();
        if good >= n {
            return started.elapsed();
        }
        if started.elapsed() > limit {
            let odd: Vec<_> = list
                .items
                .iter()
                .filter(|h| !is_good(h))
                .take(3)
                .map(|h| {
                    let st = h.status.as_ref();
                    let cond =
                        st.and_then(|s| s.conditions.iter().find(|c| c.type_ == "NodeHealthy").cloned());
                    (h.name_any(), st.map(|s| (s.phase, s.health.clone(), s.agent.clone())), cond)
                })
                .collect();
            panic!(
                "only {good} of {n} hosts Active, Healthy and connected after {limit:?}: {odd:?}\n{}",
                coord.tail(30)
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

async fn sessions_at(coord: &Proc, n: usize, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        if metric(coord, "hv_coordinator_agent_sessions ").await >= n as f64 {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "not {n} sessions within {limit:?}:\n{}", coord.tail(30));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The fleet view's bound for `n` hosts: the default (half the drift
/// interval) below 1,000; from there, longer, as docs/nova.md asks once a
/// read of the fleet takes more than half the bound: the ground's
/// one-process Nova shares two cores with the control plane, the
/// simulated agents and the coordinator (docs/benchmarks.md).
fn view_bound(n: usize) -> &'static str {
    if n < 1000 { "30s" } else { "120s" }
}

/// Longest wait for one OpenStack answer: the fleet's first page of a
/// thousand hypervisors, on those cores, while a failover shares them.
const OPENSTACK_TIMEOUT: &str = "120s";

struct Row {
    n: usize,
    rss_idle_mib: f64,
    rss_mib: f64,
    kib_per_session: f64,
    cpu: f64,
    p50: Duration,
    p99: Duration,
    reconciles_per_s: f64,
    nova_per_s: f64,
    connected: Duration,
    storm: Duration,
    judged: Duration,
    storm_failed: u64,
    storm_nova: usize,
}

/// The coordinator's flags for `n` hosts: production's lease and timeouts
/// (the tests' are short), the view's bound for that size.
fn coordinator_flags(n: usize) -> Vec<String> {
    let beat = format!("{}s", HEARTBEAT.as_secs());
    [
        "--nova-view-max-age",
        view_bound(n),
        "--openstack-timeout",
        OPENSTACK_TIMEOUT,
        "--skip-tests",
        "--agent-heartbeat",
        beat.as_str(),
        "--drift-interval",
        DRIFT,
        "--busy-interval",
        "10s",
        // The default: the agents are back before any host is judged.
        "--health-settle",
        "90s",
        "--lease-duration",
        "15s",
        "--lease-renew-deadline",
        "10s",
        "--lease-retry",
        "2s",
        "--kube-timeout",
        "15s",
        "--connect-timeout",
        "3s",
    ]
    .map(String::from)
    .to_vec()
}

/// Waits until `coord` leads (within `limit`).
async fn leading(coord: &Proc, limit: Duration) {
    let start = Instant::now();
    while metric(coord, "hv_coordinator_leader ").await != 1.0 {
        assert!(start.elapsed() < limit, "{}", coord.tail(30));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn measure(admin: &Admin, n: usize) -> Row {
    let region = Region::start(&format!("scale{n}")).await;
    let flags = coordinator_flags(n);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    seed(&region, admin, n, &flags[..]).await;
    let mut coord = region.coordinator(None, &flags);
    let pid = coord.pid().unwrap();
    let limit = Duration::from_secs(300 + n as u64 / 4);
    // The leader with its caches (every host judged without its agent, then
    // left alone: --unreachable-grace is an hour on the ground).
    leading(&coord, limit).await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let rss_idle = rss_kib(pid);

    let agents_from = jiff::Timestamp::now();
    let stats = Arc::new(sim::Stats::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let agents: Vec<_> = (0..n)
        .map(|i| {
            let node = host(i);
            let agent = sim::Agent {
                tls: region.pki.node(&node),
                node,
                url: region.grpc_url(),
                heartbeat: HEARTBEAT,
                domains: 20,
            };
            tokio::spawn(sim::run(agent, stats.clone(), stop_rx.clone()))
        })
        .collect();
    let connected = sessions_at(&coord, n, limit).await;
    settled(&region, n, &coord, agents_from, limit).await;
    // A drift interval for the first reads to pass, then the steady window.
    tokio::time::sleep(Duration::from_secs(10)).await;
    stats.latencies.lock().unwrap().clear();
    stats.recording.store(true, Ordering::Relaxed);
    let (ticks0, rec0, from) =
        (cpu_ticks(pid), metric(&coord, "hv_reconciles_total{").await, jiff::Timestamp::now());
    tokio::time::sleep(steady(n)).await;
    let (ticks1, rec1, to) =
        (cpu_ticks(pid), metric(&coord, "hv_reconciles_total{").await, jiff::Timestamp::now());
    stats.recording.store(false, Ordering::Relaxed);
    let rss = rss_kib(pid);
    let mut lat = std::mem::take(&mut *stats.latencies.lock().unwrap());
    lat.sort();
    let secs = steady(n).as_secs_f64();
    let nova_steady = nova_requests(&region, &coord, from, to);

    // Failover: the leader dies; another replica on its address leads once
    // the lease runs out, and every agent comes back to it.
    coord.kill();
    let failed0 = stats.failed_attempts.load(Ordering::Relaxed);
    let storm_from = jiff::Timestamp::now();
    let mut next = region.coordinator(None, &flags);
    leading(&next, limit).await;
    let elected = Instant::now();
    let storm = sessions_at(&next, n, limit).await;
    let storm_failed = stats.failed_attempts.load(Ordering::Relaxed) - failed0;
    // Every host judged again by the new leader once it settled, and Nova's
    // requests from the kill until then and a drift interval's sixth after.
    settled(&region, n, &next, storm_from, limit).await;
    let judged = elected.elapsed();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let storm_nova = nova_requests(&region, &next, storm_from, jiff::Timestamp::now());

    let _ = stop_tx.send(true);
    for a in agents {
        let _ = a.await;
    }
    next.kill();
    Row {
        n,
        rss_idle_mib: rss_idle as f64 / 1024.0,
        rss_mib: rss as f64 / 1024.0,
        kib_per_session: (rss.saturating_sub(rss_idle)) as f64 / n as f64,
        cpu: (ticks1 - ticks0) as f64 / ticks_per_second() / secs,
        p50: percentile(&lat, 0.5),
        p99: percentile(&lat, 0.99),
        reconciles_per_s: (rec1 - rec0) / secs,
        nova_per_s: nova_steady as f64 / secs,
        connected,
        storm,
        judged,
        storm_failed,
        storm_nova,
    }
}

#[tokio::main]
async fn main() {
    let sizes: Vec<usize> = std::env::var("HV_BENCH_SCALE")
        .unwrap_or_else(|_| "100,1000,5000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let env = hv_tests::env::require();
    let admin = Admin::login(&env).await.unwrap();
    println!(
        "Scale: N simulated agents (10 s heartbeat, 20 domains each) and N Active hosts registered in Nova,"
    );
    println!(
        "against the release coordinator (drift interval {DRIFT}, health settle 90 s, the fleet view's bound in \"view\"),"
    );
    println!("steady window a minute or two view bounds, whichever is longer");
    println!(
        "{:>6} {:>5} {:>9} {:>9} {:>9} {:>5} {:>9} {:>9} {:>9} {:>7} {:>8} {:>7} {:>8} {:>7} {:>10}",
        "N",
        "view",
        "RSS idle",
        "RSS",
        "KiB/sess",
        "CPU",
        "rtt p50",
        "rtt p99",
        "reconc/s",
        "Nova/s",
        "connect",
        "storm",
        "judged",
        "retries",
        "storm Nova"
    );
    for n in sizes {
        let t = Instant::now();
        let made = admin.simulate_hosts(PREFIX, n).await.unwrap();
        eprintln!("[bench-scale] {made} hosts registered in Nova in {:?}", t.elapsed());
        let r = measure(&admin, n).await;
        println!(
            "{:>6} {:>5} {:>7.1}Mi {:>7.1}Mi {:>9.1} {:>4.0}% {:>7.1}ms {:>7.1}ms {:>9.1} {:>7.2} {:>7.1}s {:>6.1}s {:>7.1}s {:>7} {:>10}",
            r.n,
            view_bound(r.n),
            r.rss_idle_mib,
            r.rss_mib,
            r.kib_per_session,
            r.cpu * 100.0,
            r.p50.as_secs_f64() * 1000.0,
            r.p99.as_secs_f64() * 1000.0,
            r.reconciles_per_s,
            r.nova_per_s,
            r.connected.as_secs_f64(),
            r.storm.as_secs_f64(),
            r.judged.as_secs_f64(),
            r.storm_failed,
            r.storm_nova,
        );
    }
}
