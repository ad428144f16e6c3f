//! What the shell observed before calling [`decide`](super::decide): the
//! Node, the agent session, the latest check report, Nova's view of the
//! host, the eviction that concerns the node, and the retry annotation.

use std::collections::BTreeSet;

use crate::api::EvictionReason;
use crate::api::eviction::EvictionPhase;
use crate::api::hypervisor::CheckResultStatus;

#[derive(Clone, Debug, PartialEq)]
pub struct Observations {
    pub node: NodeObs,
    pub agent: AgentObs,
    /// The latest check report the agent sent, for whatever run.
    pub checks: Option<CheckReport>,
    pub nova: NovaObs,
    /// The Eviction that concerns this node: the one named in
    /// `status.lifecycle.eviction` if it exists, else a running one that
    /// targets the node.
    pub eviction: Option<EvictionObs>,
    /// Value of the `hypervisor.cloud.sap/retry` annotation.
    pub retry: Option<String>,
}

/// The Kubernetes Node the hypervisor is named after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeObs {
    Present {
        ready: bool,
    },
    /// The Node has a deletionTimestamp: seed 000's "Node Termination", which
    /// the lifecycle treats as `spec.maintenance: termination`.
    Deleting,
    /// Confirmed absent by a direct read. Not treated as termination: a Node
    /// that re-registers under the same name must not find its host deleted.
    Absent,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AgentObs {
    pub connected: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CheckReport {
    /// The test run this report answers (RunChecks.run).
    pub run: u64,
    pub results: Vec<CheckResultStatus>,
}

/// Nova's view of the host.
#[derive(Clone, Debug, PartialEq)]
pub enum NovaObs {
    /// Not queried yet in this process.
    Unknown,
    /// Nova or Placement did not answer (timeout, 5xx, connection refused).
    Unreachable(String),
    /// Keystone rejected our credentials (401/403).
    Rejected(String),
    /// No nova-compute service with this host name.
    NotRegistered,
    Registered(NovaHost),
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct NovaHost {
    pub service_id: String,
    /// None until nova-compute has reported its resources for the first time.
    pub hypervisor_id: Option<String>,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    /// Aggregates the host is a member of.
    pub aggregates: BTreeSet<String>,
    /// Aggregates named in spec that do not exist in Nova.
    pub unknown_aggregates: BTreeSet<String>,
    /// Traits on the host's resource provider; None while the provider is
    /// not visible in Placement yet.
    pub traits: Option<BTreeSet<String>>,
    /// UUIDs of the instances on the host (servers list with `host` filter
    /// at our compute microversion, not a usage field that vanished).
    pub instances: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct EvictionObs {
    pub name: String,
    pub reason: EvictionReason,
    /// Re-enable when done, after seed 000's rule for the reason and the
    /// eviction's options.
    pub re_enable: bool,
    pub phase: EvictionPhase,
    pub message: String,
    pub migrated: u32,
    pub total: u32,
    /// The object has a deletionTimestamp (being cancelled).
    pub deleting: bool,
}
