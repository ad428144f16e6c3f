//! The health model's inputs from what a reconcile observed: the agent's
//! session, the Node, Nova's view. Pure.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;

use super::model::{AgentSource, NodeSource, NovaSource, OwnView};
use crate::api::hypervisor::{HealthState, HealthStatus, MachineStatus};
use crate::api::{ConditionStatus, ConditionType};
use crate::lifecycle::{DesiredCondition, NovaObs, ServiceState};

use super::Signal;
use super::model::Assessment;

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
    pub checks: Option<crate::lifecycle::CheckReport>,
    /// metadata.uid of the Hypervisor whose run `checks` answers: a report
    /// for a Hypervisor since deleted and created anew is not this one's.
    pub checks_hypervisor: String,
    /// Messages the agent had to drop from its outbox (from heartbeats).
    pub dropped: u64,
    pub domains: Option<u32>,
    /// The agent's health signals that hold.
    pub signals: Vec<Signal>,
    /// What its last facts say of the machine (None: no facts yet).
    pub machine: Option<MachineStatus>,
}

pub fn agent_source(a: &AgentView) -> AgentSource {
    if a.connected { AgentSource::Connected } else { AgentSource::Gone { since: a.since } }
}

/// The Node's `Ready` condition and since when; a Node with none is not Ready.
pub fn node_source(node: Option<&Node>) -> NodeSource {
    let Some(node) = node else { return NodeSource::Absent };
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    match conditions.into_iter().flatten().find(|c| c.type_ == "Ready") {
        Some(c) if c.status == "True" => NodeSource::Ready,
        Some(c) => NodeSource::NotReady { since: c.last_transition_time.as_ref().map(|t| t.0) },
        None => NodeSource::NotReady { since: None },
    }
}

/// Nova's word on nova-compute, and whether we could hear it at all.
pub fn nova_source(nova: &NovaObs) -> (NovaSource, OwnView) {
    match nova {
        NovaObs::Registered(h) => {
            let s = match h.service_state {
                ServiceState::Up => NovaSource::Up,
                ServiceState::Down => NovaSource::Down,
                ServiceState::ForcedDown => NovaSource::ForcedDown,
                ServiceState::Unknown => NovaSource::Unknown,
            };
            (s, OwnView::Clear)
        }
        // Fixed words, not the error's: a message that changed with every
        // retry would rewrite status each time (the log has the error).
        NovaObs::NotRegistered => (NovaSource::Unknown, OwnView::Clear),
        NovaObs::Unknown => (NovaSource::Unknown, OwnView::Blind("has not read Nova yet".into())),
        NovaObs::Unreachable(_) => (NovaSource::Unknown, OwnView::Blind("cannot reach Nova".into())),
        NovaObs::Rejected(_) => (NovaSource::Unknown, OwnView::Blind("is refused by Keystone".into())),
    }
}

/// What the lifecycle acts on of a recorded verdict.
pub fn lifecycle_view(h: &HealthStatus, empties: bool) -> crate::lifecycle::HealthObs {
    crate::lifecycle::HealthObs {
        state: h.state,
        since: h.since.as_ref().map(|t| t.0),
        // A Degraded host's reason is its first critical signal (a line
        // about Nova's forced_down may come first).
        summary: h
            .evidence
            .iter()
            .find(|l| h.state != HealthState::Degraded || l.contains("(critical)"))
            .cloned()
            .unwrap_or_else(|| h.state.to_string()),
        hold_back: None,
        empties,
    }
}

/// The `NodeHealthy` condition where there is no verdict: a phase where
/// health is not judged, or a coordinator that could not judge yet.
pub fn not_judged(why: &str) -> DesiredCondition {
    DesiredCondition::new(ConditionType::NodeHealthy, ConditionStatus::Unknown, "NotJudged", why)
}

/// The `NodeHealthy` condition of a verdict.
pub fn condition(a: &Assessment) -> DesiredCondition {
    let status = if a.state == crate::api::hypervisor::HealthState::Healthy {
        ConditionStatus::True
    } else {
        ConditionStatus::False
    };
    let mut message = a.evidence.join("; ");
    if let Some(held) = &a.held {
        message = if message.is_empty() { held.clone() } else { format!("{held}; {message}") };
    }
    if message.is_empty() {
        message = "the agent, the kubelet and nova-compute answer; no signal".into();
    }
    DesiredCondition::new(ConditionType::NodeHealthy, status, &a.state.to_string(), message)
}

