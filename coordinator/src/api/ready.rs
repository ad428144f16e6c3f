//! The summary `Ready` condition of a Hypervisor and of an Eviction: one
//! condition that says whether the object is where it should be, so that
//! `kubectl wait --for=condition=Ready` and status tools that read a
//! summary condition work, and so that `kubectl get` shows why not in one
//! column. It is computed from the object's other conditions and phase
//! each time its status is written, never decided on its own; so are
//! kstatus's `Reconciling` and `Stalled`, which status tools such as
//! Helm's wait read.
//!
//! A Hypervisor is Ready when it is in service: Active, enabled in Nova,
//! its agent connected and its health not lost. An Eviction is Ready when
//! it succeeded (its host is emptied), or, a dry run, when its plan is made.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::condition::{ConditionStatus, ConditionType, DesiredCondition};
use super::eviction::{EvictionPhase, EvictionStatus};
use super::hypervisor::{HypervisorStatus, Phase};

/// Why a Hypervisor is or is not Ready: the `Ready` condition's reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostReady {
    /// Active, enabled in Nova, its agent connected, its health not lost.
    InService,
    /// Being registered with Nova (phases Initial and Onboarding).
    Onboarding,
    /// Its validation checks run.
    Testing,
    /// Tested; its compute service is about to be enabled.
    Enabling,
    /// Stopped on an error until an SRE retries it.
    Aborted,
    /// Its VMs are being moved off.
    Evicting,
    /// Emptied and held for maintenance work.
    InMaintenance,
    /// A fencing is under way, stuck, or done and not yet cleared.
    Fencing,
    /// Active, but its agent's session is down.
    AgentDisconnected,
    /// Active, but its health is lost or degraded.
    Unhealthy,
    /// Active, but not enabled in Nova.
    SchedulingDisabled,
    /// Active, hibernated or on its way there or back (docs/power.md).
    PowerManaged,
    /// Removed from Nova; the object is the record.
    Decommissioned,
}

impl HostReady {
    pub const ALL: [HostReady; 13] = [
        HostReady::InService,
        HostReady::Onboarding,
        HostReady::Testing,
        HostReady::Enabling,
        HostReady::Aborted,
        HostReady::Evicting,
        HostReady::InMaintenance,
        HostReady::Fencing,
        HostReady::AgentDisconnected,
        HostReady::Unhealthy,
        HostReady::SchedulingDisabled,
        HostReady::PowerManaged,
        HostReady::Decommissioned,
    ];

    pub const fn reason(self) -> &'static str {
        match self {
            HostReady::InService => "InService",
            HostReady::Onboarding => "Onboarding",
            HostReady::Testing => "Testing",
            HostReady::Enabling => "Enabling",
            HostReady::Aborted => "Aborted",
            HostReady::Evicting => "Evicting",
            HostReady::InMaintenance => "InMaintenance",
            HostReady::Fencing => "Fencing",
            HostReady::AgentDisconnected => "AgentDisconnected",
            HostReady::Unhealthy => "Unhealthy",
            HostReady::SchedulingDisabled => "SchedulingDisabled",
            HostReady::PowerManaged => "PowerManaged",
            HostReady::Decommissioned => "Decommissioned",
        }
    }

    /// What an SRE does next, in one line (`hvctl why`).
    pub const fn next_step(self) -> &'static str {
        match self {
            HostReady::InService => "nothing: the host is in service",
            HostReady::Onboarding => {
                "wait for nova-compute to register the host; the Onboarded condition names what is missing"
            }
            HostReady::Testing => "wait for the checks; the Tested condition names a failing one",
            HostReady::Enabling => "wait: the compute service is enabled at the next look",
            HostReady::Aborted => "fix the cause the Aborted condition names, then `hvctl retry NODE`",
            HostReady::Evicting => "follow the eviction: `hvctl evictions NODE`",
            HostReady::InMaintenance => "do the work, then `hvctl maintenance clear NODE`",
            HostReady::Fencing => {
                "repair the host and `hvctl clear-fenced NODE`, or `hvctl retire NODE`; a stuck step: \
                 `hvctl retry NODE` or `hvctl confirm-fenced NODE`"
            }
            HostReady::AgentDisconnected => {
                "look at the agent pod on the node: `kubectl get pods -A -o wide \
                 --field-selector spec.nodeName=NODE`"
            }
            HostReady::Unhealthy => "read the NodeHealthy condition's evidence (`hvctl get NODE`)",
            HostReady::SchedulingDisabled => {
                "read the SchedulingEnabled condition: it says who holds the host"
            }
            HostReady::PowerManaged => {
                "read the PowerState condition: hibernated (`hvctl wake NODE`), or on its way there or back"
            }
            HostReady::Decommissioned => "nothing: the host is retired; delete the Hypervisor to forget it",
        }
    }
}

