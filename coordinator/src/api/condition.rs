//! Condition types and the one controller that owns each.
//!
//! Kubernetes API conventions: `type`, `status`, `reason`, `message`,
//! `lastTransitionTime`, `observedGeneration`. Each type has exactly one
//! owner; a writer never touches a condition it does not own.

use std::fmt;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde::{Deserialize, Serialize};

/// `status` of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }

    pub fn from(b: bool) -> Self {
        if b { ConditionStatus::True } else { ConditionStatus::False }
    }
}

impl fmt::Display for ConditionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who writes a condition. One owner per condition type, so that two writers
/// never fight over the same entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// The Hypervisor lifecycle controller (`lifecycle::decide`).
    Lifecycle,
    /// The agent session registry (`fleet`).
    Fleet,
    /// The HA failure detector (`ha`).
    Ha,
    /// The eviction controller, on `Eviction` objects.
    Eviction,
    /// Whichever controller writes the object's status: a summary of its
    /// other conditions, computed at each write (`api::ready`).
    Summary,
}

/// The condition types of all three kinds. Stored (in an abort's record)
/// as its name, the text [`ConditionType::as_str`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ConditionType {
    /// Hypervisor: nova-compute registered, aggregates and traits in place.
    Onboarded,
    /// Hypervisor: the agent's validation checks passed (or were skipped).
    Tested,
    /// Hypervisor: the compute service is enabled in Nova as the phase demands.
    SchedulingEnabled,
    /// Hypervisor: VMs have been moved off for maintenance or decommissioning.
    Evicted,
    /// Hypervisor: the node's lifecycle is stopped on an error until retried.
    Aborted,
    /// Hypervisor: being deleted; True once nothing in Nova depends on the
    /// host and the object may go, False while the deletion is held.
    Deleting,
    /// Hypervisor: an agent session is live.
    AgentConnected,
    /// Hypervisor: the HA detector considers the node alive.
    NodeHealthy,
    /// Hypervisor: a fencing of the host (docs/fencing.md): True once it
    /// is fenced, False while it is under way, held back or stuck.
    Fenced,
    /// Eviction: the preflight's verdict (which VMs cannot go, and why).
    Preflight,
    /// Eviction: its target and options are usable (a managed Hypervisor,
    /// options within bounds, a reason it may use).
    Target,
    /// Eviction: the host's compute service is disabled, so nothing new
    /// lands while it is emptied.
    HostDisabled,
    /// Eviction: the host is fenced and its servers are evacuated (True),
    /// or its fencing is under way and nothing new starts (False).
    HostFenced,
    /// Hypervisor: the coordinator keeps its hands off the host (an SRE's
    /// pause, or observe mode) and only reports what it would do.
    Paused,
    /// Eviction: its host is paused or the install observes only; nothing
    /// is asked of Nova until it is free.
    HostPaused,
    /// Eviction: the host is the machine Nova means (the servers Nova
    /// lists there are domains its agent reported), True; False when none
    /// of them is, and nothing moves.
    Machine,
    /// Hypervisor: an update tool that stops waiting at a known time
    /// drains the Node (docs/drain.md): True while the host is not emptied
    /// yet, with how long it has; False once it is, or the tool is gone.
    UpdateDrain,
    /// Hypervisor: where its power stands (docs/power.md): True when it is
    /// where `spec.powerState` asks (in service, or hibernated), False on
    /// the way or stopped on an error. Absent while never asked to hibernate.
    PowerState,
    /// Hypervisor and Eviction: the summary (`api::ready`): a host in
    /// service, an eviction that succeeded.
    Ready,
    /// Hypervisor and Eviction (`api::ready`, kstatus): True while the
    /// object moves towards what its spec asks.
    Reconciling,
    /// Hypervisor and Eviction (`api::ready`, kstatus): True while it
    /// waits on an SRE.
    Stalled,
}