/// The Event for a change of state: (warning?, reason, note). None when
/// the state stays.
pub fn change(previous: Option<&HealthStatus>, now: &HealthStatus) -> Option<(bool, String, String)> {
    let was = previous.map_or(crate::api::hypervisor::HealthState::Healthy, |p| p.state);
    if was == now.state {
        return None;
    }
    let warning = now.state != crate::api::hypervisor::HealthState::Healthy;
    let note = format!("{was} -> {}: {}", now.state, now.evidence.join("; "));
    Some((warning, format!("Health{}", now.state), note))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::hypervisor::HealthState;
    use jiff::Timestamp;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn node(ready: Option<(&str, i64)>) -> Node {
        let conditions = ready.map(|(status, at)| {
            serde_json::json!([{"type": "Ready", "status": status,
                "lastTransitionTime": Timestamp::from_second(at).unwrap_or_default().to_string()}])
        });
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "status": {"conditions": conditions.unwrap_or(serde_json::json!([]))}
        }))
        .unwrap_or_default()
    }

    #[test]
    fn the_nodes_ready_condition_and_its_transition() {
        assert_eq!(node_source(None), NodeSource::Absent);
        assert_eq!(node_source(Some(&node(Some(("True", 100))))), NodeSource::Ready);
        let since = Some(Timestamp::from_second(100).unwrap_or_default());
        assert_eq!(node_source(Some(&node(Some(("Unknown", 100))))), NodeSource::NotReady { since });
        assert_eq!(node_source(Some(&node(Some(("False", 100))))), NodeSource::NotReady { since });
        assert_eq!(node_source(Some(&node(None))), NodeSource::NotReady { since: None });
    }

    #[test]
    fn nova_blind_only_when_it_does_not_answer() {
        assert_eq!(nova_source(&NovaObs::NotRegistered).1, OwnView::Clear);
        let blind = nova_source(&NovaObs::Unreachable("timeout after 3.2s".into())).1;
        assert_eq!(blind, OwnView::Blind("cannot reach Nova".into()), "fixed words, not the error's");
        assert!(matches!(nova_source(&NovaObs::Rejected("401".into())).1, OwnView::Blind(_)));
        assert!(matches!(nova_source(&NovaObs::Unknown).1, OwnView::Blind(_)));
        let host =
            |s| NovaObs::Registered(crate::lifecycle::NovaHost { service_state: s, ..Default::default() });
        assert_eq!(nova_source(&host(ServiceState::Down)).0, NovaSource::Down);
        assert_eq!(nova_source(&host(ServiceState::ForcedDown)).0, NovaSource::ForcedDown);
        assert_eq!(nova_source(&host(ServiceState::Up)).0, NovaSource::Up);
    }

    #[test]
    fn a_change_is_an_event_a_steady_state_is_not() {
        let at = |s: HealthState| HealthStatus {
            state: s,
            since: Some(Time(Timestamp::UNIX_EPOCH)),
            evidence: vec!["x".into()],
        };
        assert_eq!(change(None, &at(HealthState::Healthy)), None, "no news at the first Healthy");
        let (warning, reason, note) =
            change(Some(&at(HealthState::Healthy)), &at(HealthState::Unreachable)).unwrap_or_default();
        assert!(warning);
        assert_eq!(reason, "HealthUnreachable");
        assert_eq!(note, "Healthy -> Unreachable: x");
        assert!(!change(Some(&at(HealthState::Failed)), &at(HealthState::Healthy)).is_some_and(|c| c.0));
        assert_eq!(change(Some(&at(HealthState::Degraded)), &at(HealthState::Degraded)), None);
    }

    #[test]
    fn the_condition_says_what_the_state_rests_on() {
        let a = Assessment {
            state: HealthState::Unreachable,
            evidence: vec!["agent: no session".into()],
            held: None,
            empties: false,
        };
        let c = condition(&a);
        assert_eq!(
            (c.status, c.reason.as_str(), c.message.as_str()),
            (ConditionStatus::False, "Unreachable", "agent: no session")
        );
        let held = Assessment { held: Some("not judged: x".into()), ..a };
        assert_eq!(condition(&held).message, "not judged: x; agent: no session");
        let ok = Assessment { state: HealthState::Healthy, evidence: vec![], held: None, empties: false };
        assert_eq!(condition(&ok).status, ConditionStatus::True);
    }
}
