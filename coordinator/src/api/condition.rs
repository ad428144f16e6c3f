//! Condition types and the one controller that owns each.
//!
//! Kubernetes API conventions: `type`, `status`, `reason`, `message`,
//! `lastTransitionTime`, `observedGeneration`. Each type has exactly one
//! owner; a writer never touches a condition it does not own.

use std::fmt;

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
}

/// The condition types of all three kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
    /// Hypervisor: an agent session is live.
    AgentConnected,
    /// Hypervisor: the HA detector considers the node alive.
    NodeHealthy,
    /// Eviction: the preflight checks passed.
    PreflightPassed,
    /// Eviction: every VM reached a final state.
    Complete,
}

impl ConditionType {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionType::Onboarded => "Onboarded",
            ConditionType::Tested => "Tested",
            ConditionType::SchedulingEnabled => "SchedulingEnabled",
            ConditionType::Evicted => "Evicted",
            ConditionType::Aborted => "Aborted",
            ConditionType::AgentConnected => "AgentConnected",
            ConditionType::NodeHealthy => "NodeHealthy",
            ConditionType::PreflightPassed => "PreflightPassed",
            ConditionType::Complete => "Complete",
        }
    }

    pub fn owner(self) -> Owner {
        match self {
            ConditionType::Onboarded
            | ConditionType::Tested
            | ConditionType::SchedulingEnabled
            | ConditionType::Evicted
            | ConditionType::Aborted => Owner::Lifecycle,
            ConditionType::AgentConnected => Owner::Fleet,
            ConditionType::NodeHealthy => Owner::Ha,
            ConditionType::PreflightPassed | ConditionType::Complete => Owner::Eviction,
        }
    }
}

impl fmt::Display for ConditionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
