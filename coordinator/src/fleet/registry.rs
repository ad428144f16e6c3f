//! What the coordinator knows of each node's agent: the live session (one per
//! node), the acknowledged sequence, the latest facts and check report.
//!
//! The registry is memory only. After a coordinator restart the agents
//! reconnect and replay what was not acknowledged; a test run is asked for
//! again by the lifecycle (its number lives in the Hypervisor's status), and
//! the agent answers a run it already ran with the report it kept, so a
//! report acknowledged by a leader that died before writing it is not lost
//! (docs/protocol.md).
//!
//! Everything an agent sends is bounded before it is kept: strings are cut
//! to a length that fits a status or a condition message, and a report keeps
//! at most [`MAX_CHECKS`] results. A status past etcd's size limit would
//! wedge its node.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use hv_proto::v1::agent_message::Payload;
use hv_proto::v1::coordinator_message::Payload as Down;
use hv_proto::v1::{
    AgentMessage, Capability, CheckConfig, CheckReport, CheckResult, CoordinatorMessage, HealthSignalKind,
    Hello, HostFacts, RunChecks,
};
use jiff::Timestamp;
use tokio::sync::{mpsc, oneshot};

use crate::api::bounded;
use crate::api::hypervisor::{
    CheckResultStatus, HostCapabilities, HugepageStatus, MachineStatus, NumaCellStatus,
};
use crate::health::{self, AgentView, Signal};
use crate::lifecycle;

/// The messages waiting for one agent's stream. Boxed: the channel keeps
/// blocks of 32 slots, and a slot the size of the message itself cost
/// every session about 6 KiB for a queue that is nearly always empty.
pub type Outbound = mpsc::Sender<Box<CoordinatorMessage>>;

/// Results kept of one check report.
pub const MAX_CHECKS: usize = 64;
/// Longest check message kept (bytes, cut at a character boundary).
pub const MAX_MESSAGE: usize = 1024;
/// Longest short string kept (names, versions, host names).
pub const MAX_SHORT: usize = 253;

/// Most Ceph client IPs kept of one report.
pub const MAX_CEPH_IPS: usize = 8;

/// The machine as `f` reports it, what is not well-formed left out: a
/// system UUID that is not one, an address that is not a host's IP (a
/// fencing blocklists what is kept here). Pure.
pub fn machine(f: &HostFacts) -> MachineStatus {
    let uuid = f.system_uuid.trim().to_ascii_lowercase();
    // Firmware that never set one: shared by many machines, it identifies none.
    let is_uuid = !crate::fence::placeholder_uuid(&uuid)
        && uuid.len() == 36
        && uuid
            .char_indices()
            .all(|(i, c)| if [8, 13, 18, 23].contains(&i) { c == '-' } else { c.is_ascii_hexdigit() });
    let mut ips: Vec<String> = f
        .ceph_client_ips
        .iter()
        .filter_map(|a| a.trim().parse::<std::net::IpAddr>().ok())
        .filter(|ip| !ip.is_unspecified() && !ip.is_multicast() && ip.to_string() != "255.255.255.255")
        .map(|ip| ip.to_string())
        .collect();
    ips.sort();
    ips.dedup();
    ips.truncate(MAX_CEPH_IPS);
    // A DNS name, as libvirt gives it: anything else names no machine.
    let name = f.hostname.trim();
    let is_name = !name.is_empty()
        && name.len() <= MAX_SHORT
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    MachineStatus {
        system_uuid: is_uuid.then_some(uuid),
        ceph_addresses: ips,
        hostname: is_name.then(|| name.to_string()),
        domains: None,
        capabilities: capabilities(f),
        guest_cpus: None,
    }
}

/// Most CPU flags and CPU models kept of one report.
pub const MAX_CPU_NAMES: usize = 256;

/// The host's CPU, software and hardware as `f` reports them, bounded,
/// with the traits they give; None when the report names no hypervisor
/// (libvirt was not read).
pub fn capabilities(f: &HostFacts) -> Option<HostCapabilities> {
    if f.hypervisor_type.trim().is_empty() && f.arch.trim().is_empty() {
        return None;
    }
    let short = |s: &str, max: usize| s.trim().chars().take(max).collect::<String>();
    let names = |v: &[String]| {
        let mut v: Vec<String> =
            v.iter().map(|n| n.trim().to_string()).filter(|n| !n.is_empty() && n.len() <= 64).collect();
        v.sort();
        v.dedup();
        v.truncate(MAX_CPU_NAMES);
        v
    };
    let hw = f.hardware.clone().unwrap_or_default();
    let mut hugepages: Vec<HugepageStatus> =
        hw.hugepages.iter().map(|p| HugepageStatus { size_kib: p.size_kib, total: p.total }).collect();
    hugepages.truncate(8);
    let mut caps = HostCapabilities {
        arch: short(&f.arch, 32),
        guest_arches: {
            let mut arches = names(&f.guest_arches);
            arches.retain(|a| a.len() <= 32);
            arches.truncate(16);
            arches
        },
        cpu_model: short(&f.cpu_model, 128),
        cpu_features: names(&f.cpu_features),
        cpu_models: hw.domain_capabilities.then(|| names(&hw.cpu_models)),
        hypervisor_type: short(&f.hypervisor_type, 32),
        hypervisor_version: short(&f.hypervisor_version, 32),
        libvirt_version: short(&f.libvirt_version, 32),
        amd_sev: hw.amd_sev,
        uefi_secure_boot: hw.uefi_secure_boot,
        sriov_nics: hw.pci_read.then_some(hw.sriov_nics),
        numa_cells: f
            .numa_cells
            .iter()
            .take(64)
            .map(|c| NumaCellStatus { cpus: c.cpus, memory_mib: c.memory_bytes >> 20 })
            .collect(),
        hugepages,
        traits: None,
    };
    let flags = hw.cpuinfo_read.then_some(hw.cpu_flags.as_slice());
    caps.traits = crate::lifecycle::host_traits::traits(&caps, flags).map(|t| t.into_iter().collect());
    Some(caps)
}

