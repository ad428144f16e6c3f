//! `make bench` (agent part): the agent's steady RSS and idle CPU with 200
//! domains in libvirtd's test driver, and the latency from a libvirt event
//! (caused on another connection) to its arrival at the coordinator.
//! Prints figures; asserts nothing. Needs the test ground (`make bench`
//! brings it up).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hv_proto::v1::DomainEventKind;
use hv_proto::v1::agent_message::Payload;
use hv_tests::fake_coordinator::FakeCoordinator;

const DOMAINS: usize = 200;
const EVENTS: usize = 100;

/// The agent dies with the bench, whatever happens.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn proc_stat(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or_default();
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kib = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (ticks, rss_kib)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let env = match hv_tests::env::load() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("bench_agent: {e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        // 200 domains in the shared test driver, kept alive by this connection.
        let uri = env.libvirt.test_uri.clone();
        let conn = virt::connect::Connect::open(Some(&uri)).unwrap();
        let doms = define_domains(&conn);
        let stub = FakeCoordinator::with_commands(vec![]);
        let url = stub.serve().await.unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_hv-agent"))
            .args([
                "run",
                "--node",
                "bench",
                "--insecure",
                "--coordinator",
                &url,
                "--health-listen",
                "127.0.0.1:0",
            ])
            .args(["--libvirt-uri", &uri, "--ovsdb", &env.ovsdb.tcp])
            // Production-like: the node's RBD pool is watched (through hv-ceph-probe).
            .args(["--ceph-conf", &env.ceph.conf.to_string_lossy(), "--ceph-id", &env.ceph.client.id])
            .args(["--ceph-keyring", &env.ceph.client.keyring.to_string_lossy(), "--pool", "vms"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let child = KillOnDrop(child);
        let pid = child.0.id();
        // Wait for the full inventory, then let it settle.
        let t = Instant::now();
        let full_inventory = |msgs: &[hv_proto::v1::AgentMessage]| {
            msgs.iter()
                .any(|m| matches!(&m.payload, Some(Payload::Inventory(i)) if i.domains.len() > DOMAINS))
        };
        while !full_inventory(&stub.messages().await) {
            assert!(t.elapsed() < Duration::from_secs(30), "no inventory of {DOMAINS}+ domains");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let first_inventory = t.elapsed();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let idle = idle(pid).await;
        let lat = latencies(&doms, &stub).await;
        drop(child);
        for d in &doms {
            let _ = d.destroy();
            let _ = d.undefine();
        }
        report(first_inventory, &idle, &lat);
    });
}

/// `DOMAINS` running domains, defined anew (leftovers of an interrupted
/// run removed first).
fn define_domains(conn: &virt::connect::Connect) -> Vec<virt::domain::Domain> {
    for d in conn.list_all_domains(0).unwrap_or_default() {
        if d.name().is_ok_and(|n| n.starts_with("bench-")) {
            let _ = d.destroy();
            let _ = d.undefine();
        }
    }
    let mut doms = Vec::new();
    for i in 0..DOMAINS {
        let xml = format!(
            "<domain type='test'><name>bench-{i}</name><memory>1048576</memory><vcpu>2</vcpu><os><type>hvm</type></os>\
             <devices><disk type='network' device='disk'><source protocol='rbd' name='vms/bench-{i}_disk'/><target dev='vda'/></disk></devices></domain>"
        );
        let d = conn.define_domain_xml(&xml).unwrap();
        d.create().unwrap();
        doms.push(d);
    }
    doms
}

/// The agent at rest: its CPU and memory over `IDLE`.
struct Idle {
    cpu_pct: f64,
    rss_kib: u64,
    rss_max_kib: u64,
    anon_kib: u64,
}

const IDLE: Duration = Duration::from_secs(30);

async fn idle(pid: u32) -> Idle {
    let (t0, _) = proc_stat(pid);
    let mut rss_max_kib = 0u64;
    let start = Instant::now();
    while start.elapsed() < IDLE {
        tokio::time::sleep(Duration::from_millis(500)).await;
        rss_max_kib = rss_max_kib.max(proc_stat(pid).1);
    }
    let (t1, rss_kib) = proc_stat(pid);
    let anon_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("RssAnon:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let clk = 100.0; // USER_HZ on Linux
    let cpu_pct = (t1 - t0) as f64 / clk / IDLE.as_secs_f64() * 100.0;
    Idle { cpu_pct, rss_kib, rss_max_kib, anon_kib }
}

/// Event latency: suspend and resume from this (another) connection, each
/// timed to its arrival at the coordinator; sorted.
async fn latencies(doms: &[virt::domain::Domain], stub: &FakeCoordinator) -> Vec<Duration> {
    let mut lat = Vec::new();
    for i in 0..EVENTS {
        // Pairs: suspend a domain, then resume the same one.
        let d = &doms[(i / 2) % DOMAINS];
        let name = format!("bench-{}", (i / 2) % DOMAINS);
        let (kind, t_cause) = if i % 2 == 0 {
            let t = Instant::now();
            d.suspend().unwrap();
            (DomainEventKind::Suspended as i32, t)
        } else {
            let t = Instant::now();
            d.resume().unwrap();
            (DomainEventKind::Resumed as i32, t)
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let arrived = stub.received.lock().await.iter().rev().find_map(|(at, m)| match &m.payload {
                Some(Payload::DomainEvent(e)) if e.name == name && e.kind == kind && *at >= t_cause => {
                    Some(*at)
                }
                _ => None,
            });
            if let Some(at) = arrived {
                lat.push(at.saturating_duration_since(t_cause));
                break;
            }
            assert!(Instant::now() < deadline, "event {i} never arrived");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lat.sort();
    lat
}

fn report(first_inventory: Duration, idle: &Idle, lat: &[Duration]) {
    let Idle { cpu_pct, rss_kib, rss_max_kib, anon_kib } = idle;
    println!("hv-agent, release build, {DOMAINS} domains in libvirtd's test driver over TCP");
    println!("  first full inventory after start     {:>8.0} ms", first_inventory.as_secs_f64() * 1e3);
    println!(
        "  steady RSS                           {:>8.1} MiB (max {:.1} MiB)   aim < 20 MiB",
        *rss_kib as f64 / 1024.0,
        *rss_max_kib as f64 / 1024.0
    );
    println!(
        "    of which anonymous (heap, stacks)  {:>8.1} MiB; the rest is shared library and binary pages",
        *anon_kib as f64 / 1024.0
    );
    println!(
        "  idle CPU over {}s                    {:>8.2} %                 aim < 0.5 %",
        IDLE.as_secs(),
        cpu_pct
    );
    println!("  libvirt event -> coordinator, {EVENTS} events (suspend/resume on another connection)");
    println!(
        "    p50 {:>7.2} ms   p99 {:>7.2} ms   max {:>7.2} ms          aim p99 < 100 ms",
        pct(lat, 0.5).as_secs_f64() * 1e3,
        pct(lat, 0.99).as_secs_f64() * 1e3,
        lat[lat.len() - 1].as_secs_f64() * 1e3
    );
}
