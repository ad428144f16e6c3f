//! What a host's health adds up to (docs/health.md): pure, from what each
//! independent source says, into one of Healthy, Degraded, Unreachable and
//! Failed, with the evidence.
//!
//! The sources are independent channels to the host: the agent's stream
//! (our gRPC), the kubelet (the Node's `Ready` condition and the kubelet's
//! Lease, through the Kubernetes API) and nova-compute (its service state,
//! through Nova's service group), and the host's BMC where it has one (read
//! only while the agent's stream is gone). A lost channel says "we cannot
//! see it", not "it is dead". A kubelet that is alive (its Lease renewed
//! lately, or the Node Ready where the Lease is not read) is a veto: such a
//! host is never Failed, whatever else is lost, because software that dies
//! on a live host is not a dead host. Failed needs the agent's stream lost
//! and the kubelet not alive, and then the kubelet's channel lost too, or
//! the BMC reading power off (twice, by the shell) without waiting for the
//! kubelet's grace. The agent's own signals say how sick a host it can
//! still see is.

use jiff::{SignedDuration, Timestamp};

use super::signal::{Severity, Signal};
use crate::api::hypervisor::{HealthState, HealthStatus};

/// The agent's stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentSource {
    Connected,
    /// No session; since when, if this process saw one end.
    Gone {
        since: Option<Timestamp>,
    },
}

/// The Node's `Ready` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeSource {
    Ready,
    /// False or Unknown (the kubelet stopped posting), since its last transition.
    NotReady {
        since: Option<Timestamp>,
    },
    Absent,
}

/// Nova's compute service state (its service group's heartbeat).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NovaSource {
    Up,
    Down,
    /// `forced_down` set (by an operator or a fencing): Nova treats it as down.
    ForcedDown,
    /// Not registered, or not read yet.
    Unknown,
}

/// The host's power as its BMC reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerSource {
    On,
    Off,
    /// No BMC, not read (the agent talks), or not readable.
    Unknown,
}

/// The kubelet's Lease (`kube-node-lease/<node>`): when it was last
/// renewed, and for how long a renewal holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    pub renewed: Timestamp,
    pub duration: SignedDuration,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Sources<'a> {
    pub agent: AgentSource,
    pub node: NodeSource,
    /// The kubelet's Lease, when read (it is read while the agent's stream
    /// is gone): None, the Node's `Ready` condition speaks for the kubelet.
    pub lease: Option<Heartbeat>,
    pub nova: NovaSource,
    pub power: PowerSource,
    /// The agent's active signals (held from before when it is gone).
    pub signals: &'a [Signal],
}

/// Whether the coordinator itself can see what it judges with: without
/// Nova (or the Kubernetes API, which the lease guard already requires) a
/// host looks lost because we are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnView {
    Clear,
    /// What we cannot reach, and why.
    Blind(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthPolicy {
    /// How long the Node may be not Ready before that counts: the kubelet
    /// misses a few posts during a restart.
    pub node_grace: SignedDuration,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        HealthPolicy { node_grace: SignedDuration::from_secs(60) }
    }
}

/// The verdict and what it rests on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assessment {
    pub state: HealthState,
    /// One line per source or signal that is not well, most severe first.
    pub evidence: Vec<String>,
    /// Set when the coordinator could not judge: the state is the previous one.
    pub held: Option<String>,
    /// Degraded by a signal that asks for the host to be emptied
    /// ([`Signal::empties`]).
    pub empties: bool,
}

/// The kubelet, as its Node and its Lease say.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kubelet {
    /// Its Lease renewed within half its duration (it renews every quarter,
    /// so at most one renewal missed), or, its Lease not read, its Node
    /// Ready: it runs, and so does the host.
    Alive,
    /// Neither alive nor lost yet: not Ready for less than the grace, a
    /// Lease aging, or no Node.
    Quiet,
    /// Its channel lost, with the evidence.
    Lost(String),
}

/// A time, not an age: the evidence (and the status) stays the same from
/// one reconcile to the next.
fn ago(t: Option<Timestamp>) -> String {
    t.map(|t| format!(" since {}", second(t))).unwrap_or_default()
}

