//! The Hypervisor status the controller writes, composed purely from the
//! stored status, the lifecycle's decision and the agent registry.
//!
//! Deliberately absent: the agent's last heartbeat. It changes every few
//! seconds, and a status that changes on every reconcile would mean a write
//! per node per heartbeat; the fleet API and hvctl show it instead.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::condition::merge;
use crate::api::hypervisor::{AgentStatus, InstancesStatus, MachineStatus};
use crate::api::{ConditionStatus, ConditionType, HypervisorStatus};
use crate::health::AgentView;
use crate::lifecycle::{Decision, DesiredCondition, NovaObs};

pub fn compose(
    old: &HypervisorStatus,
    d: &Decision,
    agent: &AgentView,
    nova: &NovaObs,
    generation: Option<i64>,
    now: Timestamp,
) -> HypervisorStatus {
    let mut desired = d.conditions.clone();
    desired.push(agent_condition(agent));
    let mut s = old.clone();
    s.phase = Some(d.phase);
    s.phase_since = d.phase_since.clone();
    s.conditions = merge(&old.conditions, &desired, now, generation);
    s.observed_generation = generation;
    s.service_id = d.service_id.clone();
    s.hypervisor_id = d.hypervisor_id.clone();
    if let Some(v) = &agent.libvirt_version {
        s.libvirt_version = Some(v.clone());
    }
    if let Some(v) = &agent.hypervisor_version {
        s.hypervisor_version = Some(v.clone());
    }
    if let Some(checks) = &d.checks {
        s.checks = checks.clone();
    }
    if let NovaObs::Registered(host) = nova {
        let count = u32::try_from(host.instances.len()).unwrap_or(u32::MAX);
        s.instances = Some(InstancesStatus { count, ids: host.instances.clone() });
    }
    s.agent = Some(AgentStatus {
        connected: agent.connected,
        // Whole seconds, as the API server stores a Time: a finer one would
        // differ from the stored status at every reconcile, and be written
        // again each time.
        since: agent.since.map(|t| Time(Timestamp::from_second(t.as_second()).unwrap_or(t))),
        version: Some(agent.agent_version.clone()).filter(|v| !v.is_empty()),
        last_heartbeat: None,
    });
    s.machine = machine(old, agent);
    s.power_state = d.power_state;
    s.lifecycle = d.record.clone();
    s
}

/// The machine as recorded, with what the agent now reports of it (each
/// part replaced only by a newer report of it): observed, so recorded
/// whether or not the coordinator acts on the host.
pub fn machine(old: &HypervisorStatus, agent: &AgentView) -> Option<MachineStatus> {
    match &agent.machine {
        Some(m) => {
            Some(MachineStatus::updated(old.machine.as_ref(), m)).filter(|m| *m != MachineStatus::default())
        }
        None => old.machine.clone(),
    }
}

fn agent_condition(agent: &AgentView) -> DesiredCondition {
    let (status, reason, message) = if agent.connected {
        (ConditionStatus::True, "Connected", format!("agent {} connected", agent.agent_version))
    } else if agent.since.is_some() {
        (ConditionStatus::False, "Disconnected", "the agent's session ended".to_string())
    } else {
        (ConditionStatus::False, "NeverConnected", "no agent has connected for this node".to_string())
    };
    DesiredCondition { type_: ConditionType::AgentConnected, status, reason: reason.into(), message }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Phase;
    use crate::lifecycle::NovaHost;

    fn decision(phase: Phase) -> Decision {
        Decision {
            phase,
            phase_since: None,
            transition: None,
            actions: vec![],
            conditions: vec![],
            record: Default::default(),
            service_id: Some("svc".into()),
            hypervisor_id: None,
            checks: None,
            warnings: vec![],
            power_state: None,
        }
    }

    #[test]
    fn agent_condition_and_instances_come_from_their_sources() {
        let now = Timestamp::UNIX_EPOCH;
        let agent = AgentView { connected: true, agent_version: "0.1.0".into(), ..Default::default() };
        let host = NovaHost { instances: vec!["a".into(), "b".into()], ..Default::default() };
        let s = compose(
            &HypervisorStatus::default(),
            &decision(Phase::Active),
            &agent,
            &NovaObs::Registered(host),
            Some(3),
            now,
        );
        assert_eq!(s.phase, Some(Phase::Active));
        assert_eq!(s.instances.as_ref().map(|i| i.count), Some(2));
        assert_eq!(s.observed_generation, Some(3));
        let c = s.conditions.iter().find(|c| c.type_ == "AgentConnected").map(|c| c.status.as_str());
        assert_eq!(c, Some("True"));
        assert_eq!(s.agent.as_ref().and_then(|a| a.last_heartbeat.clone()), None);
    }

    #[test]
    fn a_reconcile_that_changes_nothing_composes_the_same_status() {
        let now = Timestamp::UNIX_EPOCH;
        let agent = AgentView::default();
        let once = compose(
            &HypervisorStatus::default(),
            &decision(Phase::Onboarding),
            &agent,
            &NovaObs::Unknown,
            None,
            now,
        );
        let later = now + jiff::SignedDuration::from_secs(60);
        let twice = compose(&once, &decision(Phase::Onboarding), &agent, &NovaObs::Unknown, None, later);
        assert_eq!(once, twice, "no write, and so no watch event, when nothing changed");
        let c = twice.conditions.iter().find(|c| c.type_ == "AgentConnected").map(|c| c.reason.as_str());
        assert_eq!(c, Some("NeverConnected"));
    }

    #[test]
    fn a_status_read_back_from_the_api_server_composes_the_same_again() {
        let now = Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_millis(1_800_000_000_674);
        let agent = AgentView {
            connected: true,
            agent_version: "0.1.0".into(),
            since: Some(now),
            ..Default::default()
        };
        let nova = NovaObs::Registered(NovaHost::default());
        let once =
            compose(&HypervisorStatus::default(), &decision(Phase::Active), &agent, &nova, Some(1), now);
        // What the API server stores and answers: Times in whole seconds.
        let stored: HypervisorStatus = serde_json::from_value(serde_json::to_value(&once).unwrap()).unwrap();
        let later = now + jiff::SignedDuration::from_secs(60);
        let twice = compose(&stored, &decision(Phase::Active), &agent, &nova, Some(1), later);
        assert_eq!(stored, twice, "a status that would be written at every reconcile");
    }
}