/// Whether the Hypervisor whose status is `s` is in service, and if not,
/// why, with the condition that holds it (the first that is not as
/// service needs it).
pub fn host(s: &HypervisorStatus) -> (HostReady, Option<&Condition>) {
    let find = |t: ConditionType| s.conditions.iter().find(|c| c.type_ == t.as_str());
    let not_true = |t: ConditionType| find(t).filter(|c| c.status != "True");
    let phase = s.phase.unwrap_or_default();
    if phase == Phase::Decommissioned {
        return (HostReady::Decommissioned, None);
    }
    if let Some(c) = find(ConditionType::Fenced) {
        return (HostReady::Fencing, Some(c));
    }
    match phase {
        Phase::Initial | Phase::Onboarding => (HostReady::Onboarding, not_true(ConditionType::Onboarded)),
        Phase::Testing => (HostReady::Testing, not_true(ConditionType::Tested)),
        Phase::Ready => (HostReady::Enabling, not_true(ConditionType::SchedulingEnabled)),
        Phase::Aborted => (HostReady::Aborted, find(ConditionType::Aborted)),
        Phase::Evicting => (HostReady::Evicting, not_true(ConditionType::Evicted)),
        Phase::Maintenance => (HostReady::InMaintenance, find(ConditionType::Evicted)),
        Phase::Active => active(s),
        Phase::Decommissioned => (HostReady::Decommissioned, None),
    }
}

fn active(s: &HypervisorStatus) -> (HostReady, Option<&Condition>) {
    let lost = |t: ConditionType| s.conditions.iter().find(|c| c.type_ == t.as_str() && c.status == "False");
    // Its agent and kubelet down on purpose: the power says why.
    if s.power_state.is_some_and(|p| !p.in_service()) {
        let power = s.conditions.iter().find(|c| c.type_ == ConditionType::PowerState.as_str());
        return (HostReady::PowerManaged, power);
    }
    if let Some(c) = lost(ConditionType::AgentConnected) {
        return (HostReady::AgentDisconnected, Some(c));
    }
    if let Some(c) = lost(ConditionType::NodeHealthy) {
        return (HostReady::Unhealthy, Some(c));
    }
    if let Some(c) = lost(ConditionType::SchedulingEnabled) {
        return (HostReady::SchedulingDisabled, Some(c));
    }
    (HostReady::InService, None)
}

/// The Hypervisor's `Ready` condition.
pub fn host_condition(s: &HypervisorStatus) -> DesiredCondition {
    let (why, holding) = host(s);
    let status = ConditionStatus::from(why == HostReady::InService);
    DesiredCondition::new(ConditionType::Ready, status, why.reason(), said(holding))
}