fn kubelet(s: &Sources<'_>, policy: &HealthPolicy, now: Timestamp) -> Kubelet {
    let fresh = s.lease.is_some_and(|h| now.duration_since(h.renewed) < h.duration / 2);
    let stale = s.lease.filter(|h| now.duration_since(h.renewed) >= h.duration.max(policy.node_grace));
    match (s.node, s.lease) {
        _ if fresh => Kubelet::Alive,
        (NodeSource::Ready, None) => Kubelet::Alive,
        (NodeSource::NotReady { since }, _)
            if since.is_none_or(|t| now.duration_since(t) >= policy.node_grace) =>
        {
            Kubelet::Lost(format!("Node: not Ready{}", ago(since)))
        }
        (NodeSource::Ready | NodeSource::NotReady { .. }, _) => match stale {
            Some(h) => Kubelet::Lost(format!("kubelet: Lease not renewed{}", ago(Some(h.renewed)))),
            None => Kubelet::Quiet,
        },
        // A deleted Node is the lifecycle's news (termination), and it takes
        // the agent's pod with it: counting it would make one act Failed.
        (NodeSource::Absent, _) => Kubelet::Quiet,
    }
}

/// Whether the host's kubelet is alive ([`Kubelet::Alive`]): the veto on
/// Failed, and what stops a fencing under way (docs/fencing.md).
pub fn kubelet_alive(s: &Sources<'_>, policy: &HealthPolicy, now: Timestamp) -> bool {
    kubelet(s, policy, now) == Kubelet::Alive
}

/// The channels that are lost, each with its evidence, and whether the
/// host may be Failed: its agent's stream gone, its kubelet not alive, and
/// the kubelet's channel or the host's power lost.
fn lost(s: &Sources<'_>, policy: &HealthPolicy, now: Timestamp) -> (bool, Vec<String>) {
    let mut out = Vec::new();
    let agent_gone = matches!(s.agent, AgentSource::Gone { .. });
    if let AgentSource::Gone { since } = s.agent {
        out.push(format!("agent: no session{}", ago(since)));
    }
    let kubelet = kubelet(s, policy, now);
    if let Kubelet::Lost(why) = &kubelet {
        out.push(why.clone());
    }
    // `forced_down` is someone's assertion (an operator's, a fencing's), not
    // an observation of the host: it is shown, never counted.
    if s.nova == NovaSource::Down {
        out.push("Nova: nova-compute down".into());
    }
    let power_off = s.power == PowerSource::Off && agent_gone;
    if power_off {
        out.push("BMC: power off".into());
    }
    let dead = agent_gone && (matches!(kubelet, Kubelet::Lost(_)) || power_off && kubelet != Kubelet::Alive);
    if agent_gone && kubelet == Kubelet::Alive && (s.nova == NovaSource::Down || power_off) {
        // No time: a live kubelet's renewal moves at every look, and the
        // evidence of a steady verdict must not rewrite the status.
        out.push(match s.lease {
            Some(_) => "kubelet: alive, its Lease renewed lately (never Failed while it is)".into(),
            None => "kubelet: alive, its Node Ready (never Failed while it is)".into(),
        });
    }
    (dead, out)
}

fn second(t: Timestamp) -> Timestamp {
    t.round(jiff::Unit::Second).unwrap_or(t)
}

/// Evidence lines kept at most; the rest are counted in one more line.
pub const MAX_EVIDENCE: usize = 10;

/// When the verdict may change with no news: the Node's grace running out,
/// or the kubelet's Lease ceasing to be fresh or turning stale.
pub fn recheck_in(s: &Sources<'_>, policy: &HealthPolicy, now: Timestamp) -> Option<SignedDuration> {
    let node = match s.node {
        NodeSource::NotReady { since: Some(t) } if now.duration_since(t) < policy.node_grace => {
            Some(policy.node_grace - now.duration_since(t))
        }
        _ => None,
    };
    let lease = s.lease.and_then(|h| {
        let age = now.duration_since(h.renewed);
        [h.duration / 2, h.duration.max(policy.node_grace)]
            .into_iter()
            .map(|at| at - age)
            .find(|d| d.is_positive())
    });
    node.into_iter().chain(lease).min()
}