/// Most domain UUIDs kept of one report (far above what one host runs).
pub const MAX_DOMAINS: usize = 1024;

/// The well-formed UUIDs among `uuids`, sorted, deduplicated, at most
/// [`MAX_DOMAINS`]. Kept as numbers: 16 bytes a domain, on every node.
pub fn domain_ids<'a>(uuids: impl Iterator<Item = &'a str>) -> Vec<u128> {
    let mut ids: Vec<u128> = uuids.filter_map(parse_uuid).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.truncate(MAX_DOMAINS);
    ids
}

fn parse_uuid(s: &str) -> Option<u128> {
    let s = s.trim();
    let dashes = s.char_indices().filter(|(_, c)| *c == '-').map(|(i, _)| i).collect::<Vec<_>>();
    if s.len() != 36 || dashes != [8, 13, 18, 23] {
        return None;
    }
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u128::from_str_radix(&hex, 16).ok()
}

fn format_uuid(id: u128) -> String {
    let h = format!("{id:032x}");
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// The machine as the agent's facts and its last inventory report it.
fn machine_view(
    facts: Option<&HostFacts>,
    domains: Option<&[u128]>,
    guest_cpus: Option<&[crate::api::hypervisor::GuestCpuStatus]>,
) -> Option<MachineStatus> {
    if facts.is_none() && domains.is_none() {
        return None;
    }
    let mut m = facts.map(machine).unwrap_or_default();
    m.domains = domains.map(|ids| ids.iter().copied().map(format_uuid).collect());
    m.guest_cpus = guest_cpus.map(<[_]>::to_vec);
    Some(m)
}

struct Live {
    id: u64,
    tx: Outbound,
    /// Dropped to end the session when a newer one for the node replaces it.
    _close: oneshot::Sender<()>,
    /// (Hypervisor uid, run) asked of this session.
    sent_runs: HashSet<(String, u64)>,
    /// When the client certificate that opened it ends (None without TLS).
    certificate_end: Option<std::time::SystemTime>,
}

#[derive(Default)]
struct Node {
    live: Option<Live>,
    boot_id: String,
    acked: u64,
    agent_version: String,
    /// The agent checks bridge settings, not only presence.
    checks_bridge_settings: bool,
    last_seen: Option<Timestamp>,
    since: Option<Timestamp>,
    facts: Option<HostFacts>,
    checks: Option<CheckReport>,
    dropped: u64,
    /// Of the agent's running count of drops, how many this process has
    /// counted: None until its first heartbeat when this process first
    /// sees the agent (a new leader must not count again what the last one
    /// did), zero for an agent process that started since.
    drops_counted: Option<u64>,
    domains: Option<u32>,
    /// The UUIDs of those domains (well-formed ones, sorted, at most
    /// [`MAX_DOMAINS`]): what the host runs, for the machine check before an
    /// eviction (docs/lifecycle.md, "One Nova host, one machine").
    domain_ids: Option<Vec<u128>>,
    /// The guest CPUs of the last inventory's domains, grouped.
    guest_cpus: Option<Vec<crate::api::hypervisor::GuestCpuStatus>>,
    /// The agent's health signals that hold (docs/health.md).
    signals: BTreeMap<health::signal::Key, Signal>,
    /// Heartbeats in a row whose clock was off.
    skewed_beats: u32,
}

/// Sets (`Some`) or clears a signal of `n`; answers whether that changed
/// anything.
fn hold(n: &mut Node, node: &str, key: health::signal::Key, signal: Option<Signal>) -> bool {
    match signal {
        None => n.signals.remove(&key).is_some(),
        Some(new) => {
            if let Some(old) = n.signals.get_mut(&key) {
                // The same again (the agent re-sends what holds): its start stays.
                let same = (old.severity, &old.evidence) == (new.severity, &new.evidence);
                if same {
                    old.refreshed = new.refreshed;
                } else {
                    *old = Signal { since: old.since, ..new };
                }
                !same
            } else if !make_room(&mut n.signals, new.severity) {
                tracing::warn!(node, kind = %new.kind, "too many health signals held; dropped");
                false
            } else {
                tracing::info!(node, kind = %new.kind, subject = %new.subject, evidence = %new.evidence, "health signal");
                n.signals.insert(key, new);
                true
            }
        }
    }
}

/// Heartbeats in a row off by more than the skew allowed before it is said.
const SKEWED_BEATS: u32 = 3;

/// How long into a session heartbeats are not used for the clock.
const CLOCK_SETTLE: jiff::SignedDuration = jiff::SignedDuration::from_secs(5);

/// Signals held per node at most; more are dropped (and logged).
const MAX_SIGNALS: usize = 64;

/// Room for one more signal of `severity`: a critical one takes the place
/// of a warning; otherwise none is made when full.
fn make_room(held: &mut BTreeMap<health::signal::Key, Signal>, severity: health::Severity) -> bool {
    if held.len() < MAX_SIGNALS {
        return true;
    }
    let warning = held.iter().find(|(_, g)| g.severity == health::Severity::Warning).map(|(k, _)| k.clone());
    match warning {
        Some(k) if severity == health::Severity::Critical => held.remove(&k).is_some(),
        _ => false,
    }
}

/// Session bookkeeping for every node; cheap to share (`Arc`).
pub struct Registry {
    nodes: Mutex<HashMap<String, Node>>,
    next_id: AtomicU64,
    /// Node names whose Hypervisor should be reconciled now (connect,
    /// disconnect, a check report, new facts).
    changed: mpsc::UnboundedSender<String>,
    metrics: crate::metrics::AgentSessions,
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
        Registry {
            nodes: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            changed,
            metrics: Default::default(),
        }
    }

    /// Counts sessions and messages in `metrics` from now on.
    pub fn with_metrics(mut self, metrics: crate::metrics::AgentSessions) -> Registry {
        self.metrics = metrics;
        self
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<String, Node>) -> R) -> R {
        f(&mut crate::locked::lock(&self.nodes))
    }

    /// Registers a session for `node`, replacing (and thereby closing) any
    /// previous one. A new agent process (another boot id) starts its
    /// sequence again, so the acknowledged sequence resets.
    pub fn open(&self, hello: &Hello, tx: Outbound) -> Opened {
        self.open_until(hello, tx, None)
    }

    /// [`Registry::open`], for a session whose certificate ends at
    /// `certificate_end`.
    pub fn open_until(
        &self,
        hello: &Hello,
        tx: Outbound,
        certificate_end: Option<std::time::SystemTime>,
    ) -> Opened {
        let (node, boot_id) = (hello.node.as_str(), hello.boot_id.as_str());
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (close_tx, closed) = oneshot::channel();
        let (acked, replacing) = self.with(|nodes| {
            let n = nodes.entry(node.to_string()).or_default();
            let old = n.live.take();
            if let Some(old) = &old {
                tracing::warn!(
                    node,
                    old_session = old.id,
                    new_session = id,
                    "a second session replaces the first"
                );
            }
            if n.boot_id != boot_id {
                // A new agent process counts its drops from zero; one first
                // seen here may have counted some before.
                n.drops_counted = (!n.boot_id.is_empty()).then_some(0);
                n.boot_id = boot_id.to_string();
                n.acked = 0;
                n.dropped = 0;
                // A new agent process starts with no signal and sends again
                // what holds; nor is an earlier process's machine its own
                // until it says so (the Node may now be another machine).
                n.signals.clear();
                n.facts = None;
                n.domains = None;
                n.domain_ids = None;
                n.guest_cpus = None;
            }
            n.agent_version = bounded(&hello.agent_version, 64);
            n.checks_bridge_settings = hello.capabilities.contains(&(Capability::BridgeExpectations as i32));
            n.last_seen = Some(Timestamp::now());
            n.since = n.last_seen;
            n.live = Some(Live { id, tx, _close: close_tx, sent_runs: HashSet::new(), certificate_end });
            (n.acked, old.is_some())
        });
        self.metrics.opened(replacing);
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
            self.metrics.closed();
            let _ = self.changed.send(node.to_string());
        }
    }

    /// Takes in one message of session `id`. Answers the sequence to
    /// acknowledge, or None when the session is no longer the live one.
    pub fn receive(&self, node: &str, id: u64, msg: AgentMessage) -> Option<u64> {
        self.receive_at(node, id, msg, Timestamp::now())
    }

    fn receive_at(&self, node: &str, id: u64, msg: AgentMessage, now: Timestamp) -> Option<u64> {
        let mut notify = false;
        let ack = self.with(|nodes| {
            let n = nodes.get_mut(node)?;
            if n.live.as_ref().is_none_or(|l| l.id != id) {
                return None;
            }
            n.last_seen = Some(now);
            self.metrics.message(kind_of(msg.payload.as_ref()));
            if msg.seq != 0 && msg.seq <= n.acked {
                // A replay of something we hold: acknowledge again, apply once.
                return Some(n.acked);
            }
            match msg.payload {
                Some(Payload::Heartbeat(hb)) => {
                    // A running count since the agent started.
                    if let Some(counted) = n.drops_counted {
                        self.metrics.dropped(hb.dropped_messages.saturating_sub(counted));
                    }
                    n.drops_counted = Some(hb.dropped_messages.max(n.drops_counted.unwrap_or(0)));
                    n.dropped = hb.dropped_messages;
                    // Past the session's first moments (heartbeats queued
                    // while cut off arrive then, late by their wait).
                    let settled = n.since.is_some_and(|s| now.duration_since(s) > CLOCK_SETTLE);
                    let sent = msg.sent_at.and_then(|t| Timestamp::new(t.seconds, t.nanos).ok());
                    if let Some(sent) = sent.filter(|_| settled) {
                        // Three beats in a row: one late beat is a stall.
                        let (key, signal) = health::signal::clock_skew(sent, now);
                        n.skewed_beats = if signal.is_some() { n.skewed_beats.saturating_add(1) } else { 0 };
                        if signal.is_none() || n.skewed_beats >= SKEWED_BEATS {
                            notify = hold(n, node, key, signal);
                        }
                    }
                }
                Some(Payload::HostFacts(f)) => {
                    notify = n.facts.as_ref() != Some(&f);
                    n.facts = Some(f);
                }
                Some(Payload::Inventory(inv)) => {
                    n.domains = Some(u32::try_from(inv.domains.len()).unwrap_or(u32::MAX));
                    // Looked at now: a process's first report, or one with a
                    // domain the last lacked (a VM started or moved in: an
                    // eviction compares them); one with fewer, at the host's
                    // next look.
                    let ids = domain_ids(inv.domains.iter().map(|d| d.uuid.as_str()));
                    notify = n.domain_ids.as_ref().is_none_or(|old| ids.iter().any(|id| old.binary_search(id).is_err()));
                    n.domain_ids = Some(ids);
                    let cpus = super::guest_cpus::groups(&inv.domains);
                    notify |= n.guest_cpus.as_ref() != Some(&cpus);
                    n.guest_cpus = Some(cpus);
                }
                Some(Payload::CheckReport(r)) => {
                    tracing::info!(node, seq = msg.seq, run = r.run, checks = r.results.len(), "check report");
                    n.checks = Some(judged(r, n.checks_bridge_settings));
                    notify = true;
                }
                Some(Payload::DomainEvent(e)) => {
                    tracing::debug!(node, domain = %e.name, kind = e.kind, "domain event");
                }
                Some(Payload::Connectivity(c)) => {
                    tracing::info!(node, peer = %c.peer, connected = c.connected, message = %c.message, "agent connectivity");
                }
                Some(Payload::HealthSignal(hs)) => {
                    // The coordinator's own kind is not the agent's to set.
                    if hs.kind != HealthSignalKind::ClockSkew as i32 {
                        let (key, signal) = health::signal::apply(&hs, now);
                        notify = hold(n, node, key, signal);
                    }
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

    /// When the first of the live sessions' certificates ends.
    pub fn oldest_certificate_end(&self) -> Option<std::time::SystemTime> {
        self.with(|nodes| nodes.values().filter_map(|n| n.live.as_ref()?.certificate_end).min())
    }

    /// Whether `node`'s agent has a live session (what `view` says, without
    /// copying the rest: asked for every node on each metrics scrape).
    pub fn connected(&self, node: &str) -> bool {
        self.with(|nodes| nodes.get(node).is_some_and(|n| n.live.is_some()))
    }

    pub fn view(&self, node: &str) -> AgentView {
        self.with(|nodes| {
            let Some(n) = nodes.get(node) else {
                return AgentView::default();
            };
            let now = Timestamp::now();
            AgentView {
                connected: n.live.is_some(),
                agent_version: n.agent_version.clone(),
                last_seen: n.last_seen,
                since: n.since,
                libvirt_version: n
                    .facts
                    .as_ref()
                    .map(|f| bounded(&f.libvirt_version, 64))
                    .filter(|v| !v.is_empty()),
                hypervisor_version: n
                    .facts
                    .as_ref()
                    .map(|f| {
                        let v = format!("{} {}", f.hypervisor_type, f.hypervisor_version);
                        bounded(v.trim(), 64)
                    })
                    .filter(|v| !v.is_empty()),
                machine: machine_view(n.facts.as_ref(), n.domain_ids.as_deref(), n.guest_cpus.as_deref()),
                checks: n.checks.as_ref().map(report),
                checks_hypervisor: n.checks.as_ref().map(|r| r.hypervisor_uid.clone()).unwrap_or_default(),
                dropped: n.dropped,
                domains: n.domains,
                // What the agent has not said again lately is no longer believed.
                signals: n
                    .signals
                    .values()
                    .filter(|g| now.duration_since(g.refreshed) <= health::signal::STALE_AFTER)
                    .cloned()
                    .collect(),
            }
        })
    }

    /// Asks the node's agent to run checks for run `run` of the Hypervisor
    /// `hypervisor_uid`, once per run and session (the lifecycle asks on
    /// every reconcile while Testing). False when no session is live.
    pub fn run_checks(&self, node: &str, hypervisor_uid: &str, run: u64, config: CheckConfig) -> bool {
        let tx = self.with(|nodes| {
            let live = nodes.get_mut(node)?.live.as_mut()?;
            if !live.sent_runs.insert((hypervisor_uid.to_string(), run)) {
                return Some(None);
            }
            Some(Some(live.tx.clone()))
        });
        match tx {
            None => false,
            Some(None) => true,
            Some(Some(tx)) => {
                let msg = CoordinatorMessage {
                    payload: Some(Down::RunChecks(RunChecks {
                        run,
                        config: Some(config),
                        hypervisor_uid: hypervisor_uid.to_string(),
                    })),
                };
                tracing::info!(node, run, "asking the agent to run its checks");
                tx.try_send(Box::new(msg)).is_ok()
            }
        }
    }

    /// Ends every session (leadership lost, shutdown).
    pub fn close_all(&self) {
        self.with(|nodes| nodes.values_mut().for_each(|n| n.live = None));
        self.metrics.all_closed();
    }
}

/// A message's kind, for the metrics.
fn kind_of(payload: Option<&Payload>) -> &'static str {
    match payload {
        Some(Payload::Hello(_)) => "hello",
        Some(Payload::Heartbeat(_)) => "heartbeat",
        Some(Payload::HostFacts(_)) => "host_facts",
        Some(Payload::Inventory(_)) => "inventory",
        Some(Payload::CheckReport(_)) => "check_report",
        Some(Payload::DomainEvent(_)) => "domain_event",
        Some(Payload::Connectivity(_)) => "connectivity",
        Some(Payload::HealthSignal(_)) => "health_signal",
        None => "empty",
    }
}

/// The name of the check an agent without bridge-setting checks fails.
pub const AGENT_TOO_OLD: &str = "agent-checks-bridge-settings";

/// A report bounded to [`MAX_CHECKS`] results and, from an agent that
/// cannot check bridge settings, failed: it would pass a br-int in fail
/// mode standalone by its presence alone. Judged when it arrives, by the
/// agent that sent it.
fn judged(mut r: CheckReport, checks_bridge_settings: bool) -> CheckReport {
    r.results.truncate(MAX_CHECKS);
    if !checks_bridge_settings {
        r.results.truncate(MAX_CHECKS - 1);
        r.results.push(CheckResult {
            name: AGENT_TOO_OLD.into(),
            passed: false,
            message: "this agent checks bridges by presence only, not their fail mode, datapath, ports or \
                      external_ids; upgrade hv-agent"
                .into(),
            ..Default::default()
        });
    }
    r
}

fn report(r: &CheckReport) -> lifecycle::CheckReport {
    lifecycle::CheckReport { run: r.run, results: r.results.iter().map(result).collect() }
}

fn result(c: &CheckResult) -> CheckResultStatus {
    CheckResultStatus {
        name: bounded(&c.name, MAX_SHORT),
        passed: c.passed,
        message: bounded(&c.message, MAX_MESSAGE),
        duration_ms: c.duration.as_ref().map_or(0, |d| {
            let ms = d.seconds.saturating_mul(1000).saturating_add(i64::from(d.nanos / 1_000_000));
            u64::try_from(ms).unwrap_or(0)
        }),
        time: c.finished_at.as_ref().and_then(|t| {
            Timestamp::new(t.seconds, t.nanos).ok().map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time)
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hv_proto::v1::{CheckResult, HealthSeverity, HealthSignal, HealthSignalKind, Heartbeat};

    fn msg(seq: u64, payload: Payload) -> AgentMessage {
        AgentMessage { seq, sent_at: None, payload: Some(payload) }
    }

    fn report(run: u64) -> Payload {
        let ok = CheckResult { name: "x".into(), passed: true, ..Default::default() };
        Payload::CheckReport(CheckReport { run, results: vec![ok], hypervisor_uid: "uid-1".into() })
    }

    /// The Hello of a current agent.
    fn hello(node: &str, boot_id: &str, version: &str) -> Hello {
        Hello {
            node: node.into(),
            boot_id: boot_id.into(),
            agent_version: version.into(),
            capabilities: vec![Capability::Checks as i32, Capability::BridgeExpectations as i32],
            ..Default::default()
        }
    }

    fn registry() -> (Registry, mpsc::UnboundedReceiver<String>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Registry::new(tx), rx)
    }

    fn signal(kind: HealthSignalKind, subject: &str, active: bool, evidence: &str) -> Payload {
        Payload::HealthSignal(HealthSignal {
            kind: kind as i32,
            subject: subject.into(),
            active,
            severity: HealthSeverity::Critical as i32,
            evidence: evidence.into(),
            observed_at: None,
        })
    }

    /// Heartbeats say how far the agent's clock is from ours, once the
    /// session is past its first moments; an agent cannot set that signal.
    #[test]
    fn a_skewed_clock_is_seen_in_settled_heartbeats_and_only_there() {
        let (r, _changed) = registry();
        let (tx, _rx) = mpsc::channel(8);
        let s = r.open(&hello("n1", "boot-a", "1.0"), tx);
        let opened = Timestamp::now();
        let later = |secs: i64| opened.checked_add(jiff::SignedDuration::from_secs(secs)).unwrap_or(opened);
        let beat = |seq: u64, sent: Timestamp| AgentMessage {
            seq,
            sent_at: Some(prost_types::Timestamp { seconds: sent.as_second(), nanos: 0 }),
            payload: Some(Payload::Heartbeat(Default::default())),
        };
        let skewed = |r: &Registry| r.view("n1").signals.iter().any(|g| g.kind == "clock-skew");
        // Queued while cut off: a minute old, taken in right after the reconnect.
        r.receive_at("n1", s.id, beat(1, later(-60)), later(1));
        assert!(!skewed(&r), "not judged in the session's first moments");
        r.receive_at("n1", s.id, beat(2, later(-60)), later(10));
        r.receive_at("n1", s.id, beat(3, later(-59)), later(11));
        assert!(!skewed(&r), "two late beats may be a stall");
        r.receive_at("n1", s.id, beat(4, later(-58)), later(12));
        assert!(skewed(&r), "a minute behind, three beats in a row");
        r.receive_at("n1", s.id, beat(5, later(13)), later(13));
        assert!(!skewed(&r), "in step again");
        let forged = HealthSignal {
            kind: HealthSignalKind::ClockSkew as i32,
            active: true,
            evidence: "forged".into(),
            ..Default::default()
        };
        r.receive_at("n1", s.id, msg(6, Payload::HealthSignal(forged)), later(14));
        assert!(!skewed(&r), "the agent cannot set the coordinator's own signal");
    }

    #[test]
    fn signals_hold_until_ended_repeats_change_nothing_and_a_new_boot_forgets_them() {
        let (r, mut changed) = registry();
        let (tx, _rx) = mpsc::channel(8);
        let s = r.open(&hello("n1", "boot-a", "1.0"), tx);
        while changed.try_recv().is_ok() {}
        let io = HealthSignalKind::DomainIoError;
        r.receive("n1", s.id, msg(1, signal(io, "u1", true, "paused")));
        assert_eq!(changed.try_recv().ok().as_deref(), Some("n1"), "a new signal wakes the reconcile");
        let first = r.view("n1").signals;
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].kind.as_str(), first[0].subject.as_str()), ("domain-io-error", "u1"));
        r.receive("n1", s.id, msg(2, signal(io, "u1", true, "paused")));
        assert!(changed.try_recv().is_err(), "the same again is no news");
        assert_eq!(r.view("n1").signals[0].since, first[0].since);
        for i in 0..100 {
            r.receive("n1", s.id, msg(3 + i, signal(io, &format!("v{i}"), true, "x")));
        }
        assert_eq!(r.view("n1").signals.len(), MAX_SIGNALS, "bounded");
        let warn = Payload::HealthSignal(HealthSignal {
            kind: HealthSignalKind::LoadHigh as i32,
            active: true,
            severity: HealthSeverity::Warning as i32,
            ..Default::default()
        });
        r.receive("n1", s.id, msg(150, warn));
        assert!(r.view("n1").signals.iter().all(|g| g.kind != "load-high"), "no room for a warning");
        r.receive("n1", s.id, msg(200, signal(io, "u1", false, "")));
        assert!(r.view("n1").signals.iter().all(|g| g.subject != "u1"), "ended");
        let (tx, _rx) = mpsc::channel(8);
        let _again = r.open(&hello("n1", "boot-a", "1.0"), tx);
        assert_eq!(r.view("n1").signals.len(), MAX_SIGNALS - 1, "a reconnect of the same process keeps them");
        let (tx, _rx) = mpsc::channel(8);
        let _new = r.open(&hello("n1", "boot-b", "1.0"), tx);
        assert!(r.view("n1").signals.is_empty(), "a new agent process starts with none");
    }

    /// What the metrics count of sessions and drops: a replaced session is
    /// no second live one; an agent first seen by this process (a new
    /// leader's) brings a running count of drops another process counted,
    /// so only what it drops from then on is counted; a restarted agent's
    /// count starts at zero and is counted whole.
    #[test]
    fn sessions_and_outbox_drops_are_counted_once() {
        let (tx, _) = mpsc::unbounded_channel();
        let mut reg = prometheus_client::registry::Registry::default();
        let metrics = crate::metrics::AgentSessions::register_into(&mut reg);
        let r = Registry::new(tx).with_metrics(metrics);
        let text = || {
            let mut s = String::new();
            prometheus_client::encoding::text::encode(&mut s, &reg).unwrap();
            s
        };
        let has = |line: &str| text().lines().any(|l| l == line);
        let beat =
            |dropped| Payload::Heartbeat(Heartbeat { dropped_messages: dropped, ..Default::default() });
        let (tx, _rx) = mpsc::channel(8);
        let s = r.open(&hello("n1", "boot-a", "1.0"), tx);
        r.receive("n1", s.id, msg(0, beat(7)));
        assert!(has("hv_coordinator_agent_outbox_dropped_total 0"), "counted by another leader: {}", text());
        r.receive("n1", s.id, msg(0, beat(9)));
        assert!(has("hv_coordinator_agent_outbox_dropped_total 2"), "{}", text());
        let (tx, _rx) = mpsc::channel(8);
        let again = r.open(&hello("n1", "boot-a", "1.0"), tx);
        r.receive("n1", again.id, msg(0, beat(9)));
        assert!(has("hv_coordinator_agent_outbox_dropped_total 2"), "a reconnect counts nothing again");
        assert!(
            has("hv_coordinator_agent_sessions 1") && has("hv_coordinator_agent_sessions_replaced_total 1")
        );
        r.close("n1", s.id);
        assert!(has("hv_coordinator_agent_sessions 1"), "the replaced session's end changes nothing");
        let (tx, _rx) = mpsc::channel(8);
        let restarted = r.open(&hello("n1", "boot-b", "1.0"), tx);
        r.receive("n1", restarted.id, msg(0, beat(3)));
        assert!(has("hv_coordinator_agent_outbox_dropped_total 5"), "a new process's drops: {}", text());
        assert!(has("hv_coordinator_agent_messages_total{kind=\"heartbeat\"} 4"), "{}", text());
        r.close("n1", restarted.id);
        assert!(has("hv_coordinator_agent_sessions 0"), "{}", text());
    }

    #[test]
    fn a_second_session_replaces_the_first_and_the_first_goes_quiet() {
        let (r, mut changed) = registry();
        let (tx1, _rx1) = mpsc::channel(8);
        let mut first = r.open(&hello("n1", "boot-a", "1.0"), tx1);
        assert!(matches!(first.closed.try_recv(), Err(oneshot::error::TryRecvError::Empty)));
        let (tx2, _rx2) = mpsc::channel(8);
        let second = r.open(&hello("n1", "boot-a", "1.0"), tx2);
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
        let s = r.open(&hello("n1", "boot-a", "1.0"), tx);
        assert_eq!(r.receive("n1", s.id, msg(5, report(7))), Some(5));
        assert_eq!(r.receive("n1", s.id, msg(4, report(1))), Some(5), "an old message changes nothing");
        assert_eq!(r.view("n1").checks.map(|c| c.run), Some(7));
        let hb = Payload::Heartbeat(Heartbeat { dropped_messages: 3, ..Default::default() });
        assert_eq!(r.receive("n1", s.id, msg(6, hb)), Some(6));
        assert_eq!(r.view("n1").dropped, 3);

        let (tx, _rx) = mpsc::channel(8);
        assert_eq!(r.open(&hello("n1", "boot-a", "1.0"), tx).acked, 6, "same process reconnecting: resume");
        let (tx, _rx) = mpsc::channel(8);
        assert_eq!(
            r.open(&hello("n1", "boot-b", "1.0"), tx).acked,
            0,
            "a restarted agent numbers from 1 again"
        );
    }

    #[test]
    fn checks_are_sent_once_per_run_and_session() {
        let (r, _changed) = registry();
        assert!(!r.run_checks("n1", "uid-1", 1, CheckConfig::default()), "no session, nothing sent");
        let (tx, mut rx) = mpsc::channel(8);
        r.open(&hello("n1", "boot-a", "1.0"), tx);
        assert!(r.run_checks("n1", "uid-1", 1, CheckConfig::default()));
        assert!(r.run_checks("n1", "uid-1", 1, CheckConfig::default()));
        assert!(r.run_checks("n1", "uid-1", 2, CheckConfig::default()));
        let mut runs = Vec::new();
        while let Ok(m) = rx.try_recv() {
            if let Some(Down::RunChecks(rc)) = m.payload {
                runs.push(rc.run);
            }
        }
        assert_eq!(runs, vec![1, 2]);
        assert!(r.run_checks("n1", "uid-2", 1, CheckConfig::default()), "run 1 of a Hypervisor created anew");
        let again = rx.try_recv().ok().and_then(|m| m.payload);
        assert!(
            matches!(again, Some(Down::RunChecks(rc)) if rc.hypervisor_uid == "uid-2" && rc.run == 1),
            "sent again, for the new Hypervisor"
        );
    }

    #[test]
    fn a_report_names_the_hypervisor_it_answers_and_an_old_agent_fails_its_checks() {
        let (r, _changed) = registry();
        let (tx, _rx) = mpsc::channel(8);
        let s = r.open(&hello("n1", "boot-a", "1.0"), tx);
        r.receive("n1", s.id, msg(1, report(1)));
        let v = r.view("n1");
        assert_eq!(v.checks_hypervisor, "uid-1");
        assert!(v.checks.is_some_and(|c| c.results.iter().all(|c| c.passed)));

        let (tx, _rx) = mpsc::channel(8);
        let old = Hello { capabilities: vec![Capability::Checks as i32], ..hello("n1", "boot-b", "0.9") };
        let s = r.open(&old, tx);
        r.receive("n1", s.id, msg(1, report(1)));
        let checks = r.view("n1").checks.unwrap_or_else(|| panic!("no report"));
        let failed: Vec<&str> =
            checks.results.iter().filter(|c| !c.passed).map(|c| c.name.as_str()).collect();
        assert_eq!(failed, vec![AGENT_TOO_OLD]);
    }

    #[test]
    fn a_check_duration_at_the_edge_of_i64_does_not_overflow() {
        let c = CheckResult {
            duration: Some(prost_types::Duration { seconds: i64::MAX, nanos: 999_999_999 }),
            ..Default::default()
        };
        assert_eq!(result(&c).duration_ms, u64::try_from(i64::MAX).unwrap_or(0));
        let negative = CheckResult {
            duration: Some(prost_types::Duration { seconds: i64::MIN, nanos: -999_999_999 }),
            ..Default::default()
        };
        assert_eq!(result(&negative).duration_ms, 0);
    }

    #[test]
    fn what_an_agent_sends_is_bounded_before_it_is_kept() {
        let (r, _changed) = registry();
        let (tx, _rx) = mpsc::channel(8);
        let s = r.open(&hello("n1", "boot-a", &"v".repeat(10_000)), tx);
        let huge = CheckResult {
            name: "n".repeat(5_000),
            passed: false,
            message: "é".repeat(100_000),
            ..Default::default()
        };
        let many =
            Payload::CheckReport(CheckReport { run: 1, results: vec![huge; 1_000], ..Default::default() });
        assert_eq!(r.receive("n1", s.id, msg(1, many)), Some(1));
        let facts = Payload::HostFacts(HostFacts {
            hostname: "h".repeat(100_000),
            libvirt_version: "9".repeat(500),
            ..Default::default()
        });
        assert_eq!(r.receive("n1", s.id, msg(2, facts)), Some(2));
        let v = r.view("n1");
        let checks = v.checks.unwrap_or_else(|| panic!("no report"));
        assert_eq!(checks.results.len(), MAX_CHECKS);
        assert!(
            checks
                .results
                .iter()
                .all(|c| c.name.len() <= MAX_SHORT + 3 && c.message.len() <= MAX_MESSAGE + 3)
        );
        assert!(v.agent_version.len() <= 67);
        assert_eq!(v.machine.and_then(|m| m.hostname), None, "not a host name");
        assert!(v.libvirt_version.unwrap_or_default().len() <= 67);
        assert_eq!(bounded("ab", 5), "ab");
        assert_eq!(bounded("éé", 3), "é…", "cut at a character boundary");
    }

    #[test]
    fn a_new_agent_process_speaks_for_its_machine_afresh() {
        let (r, _changed) = registry();
        let say = |r: &Registry, id: u64, seq: u64, payload: Payload| {
            r.receive("n1", id, AgentMessage { seq, sent_at: None, payload: Some(payload) });
        };
        let facts = Payload::HostFacts(HostFacts { hostname: "compute-7".into(), ..Default::default() });
        let domains = Payload::Inventory(hv_proto::v1::Inventory {
            domains: vec![hv_proto::v1::Domain {
                uuid: "6695eb01-f6a4-8304-79aa-97f2502e193f".into(),
                ..Default::default()
            }],
        });
        let (tx, _rx) = mpsc::channel(8);
        let s = r.open(&hello("n1", "boot-a", "1.0"), tx);
        say(&r, s.id, 1, facts);
        say(&r, s.id, 2, domains);
        let m = r.view("n1").machine.unwrap();
        assert_eq!((m.hostname.as_deref(), m.domains.map(|d| d.len())), (Some("compute-7"), Some(1)));
        assert_eq!(r.view("n1").domains, Some(1));
        // The same process again: what it said stands.
        let (tx, _rx) = mpsc::channel(8);
        r.open(&hello("n1", "boot-a", "1.0"), tx);
        assert!(r.view("n1").machine.is_some());
        // Another process (the Node may be another machine now, or the
        // machine rebooted): nothing until it says, its count of domains
        // neither (a host powered off while empty may not be now).
        let (tx, _rx) = mpsc::channel(8);
        r.open(&hello("n1", "boot-b", "1.0"), tx);
        assert_eq!(r.view("n1").machine, None);
        assert_eq!(r.view("n1").domains, None);
    }

    #[test]
    fn domain_uuids_are_kept_as_numbers_and_given_back_in_their_own_form() {
        let a = "6695eb01-f6a4-8304-79aa-97f2502e193f";
        let b = "0000000A-0000-4000-8000-00000000000B";
        let ids = domain_ids([b, a, a, "not-a-uuid", "6695eb01f6a4830479aa97f2502e193f", ""].into_iter());
        assert_eq!(ids.len(), 2);
        let m = machine_view(None, Some(&ids), None).unwrap();
        assert_eq!(m.domains.unwrap(), ["0000000a-0000-4000-8000-00000000000b", a]);
        let many: Vec<String> = (0..2000u32).map(|i| format!("00000000-0000-0000-0000-{i:012}")).collect();
        assert_eq!(domain_ids(many.iter().map(String::as_str)).len(), MAX_DOMAINS);
        assert_eq!(machine_view(None, None, None), None);
        let facts = HostFacts { hostname: "compute-7".into(), ..Default::default() };
        let m = machine_view(Some(&facts), None, None).unwrap();
        assert_eq!((m.hostname.as_deref(), m.domains), (Some("compute-7"), None));
    }

    #[test]
    fn a_machine_is_kept_as_reported_its_malformed_parts_left_out() {
        let f = HostFacts {
            system_uuid: " 4C4C4544-0042-3510-8051-B4C04F4E3332\n".into(),
            ceph_client_ips: vec!["10.0.0.7".into(), "10.0.0.7".into(), "fd00::7".into()],
            hostname: " compute-7.example.com\n".into(),
            ..Default::default()
        };
        let m = machine(&f);
        assert_eq!(m.hostname.as_deref(), Some("compute-7.example.com"));
        assert_eq!(m.system_uuid.as_deref(), Some("4c4c4544-0042-3510-8051-b4c04f4e3332"));
        assert_eq!(m.ceph_addresses, ["10.0.0.7", "fd00::7"]);
        for placeholder in [
            "00000000-0000-0000-0000-000000000000",
            "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF",
            "03000200-0400-0500-0006-000700080009",
        ] {
            let f = HostFacts { system_uuid: placeholder.into(), ..Default::default() };
            assert_eq!(machine(&f).system_uuid, None, "{placeholder}");
        }
        let bad = HostFacts {
            system_uuid: "Not Settable".into(),
            ceph_client_ips: vec![
                "0.0.0.0".into(),
                "224.0.0.1".into(),
                "255.255.255.255".into(),
                "compute-2".into(),
                "10.0.0.8:6800/1".into(),
            ],
            hostname: "compute 7; rm -rf".into(),
            ..Default::default()
        };
        assert_eq!(machine(&bad), MachineStatus::default());
        let many = HostFacts {
            ceph_client_ips: (1..=20).map(|i| format!("10.0.1.{i}")).collect(),
            ..Default::default()
        };
        assert_eq!(machine(&many).ceph_addresses.len(), MAX_CEPH_IPS);
        // A report without a part keeps the part known.
        let old = MachineStatus {
            system_uuid: Some("u".into()),
            ceph_addresses: vec!["10.0.0.7".into()],
            hostname: Some("compute-7".into()),
            domains: Some(vec![]),
            capabilities: Some(HostCapabilities { arch: "x86_64".into(), ..Default::default() }),
            guest_cpus: Some(vec![]),
        };
        assert_eq!(MachineStatus::updated(Some(&old), &MachineStatus::default()), old);
        let moved = MachineStatus { ceph_addresses: vec!["10.0.0.9".into()], ..Default::default() };
        assert_eq!(MachineStatus::updated(Some(&old), &moved).ceph_addresses, ["10.0.0.9"]);
    }

    #[test]
    fn capabilities_bounded_with_the_traits_they_give() {
        use hv_proto::v1::{HostHardware, HugepagePool};
        assert_eq!(
            capabilities(&HostFacts { hostname: "h".into(), ..Default::default() }),
            None,
            "no libvirt read"
        );
        let f = HostFacts {
            arch: "x86_64".into(),
            hypervisor_type: "QEMU".into(),
            hypervisor_version: "8.2.2".into(),
            cpu_model: "m".repeat(300),
            cpu_features: ["pdpe1gb", "avx2", "pdpe1gb", "", &"x".repeat(65)]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            hardware: Some(HostHardware {
                sriov_nics: 2,
                pci_read: true,
                cpu_flags: vec!["pdpe1gb".into(), "avx2".into()],
                cpuinfo_read: true,
                hugepages: vec![HugepagePool { size_kib: 2048, total: 10 }; 20],
                ..Default::default()
            }),
            ..Default::default()
        };
        let c = capabilities(&f).unwrap_or_default();
        assert_eq!(c.cpu_model.chars().count(), 128);
        assert_eq!(c.cpu_features, ["avx2", "pdpe1gb"], "sorted, once, no blank or overlong name");
        assert_eq!(c.cpu_models, None, "no domain capabilities read: unknown, not none");
        assert_eq!(c.hugepages.len(), 8);
        assert_eq!(c.traits, Some(vec!["HW_CPU_X86_PDPE1GB".into(), "HW_NIC_SRIOV".into()]));
        let unread = HostFacts { hardware: Some(HostHardware { sriov_nics: 2, ..Default::default() }), ..f };
        let c = capabilities(&unread).unwrap_or_default();
        assert_eq!((c.sriov_nics, c.traits), (None, None), "not read: not known, nothing removed for it");
    }
}
