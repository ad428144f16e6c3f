//! What the coordinator knows of each node's agent: the live session (one per
//! node), the acknowledged sequence, the latest facts and check report.
//!
//! The registry is memory only. After a coordinator restart the agents
//! reconnect and replay what was not acknowledged; check runs are asked for
//! again by the lifecycle, since the run number lives in the Hypervisor's
//! status.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use hv_proto::v1::agent_message::Payload;
use hv_proto::v1::coordinator_message::Payload as Down;
use hv_proto::v1::{AgentMessage, CheckConfig, CheckReport, CoordinatorMessage, HostFacts, RunChecks};
use jiff::Timestamp;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use crate::api::hypervisor::CheckResultStatus;
use crate::lifecycle;

pub type Outbound = mpsc::Sender<Result<CoordinatorMessage, Status>>;

/// The agent's side of a node, as the lifecycle and the SRE surface see it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentView {
    pub connected: bool,
    pub agent_version: String,
    pub last_seen: Option<Timestamp>,
    /// Since when the current session, or the disconnection, lasts.
    pub since: Option<Timestamp>,
    pub libvirt_version: Option<String>,
    pub hypervisor_version: Option<String>,
    pub checks: Option<lifecycle::CheckReport>,
    /// Messages the agent had to drop from its outbox (from heartbeats).
    pub dropped: u64,
    pub domains: Option<u32>,
}

struct Live {
    id: u64,
    tx: Outbound,
    /// Dropped to end the session when a newer one for the node replaces it.
    _close: oneshot::Sender<()>,
    sent_runs: HashSet<u64>,
}

#[derive(Default)]
struct Node {
    live: Option<Live>,
    boot_id: String,
    acked: u64,
    agent_version: String,
    last_seen: Option<Timestamp>,
    since: Option<Timestamp>,
    facts: Option<HostFacts>,
    checks: Option<CheckReport>,
    dropped: u64,
    domains: Option<u32>,
}

/// Session bookkeeping for every node; cheap to share (`Arc`).
pub struct Registry {
    nodes: Mutex<HashMap<String, Node>>,
    next_id: AtomicU64,
    /// Node names whose Hypervisor should be reconciled now (connect,
    /// disconnect, a check report, new facts).
    changed: mpsc::UnboundedSender<String>,
}

/// A freshly opened session: its id, where the session's reader learns that
/// it was replaced, and the sequence the coordinator already holds.
pub struct Opened {
    pub id: u64,
    pub closed: oneshot::Receiver<()>,
    pub acked: u64,
}

