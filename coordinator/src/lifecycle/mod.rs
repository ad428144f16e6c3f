//! The hypervisor lifecycle as a pure function (docs/lifecycle.md;
//! docs/decisions/0001 for the shape).
//!
//! [`decide`] maps (spec, status, observations, policy, now) to a
//! [`Decision`]: the phase to be in, the conditions this controller owns, the
//! actions the shell must execute, and the bookkeeping to record. It does no
//! I/O and never reads the clock (`now` is an input), so every transition can
//! be tested exhaustively. The whole state machine is in [`decide`](decide.rs);
//! the other modules hold its vocabulary.
//!
//! Rules the shell relies on:
//! - At most one phase transition per call; after a transition the shell
//!   records status and calls again.
//! - Every action is idempotent: executing one twice, or after a crash, is
//!   harmless. The shell may therefore execute the actions of a decision
//!   whose status write failed, and simply decide again.

mod action;
mod decide;
pub mod deletion;
pub mod dependencies;
pub mod disables;
pub mod hands;
pub mod host_traits;
pub mod machine;
mod observe;

pub use crate::api::condition::DesiredCondition;
pub use action::Action;
pub use decide::{
    ADOPTED_CHECKS_FAILED, ALLOWED_TRANSITIONS, DISABLED_ELSEWHERE, DRIFT_REPAIRED, Decision,
    HIBERNATING_REASON, HOST_ADOPTED, HOST_UNSEEN, Input, MACHINE_MISMATCH, NOVA_ENABLES_NEW_SERVICES,
    NOVA_HOST_CLAIMED, Policy, SERVICE_RE_REGISTERED, Transition, Warning, decide, nova_host, valid_trait,
};
pub use observe::{
    AgentObs, CheckReport, EvictionObs, HealthObs, NodeObs, NovaHost, NovaObs, Observations, PowerObs,
    ServiceState, close_hosts,
};

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod props;
#[cfg(test)]
mod table;

/// The phase a host counts as among the hosts in service (the limit on
/// hosts held for updates): an adopted host on its way in (Onboarding,
/// Testing) was found in service, and counts as Active; so does one its
/// next look adopts (`nova`: what Nova shows of it now).
pub fn service_phase(status: &crate::api::HypervisorStatus, nova: &NovaObs) -> crate::api::Phase {
    use crate::api::Phase;
    let phase = status.phase.unwrap_or_default();
    let found_in_service = matches!(nova, NovaObs::Registered(h) if h.enabled && !h.instances.is_empty());
    let adopts = status.lifecycle.adopted || (status.lifecycle.test_run == 0 && found_in_service);
    if adopts && matches!(phase, Phase::Onboarding | Phase::Testing) { Phase::Active } else { phase }
}

/// Whether a host in `phase` must have its agent connected: one in
/// Maintenance may be down for its work, one in Onboarding has none yet,
/// and a Decommissioned or Aborted one is not in service. Health is judged,
/// and an agent counted missing, only in these phases.
pub fn expects_agent(phase: crate::api::Phase) -> bool {
    use crate::api::Phase;
    matches!(phase, Phase::Testing | Phase::Ready | Phase::Active | Phase::Evicting)
}

/// Whether the host's health is judged (and its agent counted missing):
/// in a phase that expects its agent, and powered as in service. A host
/// being hibernated, hibernated or being woken is disabled and empty, its
/// agent and kubelet down on purpose: never judged Failed, never fenced
/// (docs/power.md).
pub fn judged(phase: crate::api::Phase, power: Option<crate::api::power::HostPower>) -> bool {
    expects_agent(phase) && power.is_none_or(crate::api::power::HostPower::in_service)
}