/// The Hypervisor's summary conditions: `Ready`, and kstatus's
/// `Reconciling` (True while the host moves towards what its spec asks:
/// onboarding, testing, enabling, evicting) and `Stalled` (True while it
/// waits on an SRE: Aborted, or a fencing step not confirmed), which
/// status tools such as Helm's wait read.
pub fn host_conditions(s: &HypervisorStatus) -> [DesiredCondition; 3] {
    let (why, _) = host(s);
    let reconciling = match why {
        HostReady::Onboarding => "Onboarding",
        HostReady::Testing => "Testing",
        HostReady::Enabling => "Enabling",
        HostReady::Evicting => "Evicting",
        _ => SETTLED,
    };
    let moving = reconciling != SETTLED;
    let fenced = s.conditions.iter().find(|c| c.type_ == ConditionType::Fenced.as_str());
    let stuck = fenced.is_some_and(|c| c.reason == crate::fence::decide::STUCK);
    let stalled = if why == HostReady::Aborted {
        "Aborted"
    } else if stuck {
        FENCING_STUCK
    } else {
        NOT_STALLED
    };
    [
        host_condition(s),
        DesiredCondition::new(ConditionType::Reconciling, ConditionStatus::from(moving), reconciling, ""),
        DesiredCondition::new(
            ConditionType::Stalled,
            ConditionStatus::from(stalled != NOT_STALLED),
            stalled,
            "",
        ),
    ]
}

/// `Reconciling` False: nothing under way towards the spec.
pub const SETTLED: &str = "Settled";
/// `Stalled` False: nothing waits on an SRE.
pub const NOT_STALLED: &str = "NotStalled";
/// `Stalled` True: a fencing step was not confirmed.
pub const FENCING_STUCK: &str = "FencingStuck";

/// The condition types this module writes: none of them is a cause.
pub const SUMMARY_TYPES: [ConditionType; 3] =
    [ConditionType::Ready, ConditionType::Reconciling, ConditionType::Stalled];

fn summary(type_: &str) -> bool {
    SUMMARY_TYPES.iter().any(|t| t.as_str() == type_)
}

/// Why an Eviction is or is not Ready: the `Ready` condition's reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvictionReady {
    /// Every VM is in a final state: the host is emptied.
    Succeeded,
    /// Not begun, or its preflight, disabling or migrations are under way.
    InProgress,
    /// Stopped; its conditions say why.
    Failed,
    /// Deleted while it ran.
    Cancelled,
    /// A dry run whose preflight ran: its plan is recorded.
    Planned,
}

impl EvictionReady {
    pub const ALL: [EvictionReady; 5] = [
        EvictionReady::Succeeded,
        EvictionReady::InProgress,
        EvictionReady::Failed,
        EvictionReady::Cancelled,
        EvictionReady::Planned,
    ];

    pub const fn reason(self) -> &'static str {
        match self {
            EvictionReady::Succeeded => "Succeeded",
            EvictionReady::InProgress => "InProgress",
            EvictionReady::Failed => "Failed",
            EvictionReady::Cancelled => "Cancelled",
            EvictionReady::Planned => "Planned",
        }
    }
}

/// The Eviction's `Ready` condition; its message is that of the first
/// other condition that is not True (what it waits on, or why it failed).
pub fn eviction_condition(s: &EvictionStatus) -> DesiredCondition {
    let why = match s.phase.unwrap_or_default() {
        EvictionPhase::Succeeded => EvictionReady::Succeeded,
        EvictionPhase::Failed => EvictionReady::Failed,
        EvictionPhase::Cancelled => EvictionReady::Cancelled,
        EvictionPhase::Planned => EvictionReady::Planned,
        EvictionPhase::Pending
        | EvictionPhase::Preflight
        | EvictionPhase::Disabling
        | EvictionPhase::Migrating => EvictionReady::InProgress,
    };
    let holding = s.conditions.iter().find(|c| !summary(&c.type_) && c.status != "True");
    let status = ConditionStatus::from(matches!(why, EvictionReady::Succeeded | EvictionReady::Planned));
    let message = match why {
        EvictionReady::Succeeded => s.progress.as_ref().map(|p| format!("{p} moved")).unwrap_or_default(),
        EvictionReady::Planned => s.progress.clone().unwrap_or_default(),
        _ => said(holding),
    };
    DesiredCondition::new(ConditionType::Ready, status, why.reason(), message)
}

