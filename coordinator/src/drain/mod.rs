//! Drains and rolling updates (docs/drain.md): what the coordinator says on
//! a hypervisor's Node so that the operators of its dependents (network
//! agents) know when they may take them away ([`locks`]), and the eviction
//! webhook that refuses a drain the host cannot take yet ([`admission`],
//! its decision; [`webhook`], its listener).

pub mod admission;
pub mod locks;
pub mod pods;
pub mod signals;
pub mod webhook;

/// The Node annotation the webhook sets when it refuses a drain of a host
/// not yet evictable: with the Node cordoned, it asks for `auto`
/// maintenance; the coordinator removes it once the Node is uncordoned.
pub const DRAIN_REFUSED: &str = "hypervisor.cloud.sap/drain-refused";

/// The pod label the coordinator sets on the protected pods of a
/// hypervisor Node: `"false"` while the host is not evictable, `"true"`
/// once it is. The chart's PodDisruptionBudgets select the pods not
/// labelled `"true"`, so they hold while the webhook is down ([`pods`]).
pub const POD_EVICTABLE: &str = "hypervisor.cloud.sap/evictable";
