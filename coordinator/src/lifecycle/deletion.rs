//! Deleting a Hypervisor object (docs/lifecycle.md, "Deleting a
//! Hypervisor"). The object carries our finalizer; while it is being deleted
//! the lifecycle goes on as before, and the finalizer is let go only once no
//! VM can depend on the host: the host was decommissioned, never registered
//! in Nova, or registered and never put in service (disabled, no instance).
//!
//! Without this, a `kubectl delete hypervisor` of a host in service, or a
//! Node deleted with `--cascade=foreground` (the garbage collector deletes
//! the dependents first), would drop the record of a host with VMs on it:
//! the Node's termination would find no Hypervisor to drain it.

use super::observe::NovaObs;
use crate::api::condition::DesiredCondition;
use crate::api::{ConditionStatus, ConditionType, Phase};

/// Whether a Hypervisor being deleted may go now; Err says why not, and how
/// an SRE lets it go.
pub fn may_go(phase: Phase, service_id: Option<&str>, nova: &NovaObs) -> Result<(), String> {
    const HOW: &str = "set spec.maintenance: termination (or delete its Node) to decommission the host; \
                       the deletion completes once it is Decommissioned";
    match (phase, nova) {
        (Phase::Decommissioned, _) => Ok(()),
        (_, NovaObs::NotRegistered) if service_id.is_none() => Ok(()),
        (
            Phase::Initial | Phase::Onboarding | Phase::Testing | Phase::Ready | Phase::Aborted,
            NovaObs::Registered(h),
        ) if !h.enabled && h.instances.is_empty() => Ok(()),
        (_, NovaObs::Registered(h)) if !h.instances.is_empty() => {
            Err(format!("held: {} instance(s) run on the host (phase {phase}); {HOW}", h.instances.len()))
        }
        (_, NovaObs::Registered(h)) if h.enabled => {
            Err(format!("held: the host takes new VMs (phase {phase}); {HOW}"))
        }
        (_, NovaObs::Registered(_)) => {
            Err(format!("held: the host is in the lifecycle's care (phase {phase}); {HOW}"))
        }
        (_, NovaObs::NotRegistered) => Err(format!(
            "held: the host's compute service is missing from Nova's list; a down cell may hide it (phase {phase})"
        )),
        (_, NovaObs::Unknown | NovaObs::Unreachable(_) | NovaObs::Rejected(_)) => {
            Err(format!("held: Nova's view of the host is unknown (phase {phase}); waiting for it"))
        }
    }
}

/// The `Deleting` condition of a Hypervisor being deleted.
pub fn condition(verdict: &Result<(), String>) -> DesiredCondition {
    match verdict {
        Ok(()) => DesiredCondition::new(
            ConditionType::Deleting,
            ConditionStatus::True,
            "Released",
            "nothing in Nova depends on the host; the finalizer is let go",
        ),
        Err(why) => {
            DesiredCondition::new(ConditionType::Deleting, ConditionStatus::False, "Held", why.clone())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::NovaHost;

    fn host(enabled: bool, instances: usize) -> NovaObs {
        NovaObs::Registered(NovaHost {
            service_id: "svc-1".into(),
            enabled,
            instances: (0..instances).map(|i| format!("vm-{i}")).collect(),
            ..Default::default()
        })
    }

    #[test]
    fn a_hypervisor_goes_only_when_no_vm_can_depend_on_its_host() {
        let never_in_service =
            [Phase::Initial, Phase::Onboarding, Phase::Testing, Phase::Ready, Phase::Aborted];
        for phase in Phase::ALL {
            let svc = Some("svc-1");
            let decommissioned = phase == Phase::Decommissioned;
            // Decommissioned: always; never registered: always.
            assert_eq!(may_go(phase, None, &NovaObs::NotRegistered), Ok(()), "{phase}");
            assert_eq!(may_go(phase, svc, &NovaObs::Unknown).is_ok(), decommissioned, "{phase}");
            assert_eq!(may_go(phase, svc, &NovaObs::Unreachable("x".into())).is_ok(), decommissioned);
            // Registered and missing now: a down cell, not an empty host.
            assert_eq!(may_go(phase, svc, &NovaObs::NotRegistered).is_ok(), decommissioned, "{phase}");
            // Instances on it, or enabled: held.
            let busy = may_go(phase, svc, &host(false, 2));
            assert_eq!(busy.is_ok(), decommissioned, "{phase}");
            if !decommissioned {
                assert!(busy.unwrap_err().contains("2 instance(s)"));
            }
            assert_eq!(may_go(phase, svc, &host(true, 0)).is_ok(), decommissioned, "{phase}");
            // Disabled and empty: only a host that was never in service.
            let idle = may_go(phase, svc, &host(false, 0)).is_ok();
            assert_eq!(idle, decommissioned || never_in_service.contains(&phase), "{phase}");
        }
        let held = may_go(Phase::Active, Some("svc-1"), &host(true, 1)).unwrap_err();
        assert!(held.contains("spec.maintenance: termination"), "the way out is named: {held}");
        assert_eq!(condition(&Err(held)).reason, "Held");
    }
}