impl Registry {
    pub fn new(changed: mpsc::UnboundedSender<String>) -> Registry {
        Registry { nodes: Mutex::new(HashMap::new()), next_id: AtomicU64::new(1), changed }
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<String, Node>) -> R) -> R {
        let mut guard = match self.nodes.lock() {
            Ok(g) => g,
            // A panic while holding the lock cannot leave a node half-written
            // in a way that matters more than losing the coordinator.
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut guard)
    }

    /// Registers a session for `node`, replacing (and thereby closing) any
    /// previous one. A new agent process (another boot id) starts its
    /// sequence again, so the acknowledged sequence resets.
    pub fn open(&self, node: &str, boot_id: &str, agent_version: &str, tx: Outbound) -> Opened {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (close_tx, closed) = oneshot::channel();
        let acked = self.with(|nodes| {
            let n = nodes.entry(node.to_string()).or_default();
            if let Some(old) = n.live.take() {
                tracing::warn!(
                    node,
                    old_session = old.id,
                    new_session = id,
                    "a second session replaces the first"
                );
            }
            if n.boot_id != boot_id {
                n.boot_id = boot_id.to_string();
                n.acked = 0;
            }
            n.agent_version = agent_version.to_string();
            n.last_seen = Some(Timestamp::now());
            n.since = n.last_seen;
            n.live = Some(Live { id, tx, _close: close_tx, sent_runs: HashSet::new() });
            n.acked
        });
        let _ = self.changed.send(node.to_string());
        Opened { id, closed, acked }
    }

    /// The session ended (stream closed, broken or timed out). A session that
    /// was already replaced changes nothing.
    pub fn close(&self, node: &str, id: u64) {
        let closed = self.with(|nodes| match nodes.get_mut(node) {
            Some(n) if n.live.as_ref().is_some_and(|l| l.id == id) => {
                n.live = None;
                n.since = Some(Timestamp::now());
                true
            }
            _ => false,
        });
        if closed {
            let _ = self.changed.send(node.to_string());
        }
    }

    /// Takes in one message of session `id`. Answers the sequence to
    /// acknowledge, or None when the session is no longer the live one.
    pub fn receive(&self, node: &str, id: u64, msg: AgentMessage) -> Option<u64> {
        let mut notify = false;
        let ack = self.with(|nodes| {
            let n = nodes.get_mut(node)?;
            if n.live.as_ref().is_none_or(|l| l.id != id) {
                return None;
            }
            n.last_seen = Some(Timestamp::now());
            if msg.seq != 0 && msg.seq <= n.acked {
                // A replay of something we hold: acknowledge again, apply once.
                return Some(n.acked);
            }
            match msg.payload {
                Some(Payload::Heartbeat(hb)) => n.dropped = hb.dropped_messages,
                Some(Payload::HostFacts(f)) => {
                    notify = n.facts.as_ref() != Some(&f);
                    n.facts = Some(f);
                }
                Some(Payload::Inventory(inv)) => {
                    n.domains = Some(u32::try_from(inv.domains.len()).unwrap_or(u32::MAX));
                }
                Some(Payload::CheckReport(r)) => {
                    tracing::info!(node, run = r.run, checks = r.results.len(), "check report");
                    n.checks = Some(r);
                    notify = true;
                }
                Some(Payload::DomainEvent(e)) => {
                    tracing::debug!(node, domain = %e.name, kind = e.kind, "domain event");
                }
                Some(Payload::Connectivity(c)) => {
                    tracing::info!(node, peer = %c.peer, connected = c.connected, message = %c.message, "agent connectivity");
                }
                Some(Payload::Hello(_)) | None => {
                    tracing::warn!(node, seq = msg.seq, "ignoring an unexpected agent message");
                }
            }
            if msg.seq != 0 {
                n.acked = msg.seq;
            }
            Some(n.acked)
        });
        if notify {
            let _ = self.changed.send(node.to_string());
        }
        ack
    }

    pub fn view(&self, node: &str) -> AgentView {
        self.with(|nodes| {
            let Some(n) = nodes.get(node) else {
                return AgentView::default();
            };
            AgentView {
                connected: n.live.is_some(),
                agent_version: n.agent_version.clone(),
                last_seen: n.last_seen,
                since: n.since,
                libvirt_version: n
                    .facts
                    .as_ref()
                    .map(|f| f.libvirt_version.clone())
                    .filter(|v| !v.is_empty()),
                hypervisor_version: n
                    .facts
                    .as_ref()
                    .map(|f| format!("{} {}", f.hypervisor_type, f.hypervisor_version).trim().to_string())
                    .filter(|v| !v.is_empty()),
                checks: n.checks.as_ref().map(report),
                dropped: n.dropped,
                domains: n.domains,
            }
        })
    }

    /// Asks the node's agent to run checks, once per run and session (the
    /// lifecycle asks on every reconcile while Testing). False when no
    /// session is live.
    pub fn run_checks(&self, node: &str, run: u64, config: CheckConfig) -> bool {
        let tx = self.with(|nodes| {
            let live = nodes.get_mut(node)?.live.as_mut()?;
            if !live.sent_runs.insert(run) {
                return Some(None);
            }
            Some(Some(live.tx.clone()))
        });
        match tx {
            None => false,
            Some(None) => true,
            Some(Some(tx)) => {
                let msg = CoordinatorMessage {
                    payload: Some(Down::RunChecks(RunChecks { run, config: Some(config) })),
                };
                tracing::info!(node, run, "asking the agent to run its checks");
                tx.try_send(Ok(msg)).is_ok()
            }
        }
    }

    /// Ends every session (leadership lost, shutdown).
    pub fn close_all(&self) {
        self.with(|nodes| nodes.values_mut().for_each(|n| n.live = None));
    }
}