impl ConditionType {
    pub const fn as_str(self) -> &'static str {
        match self {
            ConditionType::Onboarded => "Onboarded",
            ConditionType::Tested => "Tested",
            ConditionType::SchedulingEnabled => "SchedulingEnabled",
            ConditionType::Evicted => "Evicted",
            ConditionType::Aborted => "Aborted",
            ConditionType::Deleting => "Deleting",
            ConditionType::AgentConnected => "AgentConnected",
            ConditionType::NodeHealthy => "NodeHealthy",
            ConditionType::Fenced => "Fenced",
            ConditionType::Preflight => "Preflight",
            ConditionType::Target => "Target",
            ConditionType::HostDisabled => "HostDisabled",
            ConditionType::HostFenced => "HostFenced",
            ConditionType::Paused => "Paused",
            ConditionType::HostPaused => "HostPaused",
            ConditionType::Machine => "Machine",
            ConditionType::UpdateDrain => "UpdateDrain",
            ConditionType::PowerState => "PowerState",
            ConditionType::Ready => "Ready",
            ConditionType::Reconciling => "Reconciling",
            ConditionType::Stalled => "Stalled",
        }
    }

    pub fn owner(self) -> Owner {
        match self {
            ConditionType::Onboarded
            | ConditionType::Tested
            | ConditionType::SchedulingEnabled
            | ConditionType::Evicted
            | ConditionType::Aborted
            | ConditionType::Deleting
            | ConditionType::Paused
            | ConditionType::UpdateDrain
            | ConditionType::PowerState => Owner::Lifecycle,
            ConditionType::AgentConnected => Owner::Fleet,
            ConditionType::NodeHealthy | ConditionType::Fenced => Owner::Ha,
            ConditionType::Preflight
            | ConditionType::Target
            | ConditionType::HostDisabled
            | ConditionType::HostFenced
            | ConditionType::HostPaused
            | ConditionType::Machine => Owner::Eviction,
            ConditionType::Ready | ConditionType::Reconciling | ConditionType::Stalled => Owner::Summary,
        }
    }
}

impl fmt::Display for ConditionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A condition as its owner wants it; [`merge`] stamps the times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredCondition {
    pub type_: ConditionType,
    pub status: ConditionStatus,
    pub reason: String,
    pub message: String,
}

impl DesiredCondition {
    pub fn new(
        type_: ConditionType,
        status: ConditionStatus,
        reason: &str,
        message: impl Into<String>,
    ) -> Self {
        DesiredCondition { type_, status, reason: reason.to_string(), message: message.into() }
    }
}

/// The one way conditions are written, on every kind: `existing` with each
/// desired condition set, the Kubernetes way. `lastTransitionTime` moves
/// only when `status` changes, so an SRE can tell how long something has
/// been stuck, not how long ago we last reconciled; conditions of other
/// types (other owners) are kept untouched and in place.
pub fn merge(
    existing: &[Condition],
    desired: &[DesiredCondition],
    now: Timestamp,
    generation: Option<i64>,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = existing.to_vec();
    for d in desired {
        let type_ = d.type_.as_str();
        let status = d.status.as_str();
        match out.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => {
                if c.status != status {
                    c.last_transition_time = Time(now);
                    c.status = status.to_string();
                }
                c.reason = d.reason.to_string();
                c.message = d.message.clone();
                c.observed_generation = generation;
            }
            None => out.push(Condition {
                type_: type_.to_string(),
                status: status.to_string(),
                reason: d.reason.to_string(),
                message: d.message.clone(),
                last_transition_time: Time(now),
                observed_generation: generation,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want(status: ConditionStatus, reason: &'static str) -> DesiredCondition {
        DesiredCondition::new(ConditionType::Tested, status, reason, "")
    }

    #[test]
    fn transition_time_moves_only_with_status() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let t2 = Timestamp::from_second(3_000).unwrap();
        let a = merge(&[], &[want(ConditionStatus::False, "Running")], t0, Some(1));
        let b = merge(&a, &[want(ConditionStatus::False, "WaitingForAgent")], t1, Some(2));
        assert_eq!(b[0].last_transition_time.0, t0, "same status keeps the time");
        assert_eq!(b[0].reason, "WaitingForAgent");
        assert_eq!(b[0].observed_generation, Some(2));
        let c = merge(&b, &[want(ConditionStatus::True, "Passed")], t2, Some(2));
        assert_eq!(c[0].last_transition_time.0, t2);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn foreign_conditions_are_kept() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let foreign = Condition {
            type_: "AgentConnected".into(),
            status: "True".into(),
            reason: "Connected".into(),
            message: String::new(),
            last_transition_time: Time(t0),
            observed_generation: None,
        };
        let out = merge(std::slice::from_ref(&foreign), &[want(ConditionStatus::True, "Passed")], t0, None);
        assert_eq!(out[0], foreign);
        assert_eq!(out[1].type_, "Tested");
    }

    #[test]
    fn a_stored_condition_type_is_its_name() {
        use ConditionType as T;
        for t in [
            T::Onboarded,
            T::Tested,
            T::SchedulingEnabled,
            T::Evicted,
            T::Aborted,
            T::Deleting,
            T::AgentConnected,
            T::NodeHealthy,
            T::Fenced,
            T::Preflight,
            T::Target,
            T::HostDisabled,
            T::HostFenced,
            T::Paused,
            T::HostPaused,
            T::Machine,
            T::UpdateDrain,
            T::PowerState,
            T::Ready,
        ] {
            let stored = serde_json::to_value(t).unwrap();
            assert_eq!(stored, serde_json::json!(t.as_str()));
            assert_eq!(serde_json::from_value::<ConditionType>(stored).unwrap(), t);
        }
    }
}
