//! What a host's health adds up to (docs/health.md): pure, from what each
//! independent source says, into one of Healthy, Degraded, Unreachable and
//! Failed, with the evidence.
//!
//! The sources are independent channels to the host: the agent's stream
//! (our gRPC), the kubelet (the Node's `Ready` condition, through the
//! Kubernetes API) and nova-compute (its service state, through Nova's
//! service group), and the host's BMC where it has one (read only while
//! the agent's stream is gone). A lost channel says "we cannot see it",
//! not "it is dead"; only two lost channels, one of them the agent's
//! stream, say Failed. A BMC reporting power off is a lost channel of its
//! own: with the stream gone, a host whose BMC says off is Failed at once,
//! without waiting for the kubelet's or Nova's grace. The agent's own signals say how sick a host it can still see is.

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

#[derive(Clone, Debug, PartialEq)]
pub struct Sources<'a> {
    pub agent: AgentSource,
    pub node: NodeSource,
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
}

/// The channels that are lost, each with its evidence.
fn lost(s: &Sources<'_>, policy: &HealthPolicy, now: Timestamp) -> (bool, Vec<String>) {
    let mut out = Vec::new();
    // A time, not an age: the evidence (and the status) stays the same
    // from one reconcile to the next.
    let ago =
        |t: Option<Timestamp>| t.map(|t| format!(" since {}", t.round(jiff::Unit::Second).unwrap_or(t)));
    let agent_gone = matches!(s.agent, AgentSource::Gone { .. });
    if let AgentSource::Gone { since } = s.agent {
        out.push(format!("agent: no session{}", ago(since).unwrap_or_default()));
    }
    match s.node {
        // A deleted Node is the lifecycle's news (termination), and it takes
        // the agent's pod with it: counting it would make one act Failed.
        NodeSource::Ready | NodeSource::Absent => {}
        NodeSource::NotReady { since } => {
            let long = since.is_none_or(|t| now.duration_since(t) >= policy.node_grace);
            if long {
                out.push(format!("Node: not Ready{}", ago(since).unwrap_or_default()));
            }
        }
    }
    // `forced_down` is someone's assertion (an operator's, a fencing's), not
    // an observation of the host: it is shown, never counted.
    if s.nova == NovaSource::Down {
        out.push("Nova: nova-compute down".into());
    }
    if s.power == PowerSource::Off && agent_gone {
        out.push("BMC: power off".into());
    }
    (agent_gone, out)
}

/// Evidence lines kept at most; the rest are counted in one more line.
pub const MAX_EVIDENCE: usize = 10;

/// When the verdict may change with no news: the Node's grace running out.
pub fn recheck_in(s: &Sources<'_>, policy: &HealthPolicy, now: Timestamp) -> Option<SignedDuration> {
    match s.node {
        NodeSource::NotReady { since: Some(t) } if now.duration_since(t) < policy.node_grace => {
            Some(policy.node_grace - now.duration_since(t))
        }
        _ => None,
    }
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
        };
    }
    let (agent_gone, mut evidence) = lost(s, policy, now);
    let mut critical: Vec<&Signal> = s.signals.iter().filter(|g| g.severity == Severity::Critical).collect();
    critical.sort_by(|a, b| (&a.kind, &a.subject).cmp(&(&b.kind, &b.subject)));
    let state = if agent_gone && evidence.len() >= 2 {
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
    Assessment { state, evidence, held: None }
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
        }
    }

    fn judge(agent: AgentSource, node: NodeSource, nova: NovaSource, signals: &[Signal]) -> Assessment {
        let s = Sources { agent, node, nova, power: PowerSource::Unknown, signals };
        assess(&s, &OwnView::Clear, None, &HealthPolicy::default(), at(600))
    }

    const GONE: AgentSource = AgentSource::Gone { since: Some(Timestamp::constant(T0 + 300, 0)) };
    const NOT_READY_LONG: NodeSource = NodeSource::NotReady { since: Some(Timestamp::constant(T0, 0)) };
    const NOT_READY_NOW: NodeSource = NodeSource::NotReady { since: Some(Timestamp::constant(T0 + 590, 0)) };

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
            (GONE, NodeSource::Ready, NovaSource::Down, &[], Failed),
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
        let judge = |agent, power| {
            let s = Sources { agent, node: NodeSource::Ready, nova: NovaSource::Up, power, signals: &[] };
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

    /// Over every combination of the sources: Failed needs the agent's
    /// stream lost and at least one other channel lost; a single lost
    /// channel, or any number of signals, never makes Failed; signals
    /// alone never make Unreachable; a blind coordinator changes nothing.
    #[test]
    fn no_single_source_ever_makes_failed() {
        let policy = HealthPolicy::default();
        let mut seen = std::collections::BTreeSet::new();
        for agent in all_agents() {
            for node in all_nodes() {
                for nova in all_novas() {
                    for power in [PowerSource::On, PowerSource::Off, PowerSource::Unknown] {
                        for signals in all_signals() {
                            let s = Sources { agent, node, nova, power, signals: &signals };
                            let a = assess(&s, &OwnView::Clear, None, &policy, at(600));
                            let agent_lost = agent != AgentSource::Connected;
                            let node_lost = matches!(node, NodeSource::NotReady { since } if since != NOT_READY_NOW_SINCE);
                            let nova_lost = nova == NovaSource::Down;
                            // The BMC's word counts only for a host whose stream is gone.
                            let power_lost = power == PowerSource::Off && agent_lost;
                            let lost =
                                [agent_lost, node_lost, nova_lost, power_lost].iter().filter(|l| **l).count();
                            let why = format!("{agent:?} {node:?} {nova:?} {power:?} {signals:?}: {a:?}");
                            if a.state == HealthState::Failed {
                                assert!(agent_lost && lost >= 2, "{why}");
                            }
                            if lost <= 1 {
                                assert_ne!(a.state, HealthState::Failed, "{why}");
                            }
                            if lost == 0 {
                                assert!(
                                    matches!(a.state, HealthState::Healthy | HealthState::Degraded),
                                    "{why}"
                                );
                            }
                            if lost >= 1 {
                                assert!(
                                    matches!(a.state, HealthState::Unreachable | HealthState::Failed),
                                    "{why}"
                                );
                            }
                            for previous in [HealthState::Healthy, HealthState::Failed] {
                                let p =
                                    HealthStatus { state: previous, since: None, evidence: vec!["x".into()] };
                                let blind =
                                    assess(&s, &OwnView::Blind("cannot".into()), Some(&p), &policy, at(600));
                                assert_eq!(
                                    (blind.state, blind.evidence),
                                    (previous, vec!["x".to_string()]),
                                    "{why}"
                                );
                            }
                            seen.insert(a.state);
                        }
                    }
                }
            }
        }
        assert_eq!(seen.len(), 4, "every state is reached: {seen:?}");
    }

    const NOT_READY_NOW_SINCE: Option<Timestamp> = Some(Timestamp::constant(T0 + 590, 0));
}
