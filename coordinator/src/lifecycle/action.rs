//! The operations the shell executes for a decision. Each is idempotent.

use std::collections::BTreeSet;
use std::fmt;

use crate::api::EvictionReason;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Disable the compute service in Nova (`os-services`, status disabled)
    /// with a reason operators can read.
    DisableService { reason: String },
    /// Enable the compute service in Nova: VMs may land on the host.
    EnableService,
    /// Add the host to a Nova host aggregate.
    AddAggregate { name: String },
    /// Remove the host from a Nova host aggregate.
    RemoveAggregate { name: String },
    /// Add traits to the host's Placement resource provider (with its generation).
    AddTraits { traits: BTreeSet<String> },
    /// Remove traits from the host's Placement resource provider.
    RemoveTraits { traits: BTreeSet<String> },
    /// Ask the node's agent to run the validation checks for this run.
    RunChecks { run: u64 },
    /// Create an Eviction for this node, owned by the Hypervisor.
    CreateEviction { name: String, reason: EvictionReason },
    /// Delete (cancel) an Eviction: in-flight migrations are aborted.
    CancelEviction { name: String },
    /// Delete the compute service from Nova (and with it the resource provider).
    DeleteService { service_id: String },
    /// Ask the host's BMC to power it off (docs/power.md): sent once, read
    /// back by later reconciles. Not idempotent on every BMC: the shell
    /// records the state it leads to before it asks.
    PowerOff,
    /// Ask the host's BMC to power it on; likewise sent once.
    PowerOn,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::DisableService { reason } => write!(f, "disable compute service ({reason})"),
            Action::EnableService => write!(f, "enable compute service"),
            Action::AddAggregate { name } => write!(f, "add to aggregate {name}"),
            Action::RemoveAggregate { name } => write!(f, "remove from aggregate {name}"),
            Action::AddTraits { traits } => write!(f, "add traits {}", join(traits)),
            Action::RemoveTraits { traits } => write!(f, "remove traits {}", join(traits)),
            Action::RunChecks { run } => write!(f, "run checks (run {run})"),
            Action::CreateEviction { name, reason } => {
                write!(f, "create eviction {name} ({})", reason.as_str())
            }
            Action::CancelEviction { name } => write!(f, "cancel eviction {name}"),
            Action::DeleteService { service_id } => {
                write!(f, "delete compute service {service_id}")
            }
            Action::PowerOff => write!(f, "power off through the BMC"),
            Action::PowerOn => write!(f, "power on through the BMC"),
        }
    }
}

fn join(set: &BTreeSet<String>) -> String {
    set.iter().map(String::as_str).collect::<Vec<_>>().join(",")
}
