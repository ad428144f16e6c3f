//! Simulated agents: each one a tonic client with its own TLS connection and
//! node certificate, speaking the agent's protocol as `hv-agent` does: Hello,
//! then its facts and an inventory, a heartbeat per interval, now and then a
//! burst of domain events; on a broken stream it reconnects with the agent's
//! own jittered backoff (`hv_agent::backoff`). It times each heartbeat from
//! its sending to the coordinator's Ack, which is sent once the registry
//! has taken the message in.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hv_agent::backoff::{Backoff, draw, timestamp_now};
use hv_proto::v1::agent_message::Payload;
use hv_proto::v1::agent_service_client::AgentServiceClient;
use hv_proto::v1::coordinator_message::Payload as Down;
use hv_proto::v1::{
    AgentMessage, Capability, Domain, DomainEvent, DomainEventKind, DomainState, Heartbeat, Hello, HostFacts,
    Inventory, WatcherHealth,
};
use hv_tls::TlsFiles;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

/// What every simulated agent adds to.
#[derive(Default)]
pub struct Stats {
    /// Heartbeat round trips, while `recording`.
    pub latencies: Mutex<Vec<Duration>>,
    pub recording: AtomicBool,
    /// Agents whose session is up now.
    pub connected: AtomicUsize,
    /// Sessions opened (Welcome received), all agents.
    pub sessions: AtomicU64,
    /// Attempts that failed (refused, unreachable, broken before Welcome).
    pub failed_attempts: AtomicU64,
}

pub struct Agent {
    pub node: String,
    pub url: String,
    pub tls: TlsFiles,
    pub heartbeat: Duration,
    /// Domains in its inventory.
    pub domains: usize,
}

/// Runs until `stop` turns true.
pub async fn run(agent: Agent, stats: Arc<Stats>, mut stop: watch::Receiver<bool>) {
    let boot_id = format!("sim-boot-{}-{}", agent.node, std::process::id());
    let mut seq = 0_u64;
    let mut attempt = 0_u32;
    let backoff = Backoff::default();
    loop {
        let welcomed = tokio::select! {
            w = session(&agent, &boot_id, &mut seq, &stats) => w,
            _ = stop.wait_for(|s| *s) => return,
        };
        attempt = if welcomed { 0 } else { attempt + 1 };
        if !welcomed {
            stats.failed_attempts.fetch_add(1, Ordering::Relaxed);
        }
        tokio::select! {
            () = tokio::time::sleep(backoff.delay(attempt, draw())) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

fn message(seq: &mut u64, payload: Payload) -> AgentMessage {
    *seq += 1;
    AgentMessage { seq: *seq, sent_at: Some(timestamp_now()), payload: Some(payload) }
}

fn facts(node: &str) -> Payload {
    Payload::HostFacts(HostFacts {
        hostname: node.to_string(),
        kernel: "6.8.0-sim".into(),
        libvirt_version: "10.0.0".into(),
        hypervisor_type: "QEMU".into(),
        hypervisor_version: "8.2.0".into(),
        cpu_model: "EPYC-Milan".into(),
        arch: "x86_64".into(),
        cpu_features: (0..60).map(|i| format!("feature{i}")).collect(),
        memory_bytes: 512 << 30,
        cpus: 128,
        ..Default::default()
    })
}

fn inventory(node: &str, n: usize) -> Payload {
    Payload::Inventory(Inventory {
        domains: (0..n)
            .map(|i| Domain {
                uuid: format!("00000000-0000-4000-8000-{:012}", i),
                name: format!("instance-{node}-{i}"),
                state: DomainState::Running as i32,
                vcpus: 4,
                memory_bytes: 8 << 30,
                ..Default::default()
            })
            .collect(),
    })
}

/// One session: true once the coordinator welcomed it (it ended later).
async fn session(agent: &Agent, boot_id: &str, seq: &mut u64, stats: &Stats) -> bool {
    let Ok(channel) = hv_tests::region::connect(&agent.url, &agent.tls).await else {
        return false;
    };
    let (tx, rx) = mpsc::channel::<AgentMessage>(64);
    let hello = Hello {
        node: agent.node.clone(),
        agent_version: "sim".into(),
        boot_id: boot_id.to_string(),
        capabilities: vec![Capability::Libvirt as i32, Capability::BridgeExpectations as i32],
        replay_from: 0,
    };
    let _ = tx
        .send(AgentMessage { seq: 0, sent_at: Some(timestamp_now()), payload: Some(Payload::Hello(hello)) })
        .await;
    let Ok(answer) = AgentServiceClient::new(channel).connect(ReceiverStream::new(rx)).await else {
        return false;
    };
    let mut inbound = answer.into_inner();
    match inbound.next().await {
        Some(Ok(m)) if matches!(m.payload, Some(Down::Welcome(_))) => {}
        _ => return false,
    }
    stats.sessions.fetch_add(1, Ordering::Relaxed);
    stats.connected.fetch_add(1, Ordering::Relaxed);
    let _ = tx.send(message(seq, facts(&agent.node))).await;
    let _ = tx.send(message(seq, inventory(&agent.node, agent.domains))).await;
    let mut sent: HashMap<u64, Instant> = HashMap::new();
    // Spread the beats of agents that connected together.
    let first = tokio::time::Instant::now() + agent.heartbeat.mul_f64(draw());
    let mut tick = tokio::time::interval_at(first, agent.heartbeat);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let hb = Heartbeat {
                    load1: 1.5,
                    memory_total_bytes: 512 << 30,
                    memory_available_bytes: 256 << 30,
                    dropped_messages: 0,
                    watchers: ["libvirt", "ovsdb", "ceph"]
                        .iter()
                        .map(|w| WatcherHealth { name: (*w).into(), live: true, message: String::new() })
                        .collect(),
                };
                let m = message(seq, Payload::Heartbeat(hb));
                sent.insert(m.seq, Instant::now());
                if tx.send(m).await.is_err() {
                    break;
                }
                // Now and then a burst of domain events (a VM started and
                // its neighbours changed), about once a minute per agent
                // at a 10 s beat.
                if draw() < 1.0 / 6.0 {
                    for i in 0..10 {
                        let e = DomainEvent {
                            uuid: format!("00000000-0000-4000-8000-{i:012}"),
                            name: format!("instance-{}-{i}", agent.node),
                            kind: DomainEventKind::Started as i32,
                            reason: "booted".into(),
                            observed_at: Some(timestamp_now()),
                        };
                        if tx.send(message(seq, Payload::DomainEvent(e))).await.is_err() {
                            break;
                        }
                    }
                }
            }
            m = inbound.next() => match m {
                Some(Ok(m)) => {
                    if let Some(Down::Ack(a)) = m.payload
                        && let Some(at) = sent.remove(&a.seq)
                        && stats.recording.load(Ordering::Relaxed)
                    {
                        stats.latencies.lock().unwrap_or_else(|p| p.into_inner()).push(at.elapsed());
                    }
                    // A beat whose Ack never came (its session replaced)
                    // is not waited for forever.
                    if sent.len() > 64 {
                        sent.clear();
                    }
                }
                _ => break,
            },
        }
    }
    stats.connected.fetch_sub(1, Ordering::Relaxed);
    true
}