/// Pure: the health of a host from its sources. `previous` is what status
/// says now; it stands when the coordinator is blind.
pub fn assess(
    s: &Sources<'_>,
    own: &OwnView,
    previous: Option<&HealthStatus>,
    policy: &HealthPolicy,
    now: Timestamp,
) -> Assessment {
    if let OwnView::Blind(why) = own {
        return Assessment {
            state: previous.map(|p| p.state).unwrap_or_default(),
            evidence: previous.map(|p| p.evidence.clone()).unwrap_or_default(),
            held: Some(format!("not judged: the coordinator {why}")),
            empties: false,
        };
    }
    let agent_gone = matches!(s.agent, AgentSource::Gone { .. });
    let (dead, mut evidence) = lost(s, policy, now);
    let mut critical: Vec<&Signal> = s.signals.iter().filter(|g| g.severity == Severity::Critical).collect();
    critical.sort_by(|a, b| (&a.kind, &a.subject).cmp(&(&b.kind, &b.subject)));
    let state = if dead {
        HealthState::Failed
    } else if !evidence.is_empty() {
        HealthState::Unreachable
    } else if !critical.is_empty() {
        HealthState::Degraded
    } else {
        HealthState::Healthy
    };
    let mut warnings: Vec<&Signal> = s.signals.iter().filter(|g| g.severity != Severity::Critical).collect();
    warnings.sort_by(|a, b| (&a.kind, &a.subject).cmp(&(&b.kind, &b.subject)));
    if s.nova == NovaSource::ForcedDown {
        evidence.push("Nova: nova-compute forced down (an assertion, not counted)".into());
    }
    if s.power == PowerSource::Off && !agent_gone {
        evidence.push(
            "BMC: reports power off while the agent talks (not counted): is spec.fencing.bmc this host's?"
                .into(),
        );
    }
    evidence.extend(critical.iter().chain(&warnings).map(|g| signal_line(g)));
    if evidence.len() > MAX_EVIDENCE {
        let more = evidence.len() - (MAX_EVIDENCE - 1);
        evidence.truncate(MAX_EVIDENCE - 1);
        evidence.push(format!("… and {more} more"));
    }
    let empties = state == HealthState::Degraded && critical.iter().any(|g| g.empties);
    Assessment { state, evidence, held: None, empties }
}

fn signal_line(g: &Signal) -> String {
    let severity = match g.severity {
        Severity::Critical => "critical",
        Severity::Warning => "warning",
    };
    let subject = if g.subject.is_empty() { String::new() } else { format!(" {}", g.subject) };
    format!("{}{subject} ({severity}): {}", g.kind, g.evidence)
}

