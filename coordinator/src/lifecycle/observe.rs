//! What the shell observed before calling [`decide`](super::decide): the
//! Node, the agent session, the latest check report, Nova's view of the
//! host, the eviction that concerns the node, and the retry annotation.

use std::collections::BTreeSet;

use crate::api::EvictionReason;
use crate::api::eviction::EvictionPhase;
use crate::api::hypervisor::{CheckResultStatus, HealthState};

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
    /// When Nova shows no compute service under the host's name: the ones
    /// that look like it, each with why ("compute-4 (same short name)").
    pub close_hosts: Vec<String>,
    /// The host's health as judged in this reconcile (docs/health.md);
    /// None when it was not judged now (the coordinator blind or just
    /// taken over, or a phase that is not judged): then nothing is done
    /// for health, and what was done stands.
    pub health: Option<HealthObs>,
    /// Set when an update's ask of a host in service must wait: as many
    /// hosts as `--update-max-held` allows are held for updates already
    /// (docs/drain.md), with why. A host already held keeps its place.
    pub update_wait: Option<String>,
    /// Another Hypervisor holds the Nova host this one names (its record
    /// names that host): its name. Looked at only while this one has not
    /// recorded a Nova host of its own.
    pub claimed_by: Option<String>,
    /// The host name libvirt gives on the node's machine, as its agent
    /// reported it (this session's report, else the last one recorded).
    pub machine_hostname: Option<String>,
    /// The standard traits the host's capabilities give its provider
    /// (`lifecycle::host_traits`), from the agent's latest report; None
    /// while none is known: the ones added stay as they are.
    pub host_traits: Option<std::collections::BTreeSet<String>>,
    /// What the host's dependency pods lack (`lifecycle::dependencies`),
    /// one line each; empty when every one has a Ready pod there (or none
    /// is configured). None while their pods are not read yet.
    pub dependencies: Option<Vec<String>>,
    /// The host's BMC, as far as its power is concerned (docs/power.md).
    pub power: PowerObs,
}

/// The host's BMC: whether it has one, and its power as read in this
/// reconcile (read only while a power change is awaited).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PowerObs {
    pub bmc: bool,
    pub reading: crate::power::machine::Power,
}

/// A health verdict, as far as the lifecycle acts on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthObs {
    pub state: HealthState,
    /// When the host entered the state (None: not known).
    pub since: Option<jiff::Timestamp>,
    /// What it rests on in one line (the first critical signal of a
    /// Degraded host), for Nova's disabled reason.
    pub summary: String,
    /// Set when the fleet gate holds back new unseen holds (too many hosts
    /// lost at once: docs/health.md), with why.
    pub hold_back: Option<String>,
    /// A Degraded verdict that asks for the host to be emptied (not one
    /// resting only on a dependency not Ready).
    pub empties: bool,
}

/// The Kubernetes Node the hypervisor is named after.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeObs {
    Present {
        ready: bool,
        /// `spec.unschedulable`: cordoned (by an SRE, or by an update
        /// tool about to drain it).
        cordoned: bool,
        /// The update protocol's annotation
        /// (`hypervisor.cloud.sap/maintenance-required`) is set: an update
        /// tool asks for the host to be emptied (docs/drain.md).
        maintenance_required: bool,
        /// The eviction webhook refused a drain of the Node's protected
        /// pods while the host was not evictable, and marked the Node
        /// (`hypervisor.cloud.sap/drain-refused`): an ask while the Node
        /// stays cordoned, so its uncordon ends it (docs/drain.md).
        drain_refused: bool,
    },
    /// The Node has a deletionTimestamp: a Node termination, which
    /// the lifecycle treats as `spec.maintenance: termination`.
    Deleting,
    /// Confirmed absent by a direct read. Not treated as termination: a Node
    /// that re-registers under the same name must not find its host deleted.
    Absent,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AgentObs {
    pub connected: bool,
    /// The domains its agent reports (None: no report in this session).
    pub domains: Option<u32>,
    /// When its session opened (None: never).
    pub since: Option<jiff::Timestamp>,
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
    /// The hypervisor record's host name: what Nova's libvirt driver read
    /// from libvirt on the machine whose nova-compute registered it.
    pub hypervisor_hostname: Option<String>,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    /// Whether nova-compute is alive, as Nova sees it (for health only).
    pub service_state: ServiceState,
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

/// nova-compute's liveness as Nova's service group sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ServiceState {
    #[default]
    Unknown,
    Up,
    Down,
    /// `forced_down` set: Nova treats it as down whatever it reports.
    ForcedDown,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EvictionObs {
    pub name: String,
    pub reason: EvictionReason,
    /// Re-enable when done, after the rule for the reason and the
    /// eviction's options.
    pub re_enable: bool,
    pub phase: EvictionPhase,
    pub message: String,
    pub migrated: u32,
    pub total: u32,
    /// The object has a deletionTimestamp (being cancelled).
    pub deleting: bool,
}

impl EvictionObs {
    /// Not in a final phase (a running one being cancelled still runs).
    pub fn is_running(&self) -> bool {
        !self.phase.is_final()
    }

    /// Running and not being cancelled.
    pub fn is_active(&self) -> bool {
        self.is_running() && !self.deleting
    }
}

/// Compute services that look like `host` when Nova has none by that name:
/// the same short name (the first DNS label, case aside), or the host name
/// the node's agent reports (or its short name). Each with why, for the
/// `Onboarded` condition. Pure; the shell lists the services.
pub fn close_hosts(host: &str, agent_hostname: Option<&str>, services: &[String]) -> Vec<String> {
    let short = |h: &str| h.split('.').next().unwrap_or(h).to_ascii_lowercase();
    let mut out = Vec::new();
    for s in services.iter().filter(|s| s.as_str() != host) {
        let why = if short(s) == short(host) {
            Some(format!("same short name as {host}"))
        } else {
            agent_hostname
                .filter(|a| !a.is_empty() && (s.eq_ignore_ascii_case(a) || short(s) == short(a)))
                .map(|a| format!("the node's agent reports host name {a}"))
        };
        if let Some(why) = why {
            out.push(format!("{s} ({why})"));
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::close_hosts;

    fn hosts(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn short_names_and_the_agents_host_name_are_close_others_are_not() {
        let services = hosts(&["compute-4", "compute-40", "Compute-5.lab", "db-1", "hv17.rack3"]);
        assert_eq!(
            close_hosts("compute-4.example.local", None, &services),
            vec!["compute-4 (same short name as compute-4.example.local)"]
        );
        assert_eq!(
            close_hosts("compute-5", None, &services),
            vec!["Compute-5.lab (same short name as compute-5)"]
        );
        assert_eq!(
            close_hosts("node-17", Some("hv17.rack3.example"), &services),
            vec!["hv17.rack3 (the node's agent reports host name hv17.rack3.example)"]
        );
        assert!(close_hosts("compute-4", None, &services).is_empty(), "an exact match is not 'close'");
        assert!(close_hosts("compute-7", Some(""), &services).is_empty());
    }
}