fn report(r: &CheckReport) -> lifecycle::CheckReport {
    lifecycle::CheckReport {
        run: r.run,
        results: r
            .results
            .iter()
            .map(|c| CheckResultStatus {
                name: c.name.clone(),
                passed: c.passed,
                message: c.message.clone(),
                duration_ms: c.duration.as_ref().map_or(0, |d| {
                    u64::try_from(d.seconds.saturating_mul(1000) + i64::from(d.nanos / 1_000_000))
                        .unwrap_or(0)
                }),
                time: c.finished_at.as_ref().and_then(|t| {
                    Timestamp::new(t.seconds, t.nanos)
                        .ok()
                        .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time)
                }),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hv_proto::v1::{CheckResult, Heartbeat};

    fn msg(seq: u64, payload: Payload) -> AgentMessage {
        AgentMessage { seq, sent_at: None, payload: Some(payload) }
    }

    fn report(run: u64) -> Payload {
        let ok = CheckResult { name: "x".into(), passed: true, ..Default::default() };
        Payload::CheckReport(CheckReport { run, results: vec![ok] })
    }

    fn registry() -> (Registry, mpsc::UnboundedReceiver<String>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Registry::new(tx), rx)
    }

    #[test]
    fn a_second_session_replaces_the_first_and_the_first_goes_quiet() {
        let (r, mut changed) = registry();
        let (tx1, _rx1) = mpsc::channel(8);
        let mut first = r.open("n1", "boot-a", "1.0", tx1);
        assert!(matches!(first.closed.try_recv(), Err(oneshot::error::TryRecvError::Empty)));
        let (tx2, _rx2) = mpsc::channel(8);
        let second = r.open("n1", "boot-a", "1.0", tx2);
        let signal = first.closed.try_recv();
        assert!(
            matches!(signal, Err(oneshot::error::TryRecvError::Closed)),
            "the first session is told to end"
        );
        assert_eq!(
            r.receive("n1", first.id, msg(1, report(1))),
            None,
            "messages of a replaced session are ignored"
        );
        assert_eq!(r.receive("n1", second.id, msg(1, report(1))), Some(1));
        r.close("n1", first.id);
        assert!(r.view("n1").connected, "closing the replaced session leaves the live one");
        r.close("n1", second.id);
        assert!(!r.view("n1").connected);
        let mut names = Vec::new();
        while let Ok(n) = changed.try_recv() {
            names.push(n);
        }
        assert!(names.len() >= 3 && names.iter().all(|n| n == "n1"), "{names:?}");
    }

    #[test]
    fn replays_are_acknowledged_but_applied_once_and_a_new_boot_starts_over() {
        let (r, _changed) = registry();
        let (tx, _rx) = mpsc::channel(8);
        let s = r.open("n1", "boot-a", "1.0", tx);
        assert_eq!(r.receive("n1", s.id, msg(5, report(7))), Some(5));
        assert_eq!(r.receive("n1", s.id, msg(4, report(1))), Some(5), "an old message changes nothing");
        assert_eq!(r.view("n1").checks.map(|c| c.run), Some(7));
        let hb = Payload::Heartbeat(Heartbeat { dropped_messages: 3, ..Default::default() });
        assert_eq!(r.receive("n1", s.id, msg(6, hb)), Some(6));
        assert_eq!(r.view("n1").dropped, 3);

        let (tx, _rx) = mpsc::channel(8);
        assert_eq!(r.open("n1", "boot-a", "1.0", tx).acked, 6, "same process reconnecting: resume");
        let (tx, _rx) = mpsc::channel(8);
        assert_eq!(r.open("n1", "boot-b", "1.0", tx).acked, 0, "a restarted agent numbers from 1 again");
    }

    #[test]
    fn checks_are_sent_once_per_run_and_session() {
        let (r, _changed) = registry();
        assert!(!r.run_checks("n1", 1, CheckConfig::default()), "no session, nothing sent");
        let (tx, mut rx) = mpsc::channel(8);
        r.open("n1", "boot-a", "1.0", tx);
        assert!(r.run_checks("n1", 1, CheckConfig::default()));
        assert!(r.run_checks("n1", 1, CheckConfig::default()));
        assert!(r.run_checks("n1", 2, CheckConfig::default()));
        let mut runs = Vec::new();
        while let Ok(Ok(m)) = rx.try_recv() {
            if let Some(Down::RunChecks(rc)) = m.payload {
                runs.push(rc.run);
            }
        }
        assert_eq!(runs, vec![1, 2]);
    }
}