/// The status to write: `since` moves only when the state changes, and
/// not between Unreachable and Failed: it says since when the host is
/// lost, which the grace before disabling it is measured from (a kubelet
/// flapping between Ready and not must not restart it).
pub fn next_status(previous: Option<&HealthStatus>, a: &Assessment, now: Timestamp) -> HealthStatus {
    let lost = |s: HealthState| matches!(s, HealthState::Unreachable | HealthState::Failed);
    let since = match previous {
        Some(p) if p.state == a.state || (lost(p.state) && lost(a.state)) => p.since.clone(),
        _ => Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
    };
    HealthStatus { state: a.state, since, evidence: a.evidence.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_800_000_000;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(T0 + secs).unwrap_or_default()
    }

    fn signal(kind: &str, severity: Severity) -> Signal {
        Signal {
            kind: kind.into(),
            subject: String::new(),
            severity,
            evidence: format!("{kind} seen"),
            since: at(0),
            refreshed: at(0),
            empties: true,
        }
    }

    fn judge(agent: AgentSource, node: NodeSource, nova: NovaSource, signals: &[Signal]) -> Assessment {
        let s = Sources { agent, node, lease: None, nova, power: PowerSource::Unknown, signals };
        assess(&s, &OwnView::Clear, None, &HealthPolicy::default(), at(600))
    }

    const GONE: AgentSource = AgentSource::Gone { since: Some(Timestamp::constant(T0 + 300, 0)) };
    const NOT_READY_LONG: NodeSource = NodeSource::NotReady { since: Some(Timestamp::constant(T0, 0)) };
    const NOT_READY_NOW: NodeSource = NodeSource::NotReady { since: Some(Timestamp::constant(T0 + 590, 0)) };

    #[test]
    fn a_signal_that_does_not_empty_degrades_without_asking_to_empty() {
        let dependency = Signal { empties: false, ..signal("dependency-not-ready", Severity::Critical) };
        let up = AgentSource::Connected;
        let a = judge(up, NodeSource::Ready, NovaSource::Up, std::slice::from_ref(&dependency));
        assert_eq!((a.state, a.empties), (HealthState::Degraded, false));
        let both = [dependency, signal("root-read-only", Severity::Critical)];
        let a = judge(up, NodeSource::Ready, NovaSource::Up, &both);
        assert_eq!((a.state, a.empties), (HealthState::Degraded, true), "the host's own fault empties it");
        let warning = [signal("load", Severity::Warning)];
        assert!(!judge(up, NodeSource::Ready, NovaSource::Up, &warning).empties);
    }

    /// Each row: the sources, and the state they add up to.
    #[test]
    fn the_table() {
        use AgentSource::Connected as Up;
        use HealthState::*;
        let crit = [signal("domain-io-error", Severity::Critical)];
        let warn = [signal("load-high", Severity::Warning)];
        let rows: Vec<(AgentSource, NodeSource, NovaSource, &[Signal], HealthState)> = vec![
            (Up, NodeSource::Ready, NovaSource::Up, &[], Healthy),
            (Up, NodeSource::Ready, NovaSource::Unknown, &[], Healthy),
            (Up, NodeSource::Ready, NovaSource::Up, &warn, Healthy),
            (Up, NodeSource::Ready, NovaSource::Up, &crit, Degraded),
            (Up, NOT_READY_NOW, NovaSource::Up, &[], Healthy),
            (Up, NOT_READY_LONG, NovaSource::Up, &[], Unreachable),
            (Up, NodeSource::Absent, NovaSource::Up, &[], Healthy),
            (Up, NodeSource::Ready, NovaSource::Down, &[], Unreachable),
            (Up, NodeSource::Ready, NovaSource::ForcedDown, &[], Healthy),
            (Up, NodeSource::Ready, NovaSource::ForcedDown, &crit, Degraded),
            (Up, NOT_READY_LONG, NovaSource::Down, &crit, Unreachable),
            (GONE, NodeSource::Ready, NovaSource::Up, &[], Unreachable),
            (GONE, NodeSource::Ready, NovaSource::Unknown, &[], Unreachable),
            (GONE, NodeSource::Ready, NovaSource::Up, &crit, Unreachable),
            (GONE, NOT_READY_NOW, NovaSource::Up, &[], Unreachable),
            (GONE, NOT_READY_LONG, NovaSource::Up, &[], Failed),
            (GONE, NodeSource::Absent, NovaSource::Up, &[], Unreachable),
            // The kubelet alive (its Node Ready): never Failed.
            (GONE, NodeSource::Ready, NovaSource::Down, &[], Unreachable),
            (GONE, NOT_READY_NOW, NovaSource::Down, &[], Unreachable),
            (GONE, NodeSource::Absent, NovaSource::Down, &[], Unreachable),
            (GONE, NodeSource::Ready, NovaSource::ForcedDown, &[], Unreachable),
            (GONE, NodeSource::Absent, NovaSource::ForcedDown, &[], Unreachable),
            (GONE, NOT_READY_LONG, NovaSource::Down, &warn, Failed),
        ];
        for (agent, node, nova, signals, want) in rows {
            let a = judge(agent, node, nova, signals);
            assert_eq!(a.state, want, "{agent:?} {node:?} {nova:?} {signals:?}: {:?}", a.evidence);
            assert_eq!(a.held, None);
            let quiet = want == Healthy && signals.is_empty() && nova != NovaSource::ForcedDown;
            assert_eq!(a.evidence.is_empty(), quiet, "{:?}", a.evidence);
        }
    }

    #[test]
    fn a_bmc_reporting_power_off_fails_a_host_whose_stream_is_gone_at_once_and_only_such_a_host() {
        // The Node still Ready by its condition, its Lease aging: the
        // kubelet is not known alive, and the BMC's word needs no grace.
        let aging = Some(Heartbeat { renewed: at(570), duration: SignedDuration::from_secs(40) });
        let judge = |agent, power| {
            let s = Sources {
                agent,
                node: NodeSource::Ready,
                lease: aging,
                nova: NovaSource::Up,
                power,
                signals: &[],
            };
            assess(&s, &OwnView::Clear, None, &HealthPolicy::default(), at(600))
        };
        let off = judge(GONE, PowerSource::Off);
        assert_eq!(off.state, HealthState::Failed);
        assert!(off.evidence.contains(&"BMC: power off".to_string()), "{:?}", off.evidence);
        assert_eq!(judge(GONE, PowerSource::On).state, HealthState::Unreachable);
        assert_eq!(judge(GONE, PowerSource::Unknown).state, HealthState::Unreachable);
        // A BMC saying off while the agent talks is another host's: said, not counted.
        let talking = judge(AgentSource::Connected, PowerSource::Off);
        assert_eq!(talking.state, HealthState::Healthy);
        assert!(talking.evidence.iter().any(|e| e.contains("this host's?")), "{:?}", talking.evidence);
    }

    #[test]
    fn a_live_kubelet_vetoes_failed_and_says_so() {
        let policy = HealthPolicy::default();
        let lease =
            |renewed| Some(Heartbeat { renewed: at(renewed), duration: SignedDuration::from_secs(40) });
        let judge = |node, lease, power| {
            let s = Sources { agent: GONE, node, lease, nova: NovaSource::Down, power, signals: &[] };
            assess(&s, &OwnView::Clear, None, &policy, at(600))
        };
        // Renewed 10 s ago (within half its 40 s): alive, whatever the BMC and Nova say.
        for node in [NodeSource::Ready, NOT_READY_LONG, NodeSource::Absent] {
            for power in [PowerSource::Off, PowerSource::Unknown] {
                let a = judge(node, lease(590), power);
                assert_eq!(a.state, HealthState::Unreachable, "{node:?} {power:?}: {:?}", a.evidence);
            }
        }
        let vetoed = judge(NodeSource::Ready, lease(590), PowerSource::Off);
        let said = "kubelet: alive, its Lease renewed lately (never Failed while it is)";
        assert!(vetoed.evidence.iter().any(|e| e == said), "{:?}", vetoed.evidence);
        // A renewal later, the same words: a steady verdict's status is not rewritten.
        assert_eq!(judge(NodeSource::Ready, lease(595), PowerSource::Off).evidence, vetoed.evidence);
        // The Node Ready by its condition, its Lease not read: alive too.
        let ready = judge(NodeSource::Ready, None, PowerSource::Off);
        assert_eq!(ready.state, HealthState::Unreachable);
        assert!(
            ready.evidence.iter().any(|e| e == "kubelet: alive, its Node Ready (never Failed while it is)")
        );
        // Aging (renewed 30 s ago): not alive; with Nova down but power
        // unknown, not lost yet either.
        assert_eq!(
            judge(NodeSource::Ready, lease(570), PowerSource::Unknown).state,
            HealthState::Unreachable
        );
        // Not renewed for the grace (60 s) though the Node still says Ready
        // (the Node lifecycle controller not running): the kubelet's channel is lost.
        let stale = judge(NodeSource::Ready, lease(530), PowerSource::Unknown);
        assert_eq!(stale.state, HealthState::Failed);
        assert!(stale.evidence.iter().any(|e| e == "kubelet: Lease not renewed since 2027-01-15T08:08:50Z"));
        // When to look again: as the Lease stops being fresh, then turns stale.
        let s = |renewed| Sources {
            agent: GONE,
            node: NodeSource::Ready,
            lease: lease(renewed),
            nova: NovaSource::Up,
            power: PowerSource::Unknown,
            signals: &[],
        };
        assert_eq!(recheck_in(&s(590), &policy, at(600)), Some(SignedDuration::from_secs(10)));
        assert_eq!(recheck_in(&s(570), &policy, at(600)), Some(SignedDuration::from_secs(30)));
        assert_eq!(recheck_in(&s(530), &policy, at(600)), None);
    }

    #[test]
    fn the_evidence_names_each_source_and_signal_with_since_when() {
        let signals = [signal("load-high", Severity::Warning), signal("root-read-only", Severity::Critical)];
        let a = judge(GONE, NOT_READY_LONG, NovaSource::Down, &signals);
        assert_eq!(
            a.evidence,
            vec![
                "agent: no session since 2027-01-15T08:05:00Z",
                "Node: not Ready since 2027-01-15T08:00:00Z",
                "Nova: nova-compute down",
                "root-read-only (critical): root-read-only seen",
                "load-high (warning): load-high seen",
            ]
        );
    }

    #[test]
    fn evidence_is_bounded_and_the_grace_says_when_to_look_again() {
        let many: Vec<Signal> = (0..30).map(|i| signal(&format!("s{i:02}"), Severity::Warning)).collect();
        let a = judge(AgentSource::Connected, NodeSource::Ready, NovaSource::Up, &many);
        assert_eq!(a.evidence.len(), MAX_EVIDENCE);
        assert_eq!(a.evidence.last().map(String::as_str), Some("… and 21 more"));
        let policy = HealthPolicy::default();
        let s = |node| Sources {
            agent: AgentSource::Connected,
            node,
            lease: None,
            nova: NovaSource::Up,
            power: PowerSource::Unknown,
            signals: &[],
        };
        assert_eq!(recheck_in(&s(NOT_READY_NOW), &policy, at(600)), Some(SignedDuration::from_secs(50)));
        assert_eq!(recheck_in(&s(NOT_READY_LONG), &policy, at(600)), None);
        assert_eq!(recheck_in(&s(NodeSource::Ready), &policy, at(600)), None);
    }

    #[test]
    fn a_blind_coordinator_keeps_the_last_verdict_and_says_why() {
        let previous = HealthStatus { state: HealthState::Healthy, since: None, evidence: vec![] };
        let s = Sources {
            agent: GONE,
            node: NodeSource::Absent,
            lease: None,
            nova: NovaSource::Down,
            power: PowerSource::Unknown,
            signals: &[],
        };
        let blind = OwnView::Blind("cannot reach Nova: timeout".into());
        let a = assess(&s, &blind, Some(&previous), &HealthPolicy::default(), at(600));
        assert_eq!(a.state, HealthState::Healthy);
        assert_eq!(a.held.as_deref(), Some("not judged: the coordinator cannot reach Nova: timeout"));
        assert_eq!(assess(&s, &blind, None, &HealthPolicy::default(), at(600)).state, HealthState::Healthy);
    }

    #[test]
    fn since_moves_only_with_the_state() {
        let a = judge(GONE, NodeSource::Ready, NovaSource::Up, &[]);
        let first = next_status(None, &a, at(10));
        assert_eq!(first.since.as_ref().map(|t| t.0), Some(at(10)));
        let again = next_status(Some(&first), &a, at(20));
        assert_eq!(again.since.as_ref().map(|t| t.0), Some(at(10)));
        let back = next_status(
            Some(&again),
            &judge(AgentSource::Connected, NodeSource::Ready, NovaSource::Up, &[]),
            at(30),
        );
        assert_eq!((back.state, back.since.as_ref().map(|t| t.0)), (HealthState::Healthy, Some(at(30))));
    }

    fn all_agents() -> Vec<AgentSource> {
        vec![AgentSource::Connected, GONE, AgentSource::Gone { since: None }]
    }

    fn all_nodes() -> Vec<NodeSource> {
        vec![
            NodeSource::Ready,
            NOT_READY_NOW,
            NOT_READY_LONG,
            NodeSource::NotReady { since: None },
            NodeSource::Absent,
        ]
    }

    fn all_novas() -> Vec<NovaSource> {
        vec![NovaSource::Up, NovaSource::Down, NovaSource::ForcedDown, NovaSource::Unknown]
    }

    fn all_signals() -> Vec<Vec<Signal>> {
        let (c, w) = (Severity::Critical, Severity::Warning);
        vec![
            vec![],
            vec![signal("a", w)],
            vec![signal("a", c)],
            vec![signal("a", c), signal("b", c), signal("c", w)],
        ]
    }

    /// The kubelet's Lease as a reconcile may find it at `at(600)`: not
    /// read, renewed 10 s ago (fresh), 30 s ago (aging) and 90 s ago (stale
    /// past the 60 s grace), each holding 40 s.
    fn all_leases() -> Vec<Option<Heartbeat>> {
        let held =
            |ago: i64| Some(Heartbeat { renewed: at(600 - ago), duration: SignedDuration::from_secs(40) });
        vec![None, held(10), held(30), held(90)]
    }

    /// Over every combination of the sources: a live kubelet (its Lease
    /// fresh, or its Node Ready where the Lease is not read) is never
    /// Failed; Failed is exactly the agent's stream lost, the kubelet not
    /// alive, and its channel or the host's power lost; a single lost
    /// channel, or any number of signals, never makes Failed; signals
    /// alone never make Unreachable; a blind coordinator changes nothing.
    #[test]
    fn no_single_source_and_no_live_host_ever_makes_failed() {
        let policy = HealthPolicy::default();
        let mut seen = std::collections::BTreeSet::new();
        for agent in all_agents() {
            for node in all_nodes() {
                for lease in all_leases() {
                    for nova in all_novas() {
                        for power in [PowerSource::On, PowerSource::Off, PowerSource::Unknown] {
                            for signals in all_signals() {
                                let s = Sources { agent, node, lease, nova, power, signals: &signals };
                                seen.insert(one_combination(&s, &policy));
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(seen.len(), 4, "every state is reached: {seen:?}");
    }

    /// The checks of [`no_single_source_and_no_live_host_ever_makes_failed`]
    /// on one combination; answers the state.
    fn one_combination(s: &Sources<'_>, policy: &HealthPolicy) -> HealthState {
        let a = assess(s, &OwnView::Clear, None, policy, at(600));
        let agent_lost = s.agent != AgentSource::Connected;
        let fresh = s.lease.is_some_and(|h| h.renewed == at(590));
        let stale = s.lease.is_some_and(|h| h.renewed == at(510));
        let alive = fresh || (s.lease.is_none() && s.node == NodeSource::Ready);
        let not_ready_long = matches!(s.node, NodeSource::NotReady { since } if since != NOT_READY_NOW_SINCE);
        let kubelet_lost = !alive && (not_ready_long || (stale && s.node != NodeSource::Absent));
        let nova_lost = s.nova == NovaSource::Down;
        // The BMC's word counts only for a host whose stream is gone.
        let power_lost = s.power == PowerSource::Off && agent_lost;
        let lost = [agent_lost, kubelet_lost, nova_lost, power_lost].iter().filter(|l| **l).count();
        let why = format!("{s:?}: {a:?}");
        let failed = agent_lost && !alive && (kubelet_lost || power_lost);
        assert_eq!(a.state == HealthState::Failed, failed, "{why}");
        if alive || lost <= 1 {
            assert_ne!(a.state, HealthState::Failed, "{why}");
        }
        if lost == 0 {
            assert!(matches!(a.state, HealthState::Healthy | HealthState::Degraded), "{why}");
        } else {
            assert!(matches!(a.state, HealthState::Unreachable | HealthState::Failed), "{why}");
        }
        for previous in [HealthState::Healthy, HealthState::Failed] {
            let p = HealthStatus { state: previous, since: None, evidence: vec!["x".into()] };
            let blind = assess(s, &OwnView::Blind("cannot".into()), Some(&p), policy, at(600));
            assert_eq!((blind.state, blind.evidence), (previous, vec!["x".to_string()]), "{why}");
        }
        a.state
    }

    const NOT_READY_NOW_SINCE: Option<Timestamp> = Some(Timestamp::constant(T0 + 590, 0));
}