/// The Eviction's summary conditions: `Ready`, and kstatus's `Reconciling`
/// (True while it runs) and `Stalled` (True once it failed).
pub fn eviction_conditions(s: &EvictionStatus) -> [DesiredCondition; 3] {
    let phase = s.phase.unwrap_or_default();
    let running = !phase.is_final();
    let failed = phase == EvictionPhase::Failed;
    let reconciling = if running { "InProgress" } else { SETTLED };
    let stalled = if failed { "Failed" } else { NOT_STALLED };
    [
        eviction_condition(s),
        DesiredCondition::new(ConditionType::Reconciling, ConditionStatus::from(running), reconciling, ""),
        DesiredCondition::new(ConditionType::Stalled, ConditionStatus::from(failed), stalled, ""),
    ]
}

/// A condition as one line: `Type (Reason): message`.
fn said(c: Option<&Condition>) -> String {
    match c {
        Some(c) if c.message.is_empty() => format!("{} ({})", c.type_, c.reason),
        Some(c) => format!("{} ({}): {}", c.type_, c.reason, c.message),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn cond(t: ConditionType, status: &str, reason: &str) -> Condition {
        Condition {
            type_: t.as_str().into(),
            status: status.into(),
            reason: reason.into(),
            message: format!("{reason} said"),
            last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
    }

    fn host_in(phase: Phase, conditions: Vec<Condition>) -> HypervisorStatus {
        HypervisorStatus { phase: Some(phase), conditions, ..Default::default() }
    }

    fn serving() -> Vec<Condition> {
        vec![
            cond(ConditionType::SchedulingEnabled, "True", "Enabled"),
            cond(ConditionType::AgentConnected, "True", "Connected"),
            cond(ConditionType::NodeHealthy, "True", "Healthy"),
        ]
    }

    #[test]
    fn only_an_active_enabled_connected_healthy_host_is_ready() {
        let c = host_condition(&host_in(Phase::Active, serving()));
        assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::True, "InService"));
        for phase in Phase::ALL.into_iter().filter(|p| *p != Phase::Active) {
            let c = host_condition(&host_in(phase, serving()));
            assert_eq!(c.status, ConditionStatus::False, "{phase:?}");
        }
    }

    #[test]
    fn an_active_host_names_what_it_lost_first() {
        let cases = [
            (ConditionType::AgentConnected, "Disconnected", HostReady::AgentDisconnected),
            (ConditionType::NodeHealthy, "Unreachable", HostReady::Unhealthy),
            (ConditionType::SchedulingEnabled, "DisabledBySomeoneElse", HostReady::SchedulingDisabled),
        ];
        for (t, reason, want) in cases {
            let mut cs = serving();
            cs.retain(|c| c.type_ != t.as_str());
            cs.push(cond(t, "False", reason));
            let s = host_in(Phase::Active, cs);
            let (why, holding) = host(&s);
            assert_eq!(why, want);
            assert_eq!(holding.map(|c| c.reason.as_str()), Some(reason));
            let c = host_condition(&s);
            assert_eq!(c.message, format!("{} ({reason}): {reason} said", t.as_str()));
        }
    }

    #[test]
    fn a_fencing_outweighs_every_phase_but_decommissioned() {
        for phase in Phase::ALL {
            let mut cs = serving();
            cs.push(cond(ConditionType::Fenced, "False", "InProgress"));
            let (why, _) = host(&host_in(phase, cs));
            let want =
                if phase == Phase::Decommissioned { HostReady::Decommissioned } else { HostReady::Fencing };
            assert_eq!(why, want, "{phase:?}");
        }
    }

    #[test]
    fn a_phase_on_the_way_names_its_own_condition() {
        let s = host_in(Phase::Testing, vec![cond(ConditionType::Tested, "False", "CheckFailed")]);
        assert_eq!(host_condition(&s).message, "Tested (CheckFailed): CheckFailed said");
        let s = host_in(Phase::Aborted, vec![cond(ConditionType::Aborted, "True", "OnboardingFailed")]);
        assert_eq!(host(&s).0, HostReady::Aborted);
        assert_eq!(host_condition(&s).reason, "Aborted");
    }

    #[test]
    fn every_reason_is_distinct_and_has_a_next_step() {
        let mut seen = std::collections::BTreeSet::new();
        for r in HostReady::ALL {
            assert!(seen.insert(r.reason()), "{r:?}");
            assert!(!r.next_step().is_empty());
        }
    }

    #[test]
    fn an_eviction_is_ready_once_it_succeeded_and_says_what_holds_it_before() {
        let mut s = EvictionStatus {
            phase: Some(EvictionPhase::Migrating),
            progress: Some("1/3".into()),
            conditions: vec![
                cond(ConditionType::Ready, "False", "InProgress"),
                cond(ConditionType::Preflight, "True", "Passed"),
                cond(ConditionType::HostDisabled, "False", "Waiting"),
            ],
            ..Default::default()
        };
        let c = eviction_condition(&s);
        assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::False, "InProgress"));
        assert_eq!(c.message, "HostDisabled (Waiting): Waiting said");
        s.phase = Some(EvictionPhase::Failed);
        assert_eq!(eviction_condition(&s).reason, "Failed");
        s.phase = Some(EvictionPhase::Succeeded);
        s.progress = Some("3/3".into());
        let c = eviction_condition(&s);
        assert_eq!(
            (c.status, c.reason.as_str(), c.message.as_str()),
            (ConditionStatus::True, "Succeeded", "3/3 moved")
        );
    }

    #[test]
    fn kstatus_reads_a_host_moving_as_reconciling_and_one_waiting_on_an_sre_as_stalled() {
        let of = |s: &HypervisorStatus| {
            let cs = host_conditions(s);
            (cs[1].status, cs[1].reason.clone(), cs[2].status, cs[2].reason.clone())
        };
        let t = ConditionStatus::True;
        let f = ConditionStatus::False;
        assert_eq!(of(&host_in(Phase::Testing, vec![])), (t, "Testing".into(), f, NOT_STALLED.into()));
        assert_eq!(of(&host_in(Phase::Evicting, vec![])), (t, "Evicting".into(), f, NOT_STALLED.into()));
        assert_eq!(of(&host_in(Phase::Active, serving())), (f, SETTLED.into(), f, NOT_STALLED.into()));
        assert_eq!(of(&host_in(Phase::Maintenance, vec![])), (f, SETTLED.into(), f, NOT_STALLED.into()));
        assert_eq!(of(&host_in(Phase::Aborted, vec![])), (f, SETTLED.into(), t, "Aborted".into()));
        let stuck = vec![cond(ConditionType::Fenced, "False", crate::fence::decide::STUCK)];
        assert_eq!(of(&host_in(Phase::Active, stuck)), (f, SETTLED.into(), t, FENCING_STUCK.into()));
    }

    #[test]
    fn an_eviction_reconciles_while_it_runs_and_stalls_once_it_failed() {
        let of = |phase| {
            let cs = eviction_conditions(&EvictionStatus { phase: Some(phase), ..Default::default() });
            (cs[1].status, cs[2].status)
        };
        let (t, f) = (ConditionStatus::True, ConditionStatus::False);
        assert_eq!(of(EvictionPhase::Migrating), (t, f));
        assert_eq!(of(EvictionPhase::Succeeded), (f, f));
        assert_eq!(of(EvictionPhase::Planned), (f, f));
        assert_eq!(of(EvictionPhase::Failed), (f, t));
    }
}
