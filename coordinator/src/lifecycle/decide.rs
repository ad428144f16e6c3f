//! The lifecycle of one hypervisor, in one place (docs/lifecycle.md).
//!
//! ```text
//! Initial ─▶ Onboarding ─▶ Testing ─▶ Ready ─▶ Active ◀──────────────┐
//!               ▲   │         │ (skipTests: Onboarding ─▶ Ready)    │ eviction over,
//!               │   ▼         ▼                                     │ re-enable
//!               │  Aborted ◀──┘  (left only by an explicit retry)   │
//!               │                              Active ─▶ Evicting ──┤
//!   maintenance │                                 │         │       │
//!   cleared     │                  (no VMs)       ▼         ▼       │
//!               └──────────────────────────── Maintenance ◀─┘       │
//!                                                           Evicting ─▶ Decommissioned
//! ```
//!
//! Maintenance exits through Onboarding (docs/decisions/0008), so the
//! checks run again and the aggregates and traits are re-verified.
//!
//! Safety rules encoded here, and checked by the property tests in `props.rs`:
//! - `EnableService` is emitted only in Ready (after passed checks or
//!   skipTests), Active, and Evicting (a re-enabling eviction of an Active node).
//! - Before Ready, a compute service Nova shows enabled is disabled: Nova
//!   enables new services by default, and no VM may land before the checks pass.
//! - `DeleteService` is emitted only when the current observation shows no
//!   instance, and Decommissioned is reached only after that delete.
//! - Aborted is left only through a retry token not handled before.
//! - An Active host held for being unseen (docs/health.md) is enabled only
//!   on a pass of the test run started after it was seen again (or with
//!   skipTests), never by drift repair or the end of an eviction.

mod power;

pub use power::HIBERNATING_REASON;

use std::collections::BTreeSet;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::action::Action;
use super::disables;
use super::host_traits;
use super::machine::{self, Machine, Unknown as MachineUnknown};
use super::observe::{EvictionObs, NodeObs, NovaHost, NovaObs, Observations, ServiceState};
use crate::api::condition::DesiredCondition;
use crate::api::eviction::{EvictionPhase, EvictionReason};
use crate::api::hypervisor::{
    AbortRecord, CheckResultStatus, EvictionRef, HealthState, HypervisorSpec, HypervisorStatus,
    LifecycleRecord, UnseenHold,
};
use crate::api::keys::NOVA_HOST_ANNOTATION;
use crate::api::{ConditionStatus, ConditionType, MaintenanceMode, Phase};

/// Tunables of the lifecycle (coordinator flags).
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    /// How long Onboarding waits for nova-compute to register before Aborted.
    pub registration_timeout: SignedDuration,
    /// How long Testing waits for a check report before Aborted (and a
    /// recheck before it counts as failed).
    pub checks_timeout: SignedDuration,
    /// How long an Active host may be Unreachable or Failed (from the
    /// recorded `since`) before it is disabled in Nova (docs/health.md).
    pub unreachable_grace: SignedDuration,
    /// A cordoned Node starts `auto` maintenance (its uncordon ends it):
    /// where update tools cordon before they drain (docs/drain.md).
    pub cordon_starts_maintenance: bool,
    /// How long each step of a hibernation or a wake may take before it
    /// is an error state (docs/power.md).
    pub power: crate::power::machine::Limits,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            registration_timeout: SignedDuration::from_mins(15),
            checks_timeout: SignedDuration::from_mins(10),
            unreachable_grace: SignedDuration::from_mins(5),
            cordon_starts_maintenance: false,
            power: crate::power::machine::Limits::default(),
        }
    }
}

/// Everything [`decide`] looks at.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    /// Hypervisor (= Node = Nova host) name.
    pub name: &'a str,
    pub spec: &'a HypervisorSpec,
    pub status: &'a HypervisorStatus,
    pub obs: &'a Observations,
    pub policy: &'a Policy,
    pub now: Timestamp,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub from: Phase,
    pub to: Phase,
    /// Why, for the Kubernetes Event and the log.
    pub reason: String,
}

/// What the shell must do and record.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub phase: Phase,
    /// When `phase` was entered (now, on a transition).
    pub phase_since: Option<Time>,
    pub transition: Option<Transition>,
    pub actions: Vec<Action>,
    /// The five conditions this controller owns, always all of them.
    pub conditions: Vec<DesiredCondition>,
    pub record: LifecycleRecord,
    pub service_id: Option<String>,
    pub hypervisor_id: Option<String>,
    /// New check results to store, when a report for the current run arrived.
    pub checks: Option<Vec<CheckResultStatus>>,
    /// Where the host's power stands (`status.powerState`); None while it
    /// was never asked to hibernate.
    pub power_state: Option<crate::api::power::HostPower>,
    /// What an SRE should hear about even though nothing failed: Nova
    /// changed behind our back and is being repaired, Nova enables new
    /// services, a decommissioned host registered again. One Warning Event each.
    pub warnings: Vec<Warning>,
}

/// A Warning Event the shell records: its reason and note.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    pub reason: &'static str,
    pub message: String,
}

/// Warning reasons (the Event's `reason`, for alerts and `kubectl get events`).
pub const DRIFT_REPAIRED: &str = "DriftRepaired";
pub const NOVA_ENABLES_NEW_SERVICES: &str = "NovaEnablesNewServices";
pub const SERVICE_RE_REGISTERED: &str = "ServiceReRegistered";
pub const HOST_UNSEEN: &str = "HostUnseenDisabled";
/// A disable by anyone else, respected (docs/lifecycle.md, "Who owns a disable").
pub const DISABLED_ELSEWHERE: &str = "DisabledElsewhere";
/// `SchedulingEnabled` reason of a host in Ready whose dependency pods
/// (`--node-dependency`) are not all Ready: it is enabled once they are.
pub const DEPENDENCIES_NOT_READY: &str = "DependenciesNotReady";
/// A host found in service is adopted, not disabled (docs/lifecycle.md,
/// "Adopting a host in service").
pub const HOST_ADOPTED: &str = "HostAdopted";
/// An adopted host's first check run did not pass: reported, the host left
/// in service (docs/lifecycle.md, "Adopting a host in service").
pub const ADOPTED_CHECKS_FAILED: &str = "AdoptedChecksFailed";
/// Another Hypervisor holds the Nova host this one names (docs/lifecycle.md,
/// "One Nova host, one Hypervisor").
pub const NOVA_HOST_CLAIMED: &str = "NovaHostClaimed";
/// The node's machine is not the one that registered its Nova host
/// (docs/lifecycle.md, "One Nova host, one machine").
pub const MACHINE_MISMATCH: &str = "MachineMismatch";

/// The Nova host every Nova call for this Hypervisor uses: the one its
/// compute service was found under, else the one its spec names
/// (docs/lifecycle.md, "Nova host names").
pub fn nova_host<'a>(name: &'a str, spec: &'a HypervisorSpec, status: &'a HypervisorStatus) -> &'a str {
    status.lifecycle.nova_host.as_deref().unwrap_or_else(|| spec.nova_host(name))
}

/// Every transition [`decide`] can make. The property tests check that no
/// other is ever taken; the table tests show each one.
pub const ALLOWED_TRANSITIONS: &[(Phase, Phase)] = &[
    (Phase::Initial, Phase::Onboarding),
    (Phase::Onboarding, Phase::Testing),
    (Phase::Onboarding, Phase::Ready),
    (Phase::Onboarding, Phase::Aborted),
    (Phase::Onboarding, Phase::Maintenance),
    (Phase::Onboarding, Phase::Evicting),
    (Phase::Testing, Phase::Ready),
    (Phase::Testing, Phase::Active),
    (Phase::Testing, Phase::Aborted),
    (Phase::Testing, Phase::Maintenance),
    (Phase::Testing, Phase::Evicting),
    (Phase::Aborted, Phase::Onboarding),
    (Phase::Ready, Phase::Active),
    (Phase::Ready, Phase::Maintenance),
    (Phase::Ready, Phase::Evicting),
    (Phase::Active, Phase::Maintenance),
    (Phase::Active, Phase::Evicting),
    (Phase::Evicting, Phase::Active),
    (Phase::Evicting, Phase::Maintenance),
    (Phase::Evicting, Phase::Onboarding),
    (Phase::Evicting, Phase::Decommissioned),
    (Phase::Maintenance, Phase::Onboarding),
    (Phase::Maintenance, Phase::Evicting),
];

const ONBOARDING_DISABLE_REASON: &str = disables::ONBOARDING;
const RE_REGISTERED_DISABLE_REASON: &str = disables::RE_REGISTERED;

/// Decide the next step for one hypervisor. Pure: same input, same output.
pub fn decide(input: &Input<'_>) -> Decision {
    let mut d = Draft::new(input);
    if let Some(holder) = d.claimed_by() {
        claimed(&mut d, holder);
        return d.finish();
    }
    match d.phase {
        Phase::Initial => initial(&mut d),
        Phase::Onboarding => onboarding(&mut d),
        Phase::Testing => testing(&mut d),
        Phase::Aborted => aborted(&mut d),
        Phase::Ready => ready(&mut d),
        Phase::Active => active(&mut d),
        Phase::Evicting => evicting(&mut d),
        Phase::Maintenance => maintenance(&mut d),
        Phase::Decommissioned => decommissioned(&mut d),
    }
    update_place(&mut d);
    d.finish()
}

/// The host holds a place among those held for updates while an update's
/// ask empties it or holds it (not while it waits for a place in service,
/// nor under an SRE's own maintenance): recorded, so that the limit counts
/// it after a failover too.
fn update_place(d: &mut Draft<'_>) {
    let phase = d.input.status.phase.unwrap_or_default();
    let adopted = d.record.adopted && matches!(phase, Phase::Onboarding | Phase::Testing);
    let served =
        adopted || matches!(phase, Phase::Ready | Phase::Active | Phase::Evicting | Phase::Maintenance);
    let holds = served
        && d.input.spec.maintenance == MaintenanceMode::None
        && !matches!(d.obs().node, NodeObs::Deleting)
        && d.update_asked().is_some();
    match (holds, &d.record.update_place) {
        (true, None) => d.record.update_place = Some(Time(d.input.now)),
        (false, Some(_)) => d.record.update_place = None,
        _ => {}
    }
}

// ------------------------------------------------------------------ phases

/// One Nova host, one Hypervisor: a Hypervisor that has not recorded a
/// Nova host of its own, whose host another one holds, stops where it is
/// and changes nothing in Nova; the holder is untouched. Told once.
fn claimed(d: &mut Draft<'_>, holder: &str) {
    let host = d.nova_host();
    let msg = format!(
        "Nova host {host} is held by Hypervisor {holder}: nothing is done for this one. Fix this Hypervisor's \
         spec.novaHost (taken from the Node's {NOVA_HOST_ANNOTATION} annotation when it was created), or \
         delete Hypervisor {holder} if it is a stale record of the same machine"
    );
    let told = d
        .input
        .status
        .conditions
        .iter()
        .any(|c| c.type_ == ConditionType::Onboarded.as_str() && c.reason == NOVA_HOST_CLAIMED);
    if !told {
        d.warn(NOVA_HOST_CLAIMED, msg.clone());
    }
    d.set(ConditionType::Onboarded, ConditionStatus::False, NOVA_HOST_CLAIMED, msg);
}

fn initial(d: &mut Draft<'_>) {
    // Made by this version: its disables are recorded from the start.
    d.record.disabled_as.get_or_insert_with(Vec::new);
    match d.obs().node {
        NodeObs::Absent => d.set(
            ConditionType::Onboarded,
            ConditionStatus::Unknown,
            "NodeMissing",
            "waiting for the Kubernetes Node to exist".into(),
        ),
        NodeObs::Present { .. } | NodeObs::Deleting => d.go(Phase::Onboarding, "new Kubernetes Node".into()),
    }
}

fn onboarding(d: &mut Draft<'_>) {
    // Adopted first: an update's ask of a host found in service waits for
    // a place as an Active host's does.
    if let NovaObs::Registered(host) = &d.obs().nova {
        d.adopts(host);
    }
    if d.hold_requested() {
        return hold(d);
    }
    let Some(host) = registered(d) else {
        return;
    };
    if d.record.adopted {
        // Adopted: reported by `adopts`.
    } else if host.enabled && d.input.status.service_id.is_none() && !d.record.adopted {
        let msg = format!(
            "Nova enabled the compute service of {} the moment it registered (enable_new_services = True); \
             it is disabled until the checks pass. Set enable_new_services = False in nova.conf (docs/nova.md)",
            d.nova_host()
        );
        d.warn(NOVA_ENABLES_NEW_SERVICES, msg);
    }
    if !d.record.adopted {
        d.guard_disabled(host, ONBOARDING_DISABLE_REASON);
    }
    if let Err(bad) = d.spec_traits() {
        let msg = format!("spec.customTraits has invalid entries: {}", list(&bad));
        return d.abort(ConditionType::Onboarded, "InvalidSpec", msg);
    }
    if !host.unknown_aggregates.is_empty() {
        let msg = format!("aggregate(s) {} do not exist in Nova", list(&host.unknown_aggregates));
        return d.abort(ConditionType::Onboarded, "AggregateNotFound", msg);
    }
    let pending = d.sync_nova_config(host);
    if host.hypervisor_id.is_none() {
        let msg = "compute service found, waiting for nova-compute to report its hypervisor".into();
        return d.set(ConditionType::Onboarded, ConditionStatus::False, "WaitingForHypervisor", msg);
    }
    if let Some(what) = pending {
        return d.set(ConditionType::Onboarded, ConditionStatus::False, "Configuring", what);
    }
    d.set(
        ConditionType::Onboarded,
        ConditionStatus::True,
        "Onboarded",
        "registered in Nova, aggregates and traits in place".into(),
    );
    if d.input.spec.skip_tests {
        d.go(Phase::Ready, "onboarded; spec.skipTests is set".into());
    } else {
        d.start_test_run();
        d.go(Phase::Testing, "onboarded".into());
    }
}

fn testing(d: &mut Draft<'_>) {
    if d.hold_requested() {
        return hold(d);
    }
    if let NovaObs::Registered(host) = &d.obs().nova
        && !d.record.adopted
    {
        d.guard_disabled(host, ONBOARDING_DISABLE_REASON);
    }
    if d.input.spec.skip_tests {
        d.set(ConditionType::Tested, ConditionStatus::True, "Skipped", "spec.skipTests is set".into());
        return d.go(Phase::Ready, "spec.skipTests was set during Testing".into());
    }
    let run = d.record.test_run;
    let report = d.obs().checks.as_ref().filter(|r| r.run == run);
    if let Some(report) = report {
        d.checks = Some(report.results.clone());
        let failed: Vec<&CheckResultStatus> = report.results.iter().filter(|c| !c.passed).collect();
        if report.results.is_empty() {
            return d.test_failed("NoChecks", format!("run {run}: the agent reported no checks"));
        }
        if failed.is_empty() {
            let msg = format!("run {run}: {} checks passed", report.results.len());
            d.set(ConditionType::Tested, ConditionStatus::True, "Passed", msg);
            d.record.adopted_checks_failed = None;
            return d.go(Phase::Ready, "all checks passed".into());
        }
        let detail: Vec<String> = failed.iter().map(|c| format!("{}: {}", c.name, c.message)).collect();
        let msg = format!(
            "run {run}: {} of {} checks failed: {}",
            failed.len(),
            report.results.len(),
            detail.join("; ")
        );
        return d.test_failed("ChecksFailed", msg);
    }
    let started = d.record.test_started.as_ref().map(|t| t.0);
    let waited = started.map(|s| d.input.now.duration_since(s));
    let connected = d.obs().agent.connected;
    if waited.is_some_and(|w| w > d.input.policy.checks_timeout) {
        let msg = format!(
            "run {run}: no check report within {} (agent {})",
            human(d.input.policy.checks_timeout),
            if connected { "connected" } else { "not connected" }
        );
        return d.test_failed("ChecksTimedOut", msg);
    }
    if connected {
        d.actions.push(Action::RunChecks { run });
        d.set(
            ConditionType::Tested,
            ConditionStatus::False,
            "Running",
            format!("run {run}: checks requested from the agent"),
        );
    } else {
        d.set(
            ConditionType::Tested,
            ConditionStatus::False,
            "WaitingForAgent",
            format!("run {run}: waiting for the node's agent to connect"),
        );
    }
}

/// Whether the node's machine is the one that registered its Nova host, as
/// far as it may be enabled: the host names its agent and Nova's record
/// give agree, or one side has not said where that is enough (`activating`
/// false: a host already in service; or `spec.skipTests`, no agent
/// required). Else it is not enabled, told why (once, as a Warning, when
/// they differ).
fn same_machine(d: &mut Draft<'_>, host: &NovaHost, activating: bool) -> bool {
    let nova_host = d.nova_host();
    let (reason, msg) = match machine::compare(
        d.obs().machine_hostname.as_deref(),
        host.hypervisor_hostname.as_deref(),
    ) {
        Machine::Same => return true,
        Machine::Unknown(_) if d.input.spec.skip_tests || !activating => return true,
        Machine::Differs { agent, nova } => {
            let msg = format!(
                "the node's libvirt calls its machine {agent}, Nova's hypervisor record for host {nova_host} \
                 names {nova}: this node is not the machine that registered {nova_host}, and is not \
                 activated. Fix the Hypervisor's spec.novaHost, or the machine's host name"
            );
            let told = d.input.status.conditions.iter().any(|c| c.reason == MACHINE_MISMATCH)
                || d.warnings.iter().any(|w| w.reason == MACHINE_MISMATCH);
            if !told {
                d.warn(MACHINE_MISMATCH, msg.clone());
            }
            (MACHINE_MISMATCH, msg)
        }
        Machine::Unknown(MachineUnknown::Agent) => (
            "WaitingForAgent",
            "waiting for the node's agent to report a usable libvirt host name".to_string(),
        ),
        Machine::Unknown(MachineUnknown::Nova) => {
            ("WaitingForHypervisor", format!("Nova has no hypervisor record for host {nova_host} yet"))
        }
    };
    d.set(ConditionType::SchedulingEnabled, ConditionStatus::False, reason, msg);
    false
}

fn aborted(d: &mut Draft<'_>) {
    // Aborted before its first look at Nova (credentials, a host name not
    // found yet): found in service once Nova shows it, it is adopted.
    if let NovaObs::Registered(host) = &d.obs().nova
        && !d.adopts(host)
    {
        d.guard_disabled(host, ONBOARDING_DISABLE_REASON);
    }
    if let Some(token) = d.fresh_retry() {
        d.record.handled_retry = Some(token.clone());
        d.record.abort = None;
        d.go(Phase::Onboarding, format!("retry requested ({token})"));
    }
}

fn ready(d: &mut Draft<'_>) {
    if d.hold_requested() {
        return hold(d);
    }
    if let Some(ev) = d.obs().eviction.as_ref().filter(|e| e.is_active()) {
        // A hand-made Eviction of a host not yet in service: it stays
        // disabled until the eviction is over.
        let msg = format!("Eviction {} runs; the host is enabled once it is over", ev.name);
        return d.set(ConditionType::SchedulingEnabled, ConditionStatus::False, "EvictionRunning", msg);
    }
    if let NovaObs::Registered(host) = &d.obs().nova
        && !same_machine(d, host, true)
    {
        return;
    }
    match &d.obs().nova {
        NovaObs::Registered(host) if host.enabled => {
            d.go(Phase::Active, "compute service enabled in Nova".into());
        }
        // Nova marks the host's placement provider enabled again only through
        // a live nova-compute: an enable while Nova counts it down (just
        // restarted, not reported yet) would leave the host unschedulable.
        NovaObs::Registered(host)
            if matches!(host.service_state, ServiceState::Down | ServiceState::ForcedDown) =>
        {
            let msg = format!(
                "nova-compute is {:?} in Nova: the host is enabled once Nova counts it up",
                host.service_state
            );
            d.set(ConditionType::SchedulingEnabled, ConditionStatus::False, "ComputeNotUp", msg);
        }
        NovaObs::Registered(host) => match d.unseen_due() {
            Some(cause) => {
                let msg = format!("{cause}; not enabled until the host is seen again");
                d.set(ConditionType::SchedulingEnabled, ConditionStatus::False, "HostUnseen", msg);
            }
            None => {
                d.enable_if_ours(host);
            }
        },
        NovaObs::NotRegistered => {
            let msg = "the compute service disappeared from Nova".into();
            d.set(ConditionType::Onboarded, ConditionStatus::False, "ServiceMissing", msg);
        }
        _ => {}
    }
}

fn active(d: &mut Draft<'_>) {
    if power::holds(d) {
        return;
    }
    if d.hold_requested() {
        return hold(d);
    }
    if let Some(ev) = d.obs().eviction.clone().filter(|e| e.is_active()) {
        // Disabled with the transition, as a maintenance does when it
        // creates its Eviction: its preflight runs meanwhile, and nothing
        // moves before Nova shows the host disabled.
        if let NovaObs::Registered(host) = &d.obs().nova {
            d.guard_disabled(host, &format!("hv-lifecycle: eviction {} ({})", ev.name, ev.reason.as_str()));
        }
        d.record.eviction = Some(EvictionRef {
            name: ev.name.clone(),
            reason: ev.reason,
            re_enable: ev.re_enable,
            for_maintenance: false,
        });
        return d.go(Phase::Evicting, format!("Eviction {} ({})", ev.name, ev.reason.as_str()));
    }
    let host = match &d.obs().nova {
        NovaObs::Registered(host) => host,
        NovaObs::NotRegistered => {
            let msg = "the compute service disappeared from Nova".into();
            return d.set(ConditionType::Onboarded, ConditionStatus::False, "ServiceMissing", msg);
        }
        _ => return,
    };
    let held = unseen(d, host);
    if !host.enabled && !held && d.enable_if_ours(host) == Enabling::Enables {
        let why = host.disabled_reason.clone().unwrap_or_default();
        d.warn(DRIFT_REPAIRED, format!("compute service was disabled in Nova ({why}); re-enabled"));
    }
    if !host.unknown_aggregates.is_empty() {
        let msg = format!("aggregate(s) {} do not exist in Nova", list(&host.unknown_aggregates));
        return d.set(ConditionType::Onboarded, ConditionStatus::False, "AggregateNotFound", msg);
    }
    if d.spec_traits().is_ok() {
        let before = d.actions.len();
        d.sync_nova_config(host);
        if d.actions.len() > before {
            let why = "aggregates or traits differed from spec and the host's capabilities; brought in line";
            d.warn(DRIFT_REPAIRED, why.into());
        }
    }
}

/// An Active host we lost sight of (docs/health.md): disabled in Nova once
/// it has been Unreachable or Failed for the grace, and nothing else: a
/// host we cannot see may still run its VMs, so no migration starts. Seen
/// again (Healthy), its checks run again and it is enabled once they pass.
/// A Degraded one is put into `ha` maintenance by the shell, which takes it
/// out of Active. Answers whether it stays disabled.
fn unseen(d: &mut Draft<'_>, host: &NovaHost) -> bool {
    let health = d.obs().health.as_ref();
    // A host fenced (or being fenced) is held disabled whatever its health
    // or the fleet gate, until an SRE clears the fencing (docs/fencing.md).
    if d.input.status.fencing.is_some() {
        let hold = d.record.unseen.clone().or_else(|| nova_hold(host, d.input.now));
        let hold = hold.unwrap_or_else(|| UnseenHold {
            disabled_at: Time(d.input.now),
            cause: "fenced".into(),
            recheck_run: None,
            recheck_failed: false,
        });
        d.record.unseen = Some(hold.clone());
        d.guard_disabled(host, &unseen_reason(&hold.cause));
        let msg = format!(
            "disabled in Nova since {} ({}); fenced: stays disabled until an SRE clears the fencing",
            hold.disabled_at.0, hold.cause
        );
        d.set(ConditionType::SchedulingEnabled, ConditionStatus::False, "HostFenced", msg);
        return true;
    }
    // Nova's reason is the truth when our record of the hold was lost (a
    // status write that failed after the disable).
    let Some(hold) = d.record.unseen.clone().or_else(|| nova_hold(host, d.input.now)) else {
        let Some(cause) = d.unseen_due() else { return false };
        if d.record.adopted_checks_failed.is_some() {
            // Adopted, its checks never passed: reported, an SRE decides.
            let status = if host.enabled { ConditionStatus::True } else { ConditionStatus::False };
            let msg = format!(
                "{cause}; not disabled: adopted in service, its checks never passed (an SRE decides)"
            );
            d.set(ConditionType::SchedulingEnabled, status, "UnseenAdopted", msg);
            return true;
        }
        if let Some(why) = health.and_then(|h| h.hold_back.clone()) {
            // The fleet gate: neither disabled nor enabled, and said.
            let status = if host.enabled { ConditionStatus::True } else { ConditionStatus::False };
            let msg = format!("{cause}; not disabled: {why}");
            d.set(ConditionType::SchedulingEnabled, status, "UnseenHeldBack", msg);
            return true;
        }
        d.hold_unseen(cause.clone());
        d.guard_disabled(host, &unseen_reason(&cause));
        let msg = format!(
            "{cause}; disabled in Nova, no migration started (its VMs may still run); \
             enabled again once its agent is back and its checks pass"
        );
        d.warn(HOST_UNSEEN, msg.clone());
        d.set(ConditionType::SchedulingEnabled, ConditionStatus::False, "HostUnseen", msg);
        return true;
    };
    d.record.unseen = Some(hold.clone());
    if health.is_some_and(|h| h.state == HealthState::Healthy) {
        match recheck(d, hold.clone(), host) {
            Recheck::Lifted => return false,
            Recheck::Enabling => return true,
            Recheck::Held => {
                d.guard_disabled(host, &unseen_reason(&hold.cause));
                return true;
            }
        }
    }
    d.guard_disabled(host, &unseen_reason(&hold.cause));
    let msg = format!(
        "disabled in Nova since {} ({}); enabled again once its agent is back and its checks pass",
        hold.disabled_at.0, hold.cause
    );
    d.set(ConditionType::SchedulingEnabled, ConditionStatus::False, "HostUnseen", msg);
    // A run started before it was lost again proves nothing: the next
    // return starts a new one. A failed one stands until a retry.
    if let Some(h) = d.record.unseen.as_mut().filter(|h| health.is_some() && !h.recheck_failed) {
        h.recheck_run = None;
    }
    true
}

/// The hold Nova's disabled reason says we made.
fn nova_hold(host: &NovaHost, now: Timestamp) -> Option<UnseenHold> {
    let reason = host.disabled_reason.as_deref().filter(|_| !host.enabled)?;
    let cause = reason.strip_prefix(UNSEEN_REASON_PREFIX)?;
    Some(UnseenHold {
        disabled_at: Time(now),
        cause: cause.strip_suffix(')').unwrap_or(cause).to_string(),
        recheck_run: None,
        recheck_failed: false,
    })
}

/// A held host seen again: one test run, and the host enabled only on its
/// pass; a failure (or no report within the checks timeout) holds it until
/// a retry.
fn recheck(d: &mut Draft<'_>, hold: UnseenHold, host: &NovaHost) -> Recheck {
    let name = d.input.name;
    if d.input.spec.skip_tests {
        return d.lift(host);
    }
    let run = match hold.recheck_run {
        Some(run) if !hold.recheck_failed => run,
        Some(_) if d.fresh_retry().is_none() => {
            let msg = format!(
                "seen again, but its checks failed ({}); fix the cause, then `hvctl retry {name}`",
                hold.cause
            );
            d.set(ConditionType::SchedulingEnabled, ConditionStatus::False, "RecheckFailed", msg);
            return Recheck::Held;
        }
        _ => {
            if let Some(token) = d.fresh_retry() {
                d.record.handled_retry = Some(token.clone());
            }
            d.start_test_run();
            let run = d.record.test_run;
            if let Some(h) = d.record.unseen.as_mut() {
                h.recheck_run = Some(run);
                h.recheck_failed = false;
            }
            let msg = format!("run {run}: seen again; its checks run before it is enabled");
            d.set(ConditionType::Tested, ConditionStatus::False, "Rechecking", msg.clone());
            d.set(ConditionType::SchedulingEnabled, ConditionStatus::False, "Rechecking", msg);
            return Recheck::Held;
        }
    };
    let report = d.obs().checks.as_ref().filter(|r| r.run == run);
    let failed = match report {
        Some(r) if !r.results.is_empty() && r.results.iter().all(|c| c.passed) => {
            d.checks = Some(r.results.clone());
            let msg = format!("run {run}: {} checks passed after the host was seen again", r.results.len());
            d.set(ConditionType::Tested, ConditionStatus::True, "Passed", msg);
            d.record.adopted_checks_failed = None;
            return d.lift(host);
        }
        Some(r) => {
            d.checks = Some(r.results.clone());
            let detail: Vec<String> = r
                .results
                .iter()
                .filter(|c| !c.passed)
                .map(|c| format!("{}: {}", c.name, c.message))
                .collect();
            if detail.is_empty() { "the agent reported no checks".to_string() } else { detail.join("; ") }
        }
        None => {
            let waited = d.record.test_started.as_ref().map(|s| d.input.now.duration_since(s.0));
            if waited.is_none_or(|w| w <= d.input.policy.checks_timeout) {
                if d.obs().agent.connected {
                    d.actions.push(Action::RunChecks { run });
                }
                let msg = format!("run {run}: seen again; its checks run before it is enabled");
                d.set(ConditionType::Tested, ConditionStatus::False, "Rechecking", msg.clone());
                d.set(ConditionType::SchedulingEnabled, ConditionStatus::False, "Rechecking", msg);
                return Recheck::Held;
            }
            format!("no check report within {}", human(d.input.policy.checks_timeout))
        }
    };
    if let Some(h) = d.record.unseen.as_mut() {
        h.recheck_failed = true;
    }
    let msg = format!("run {run}: {failed}; it stays disabled. Fix the cause, then `hvctl retry {name}`");
    d.set(ConditionType::Tested, ConditionStatus::False, "ChecksFailed", msg.clone());
    d.set(ConditionType::SchedulingEnabled, ConditionStatus::False, "RecheckFailed", msg);
    Recheck::Held
}

/// Where a recheck leaves a held host.
/// What an enable of ours came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Enabling {
    Enables,
    /// Someone else's disable: it stands.
    Theirs,
    /// Ours, but the node is not the machine Nova means: it stays.
    NotThisMachine,
    /// Ours, but a dependency pod (`--node-dependency`) is not Ready on
    /// the host: it stays until they are.
    Waits,
}

enum Recheck {
    /// Still held: kept disabled.
    Held,
    /// Cleared to come back: being enabled; the hold stays until Nova shows
    /// it enabled (an enable that failed is asked again, no new run).
    Enabling,
    /// Enabled in Nova: the hold is gone.
    Lifted,
}

const UNSEEN_REASON_PREFIX: &str = "hv-lifecycle: host unseen (";

fn unseen_reason(cause: &str) -> String {
    format!("{UNSEEN_REASON_PREFIX}{cause})")
}

fn evicting(d: &mut Draft<'_>) {
    let mode = d.effective_maintenance();
    let current = d.record.eviction.clone();
    let observed = current.as_ref().and_then(|r| d.observed_eviction(&r.name)).cloned();
    // A fenced host's running Eviction evacuates (docs/fencing.md): it
    // counts as this fencing's evacuation.
    if let Some(started) = d.fenced_since().filter(|_| observed.as_ref().is_some_and(|e| e.is_running())) {
        d.record.evacuated_for = Some(started);
    }
    if mode.is_requested() {
        if let NovaObs::Registered(host) = &d.obs().nova {
            d.guard_disabled(host, &disable_reason(mode, &d.maintenance_reason()));
        }
        let Some(r) = current else {
            return d.create_maintenance_eviction(mode);
        };
        match observed {
            None if r.for_maintenance => {
                // Not visible yet (cache lag) or deleted by someone while the
                // maintenance still stands: (re)create it under the same name.
                d.actions.push(Action::CreateEviction { name: r.name.clone(), reason: r.reason });
                let msg = format!("Eviction {} requested", r.name);
                d.set(ConditionType::Evicted, ConditionStatus::False, "EvictionPending", msg);
            }
            None => d.create_maintenance_eviction(mode),
            Some(e) => match e.phase {
                EvictionPhase::Succeeded if mode == MaintenanceMode::Termination => decommission(d),
                EvictionPhase::Succeeded => {
                    if report_evicted(d, &e) {
                        d.go(Phase::Maintenance, format!("Eviction {} complete", e.name));
                    }
                }
                EvictionPhase::Failed | EvictionPhase::Cancelled if evacuate_left(d) => {}
                EvictionPhase::Failed | EvictionPhase::Cancelled => {
                    let msg = format!(
                        "Eviction {} ended {:?}: {}; delete it to try again",
                        e.name, e.phase, e.message
                    );
                    d.set(ConditionType::Evicted, ConditionStatus::False, "EvictionFailed", msg);
                }
                _ => d.set(
                    ConditionType::Evicted,
                    ConditionStatus::False,
                    "EvictionRunning",
                    eviction_summary(&e),
                ),
            },
        }
        return;
    }
    // No maintenance requested (any more).
    let Some(r) = current else {
        return d.go(Phase::Onboarding, "no eviction to wait for; re-validating".into());
    };
    if r.for_maintenance {
        if observed.as_ref().is_some_and(|e| e.is_active()) {
            d.actions.push(Action::CancelEviction { name: r.name.clone() });
        }
        d.record.eviction = None;
        return d.go(Phase::Onboarding, "maintenance cleared; re-validating before re-enabling".into());
    }
    if observed.as_ref().is_none_or(|e| !e.is_running()) && follow_another(d) {
        return;
    }
    match observed {
        Some(e) if e.is_running() => {
            if let NovaObs::Registered(host) = &d.obs().nova {
                d.guard_disabled(host, &format!("hv-lifecycle: eviction {} ({})", r.name, r.reason.as_str()));
            }
            d.set(ConditionType::Evicted, ConditionStatus::False, "EvictionRunning", eviction_summary(&e));
        }
        // A hand-made Eviction never decommissions, whatever its reason:
        // only termination does (the Eviction controller refuses such a
        // reason on a hand-made Eviction anyway).
        Some(e) if e.phase == EvictionPhase::Succeeded && !e.re_enable => {
            if report_evicted(d, &e) {
                d.go(
                    Phase::Maintenance,
                    format!("Eviction {} complete; reason {} does not re-enable", e.name, r.reason.as_str()),
                );
            }
        }
        Some(e) if e.phase == EvictionPhase::Succeeded => {
            re_enable(d, &format!("Eviction {} complete", e.name))
        }
        // Failed, cancelled or deleted before the node was emptied.
        _ if r.re_enable => re_enable(d, &format!("Eviction {} ended before completion", r.name)),
        _ => {
            let msg = format!(
                "Eviction {} ended before completion; reason {} does not re-enable",
                r.name,
                r.reason.as_str()
            );
            d.set(ConditionType::Evicted, ConditionStatus::False, "EvictionIncomplete", msg.clone());
            d.go(Phase::Maintenance, msg);
        }
    }
}

/// The recorded Eviction is over, but another one empties the host: it is
/// followed (recorded as the current one) instead of ending the eviction,
/// so the host is never re-enabled while VMs are still being moved off.
fn follow_another(d: &mut Draft<'_>) -> bool {
    let recorded = d.record.eviction.as_ref().map(|r| r.name.clone());
    let Some(other) =
        d.obs().eviction.as_ref().filter(|e| e.is_active() && Some(&e.name) != recorded.as_ref())
    else {
        return false;
    };
    let other = other.clone();
    d.record.eviction = Some(EvictionRef {
        name: other.name.clone(),
        reason: other.reason,
        re_enable: other.re_enable,
        for_maintenance: false,
    });
    d.set(ConditionType::Evicted, ConditionStatus::False, "EvictionRunning", eviction_summary(&other));
    true
}

/// The `Evicted` condition once an eviction succeeded, from Nova, not from
/// the Eviction: true only when Nova shows the host empty; servers the
/// eviction skipped or could not move are named. False when Nova cannot
/// say (then nothing moves on).
fn report_evicted(d: &mut Draft<'_>, e: &EvictionObs) -> bool {
    let NovaObs::Registered(host) = &d.obs().nova else {
        let msg = format!("{}; waiting for Nova to show the host", eviction_summary(e));
        d.set(ConditionType::Evicted, ConditionStatus::Unknown, "NovaUnknown", msg);
        return false;
    };
    if host.instances.is_empty() {
        d.set(ConditionType::Evicted, ConditionStatus::True, "Evicted", eviction_summary(e));
    } else {
        let msg = format!(
            "{}; {} instance(s) remain on the host (skipped or not movable, see the Eviction): {}",
            eviction_summary(e),
            host.instances.len(),
            host.instances.join(", ")
        );
        d.set(ConditionType::Evicted, ConditionStatus::False, "InstancesRemain", msg);
    }
    true
}

fn maintenance(d: &mut Draft<'_>) {
    let mode = d.effective_maintenance();
    if mode == MaintenanceMode::Termination {
        return d.create_maintenance_eviction(mode);
    }
    let host = match &d.obs().nova {
        NovaObs::Registered(host) => Some(host),
        _ => None,
    };
    if mode.is_requested() {
        if let Some(host) = &host {
            d.guard_disabled(host, &disable_reason(mode, &d.maintenance_reason()));
            if evacuate_left(d) {
                return;
            }
            if !host.instances.is_empty() {
                let msg = format!(
                    "{} instance(s) remain on the host: {}",
                    host.instances.len(),
                    host.instances.join(", ")
                );
                return d.set(ConditionType::Evicted, ConditionStatus::False, "InstancesRemain", msg);
            }
        }
        let msg = format!("in maintenance ({})", mode.as_str());
        return d.set(ConditionType::Evicted, ConditionStatus::True, "Evicted", msg);
    }
    if let Some(r) = d.record.eviction.clone().filter(|r| !r.for_maintenance)
        && d.observed_eviction(&r.name).is_some()
    {
        if let Some(host) = &host {
            d.guard_disabled(host, &format!("hv-lifecycle: eviction {} ({})", r.name, r.reason.as_str()));
        }
        let msg = format!(
            "held by Eviction {} ({}); delete it to return the node to service",
            r.name,
            r.reason.as_str()
        );
        return d.set(ConditionType::Evicted, ConditionStatus::True, "HeldByEviction", msg);
    }
    d.record.eviction = None;
    d.go(Phase::Onboarding, "maintenance over; re-validating before re-enabling".into());
}

/// A fenced host with servers left that no Eviction has evacuated for this
/// fencing (its Eviction had ended before the fencing was done): one more,
/// with the evacuate step. Answers whether it was made.
fn evacuate_left(d: &mut Draft<'_>) -> bool {
    let left = matches!(&d.obs().nova, NovaObs::Registered(host) if !host.instances.is_empty());
    match d.fenced_since().filter(|_| left) {
        // The Eviction made records this fencing as evacuated for.
        Some(started) if d.record.evacuated_for.as_ref() != Some(&started) => {
            d.create_eviction("ha", EvictionReason::NodeFailure);
            true
        }
        _ => false,
    }
}

/// Maintenance was requested in a phase before Maintenance: stop scheduling
/// and evict, or go straight to Maintenance when Nova shows the host empty.
fn hold(d: &mut Draft<'_>) {
    let mode = d.effective_maintenance();
    let reason = disable_reason(mode, &d.maintenance_reason());
    let empty = match &d.obs().nova {
        NovaObs::Registered(host) => {
            d.guard_disabled(host, &reason);
            Some(host.instances.is_empty())
        }
        // A host never registered is empty; one that was and is not listed
        // now may be hidden by a down cell: missing is not empty.
        NovaObs::NotRegistered if d.input.status.service_id.is_none() => Some(true),
        _ => None,
    };
    if mode != MaintenanceMode::Termination && empty == Some(true) {
        d.set(
            ConditionType::Evicted,
            ConditionStatus::True,
            "NothingToEvict",
            "no instance on the host".into(),
        );
        return d.go(Phase::Maintenance, format!("maintenance ({}) requested; host is empty", mode.as_str()));
    }
    d.create_maintenance_eviction(mode);
}

/// The tail of a decommissioning eviction: leave every aggregate, drop our
/// traits, then delete the compute service — never while an instance remains.
fn decommission(d: &mut Draft<'_>) {
    let host = match &d.obs().nova {
        NovaObs::Registered(host) => host,
        NovaObs::NotRegistered => {
            if d.record.service_deleted || d.service_id.is_none() {
                d.set(
                    ConditionType::Evicted,
                    ConditionStatus::True,
                    "Decommissioned",
                    "removed from Nova".into(),
                );
                return d.go(Phase::Decommissioned, "compute service removed from Nova".into());
            }
            let msg =
                "the compute service vanished from Nova before we could check it was empty; verify by hand"
                    .into();
            return d.set(ConditionType::Evicted, ConditionStatus::Unknown, "ServiceVanished", msg);
        }
        _ => return,
    };
    d.guard_disabled(host, "hv-lifecycle: decommissioning");
    if !host.instances.is_empty() {
        let msg = format!(
            "refusing to decommission: {} instance(s) remain: {}",
            host.instances.len(),
            host.instances.join(", ")
        );
        return d.set(ConditionType::Evicted, ConditionStatus::False, "InstancesRemain", msg);
    }
    // A fenced host leaves Nova only once retired (docs/fencing.md): its
    // blocklist entries are lifted while its compute service is there to
    // show nova-compute's reports.
    if d.input.status.fencing.as_ref().is_some_and(|f| !f.retired()) {
        let msg = "fenced: its compute service stays in Nova until the host is retired (its Node's deletion \
                   asks it once it counts fenced; the Fenced condition says what the retirement waits for, \
                   hvctl retire NODE --machine-gone where its machine cannot be read)";
        return d.set(ConditionType::Evicted, ConditionStatus::False, "AwaitingRetirement", msg.into());
    }
    for agg in &host.aggregates {
        d.actions.push(Action::RemoveAggregate { name: agg.clone() });
    }
    let owned: BTreeSet<String> = d.record.applied_traits.iter().cloned().collect();
    let left: BTreeSet<String> = match &host.traits {
        Some(traits) => owned.intersection(traits).cloned().collect(),
        None => BTreeSet::new(),
    };
    if !left.is_empty() {
        d.actions.push(Action::RemoveTraits { traits: left.clone() });
    }
    if host.aggregates.is_empty() && left.is_empty() {
        d.record.applied_aggregates.clear();
        d.record.applied_traits.clear();
        d.actions.push(Action::DeleteService { service_id: host.service_id.clone() });
        let msg = "deleting the compute service".into();
        return d.set(ConditionType::Evicted, ConditionStatus::True, "Decommissioning", msg);
    }
    d.set(
        ConditionType::Evicted,
        ConditionStatus::True,
        "Decommissioning",
        "leaving aggregates and removing traits".into(),
    );
}

/// Decommissioned is terminal, but nova-compute on a re-installed host
/// registers a new service, which Nova enables by default: it is disabled
/// again at once and reported (docs/lifecycle.md).
fn decommissioned(d: &mut Draft<'_>) {
    let NovaObs::Registered(host) = &d.obs().nova else {
        return;
    };
    let msg = format!(
        "a compute service ({}) registered again for decommissioned host {}; kept disabled. \
         To use the host again, delete this Hypervisor and re-create its Node",
        host.service_id,
        d.nova_host()
    );
    if host.enabled {
        d.warn(SERVICE_RE_REGISTERED, format!("{msg}; it was enabled and is disabled now"));
        d.guard_disabled(host, RE_REGISTERED_DISABLE_REASON);
    }
    d.set(ConditionType::SchedulingEnabled, ConditionStatus::False, "ReRegistered", msg);
}

fn re_enable(d: &mut Draft<'_>, why: &str) {
    let due = d.unseen_due();
    let held_back = d.obs().health.as_ref().is_some_and(|h| h.hold_back.is_some());
    if d.record.unseen.is_none()
        && let Some(cause) = due.clone().filter(|_| !held_back)
    {
        d.hold_unseen(cause);
    }
    if d.record.unseen.is_some() || due.is_some() {
        // Held before the eviction: Active keeps holding it until it is
        // seen again and its checks pass.
        d.record.eviction = None;
        return d.go(Phase::Active, format!("{why}; the host stays disabled until it is seen again"));
    }
    let NovaObs::Registered(host) = &d.obs().nova else {
        return;
    };
    if host.enabled {
        d.record.eviction = None;
        return d.go(Phase::Active, format!("{why}; compute service re-enabled"));
    }
    // Disabled by someone else meanwhile (it stays theirs), or another
    // machine: Active, and the service stays disabled.
    if d.enable_if_ours(host) != Enabling::Enables {
        d.record.eviction = None;
        d.go(
            Phase::Active,
            format!("{why}; the compute service stays disabled (SchedulingEnabled says why)"),
        );
    }
}

/// The registered host, or None after setting the condition (and aborting
/// where docs/lifecycle.md says so).
fn registered<'a>(d: &mut Draft<'a>) -> Option<&'a NovaHost> {
    match &d.obs().nova {
        NovaObs::Registered(host) => Some(host),
        NovaObs::Unknown => {
            d.set(
                ConditionType::Onboarded,
                ConditionStatus::Unknown,
                "QueryingNova",
                "waiting for the first answer from Nova".into(),
            );
            None
        }
        NovaObs::Unreachable(msg) => {
            let msg = format!("Nova or Placement unreachable: {msg}");
            d.set(ConditionType::Onboarded, ConditionStatus::False, "NovaUnreachable", msg);
            None
        }
        NovaObs::Rejected(msg) => {
            let msg = format!("Keystone rejected the coordinator's credentials: {msg}");
            d.abort(ConditionType::Onboarded, "KeystoneRejected", msg);
            None
        }
        NovaObs::NotRegistered => {
            let since = d.phase_since();
            let waited = since.map(|s| d.input.now.duration_since(s));
            if waited.is_some_and(|w| w > d.input.policy.registration_timeout) {
                let mut msg = format!(
                    "nova-compute on host {} did not register within {}",
                    d.nova_host(),
                    human(d.input.policy.registration_timeout)
                );
                if !d.obs().close_hosts.is_empty() {
                    msg.push_str(&format!("; close: {}", d.obs().close_hosts.join(", ")));
                }
                d.abort(ConditionType::Onboarded, "RegistrationTimeout", msg);
            } else if d.obs().close_hosts.is_empty() {
                let msg = format!("waiting for nova-compute on host {} to register", d.nova_host());
                d.set(ConditionType::Onboarded, ConditionStatus::False, "WaitingForNovaCompute", msg);
            } else {
                let msg = format!(
                    "no compute service registered as host {}; close: {}. \
                     If one of them is this node, set spec.novaHost to it",
                    d.nova_host(),
                    d.obs().close_hosts.join(", ")
                );
                d.set(ConditionType::Onboarded, ConditionStatus::False, "NovaHostNotFound", msg);
            }
            None
        }
    }
}

// ------------------------------------------------------------------ the draft

/// The decision under construction.
struct Draft<'a> {
    input: &'a Input<'a>,
    phase: Phase,
    transition: Option<Transition>,
    actions: Vec<Action>,
    set: Vec<DesiredCondition>,
    record: LifecycleRecord,
    service_id: Option<String>,
    hypervisor_id: Option<String>,
    checks: Option<Vec<CheckResultStatus>>,
    warnings: Vec<Warning>,
    power_state: Option<crate::api::power::HostPower>,
}

impl<'a> Draft<'a> {
    fn new(input: &'a Input<'a>) -> Self {
        let mut record = input.status.lifecycle.clone();
        // A retry token seen outside Aborted is stale by the time an abort
        // happens: only a token set while Aborted triggers a retry.
        let phase = input.status.phase.unwrap_or_default();
        // Likewise for a held host whose recheck failed.
        let power_failed = matches!(
            input.status.power_state,
            Some(crate::api::power::HostPower::FailedToStop | crate::api::power::HostPower::FailedToStart)
        );
        let waits_for_retry = phase == Phase::Aborted
            || (phase == Phase::Active && record.unseen.as_ref().is_some_and(|u| u.recheck_failed))
            || (phase == Phase::Active && power_failed);
        if !waits_for_retry && input.obs.retry.is_some() {
            record.handled_retry = input.obs.retry.clone();
        }
        let mut service_id = input.status.service_id.clone();
        let mut hypervisor_id = input.status.hypervisor_id.clone();
        let claimed = input.obs.claimed_by.is_some() && record.nova_host.is_none();
        if let NovaObs::Registered(host) = &input.obs.nova
            && !claimed
        {
            // The shell observed the host `nova_host()` names; from now on
            // that is the host, whatever spec says later.
            if record.nova_host.is_none() {
                record.nova_host = Some(nova_host(input.name, input.spec, input.status).to_string());
            }
            service_id = Some(host.service_id.clone());
            if host.hypervisor_id.is_some() {
                hypervisor_id = host.hypervisor_id.clone();
            }
            // An instance on the host voids an earlier service deletion: the
            // host is not known to be empty any more.
            if !host.instances.is_empty() {
                record.service_deleted = false;
            }
        }
        Draft {
            input,
            phase,
            transition: None,
            actions: Vec::new(),
            set: Vec::new(),
            record,
            service_id,
            hypervisor_id,
            checks: None,
            warnings: Vec::new(),
            power_state: input.status.power_state,
        }
    }

    fn obs(&self) -> &'a Observations {
        self.input.obs
    }

    /// The Hypervisor that holds this one's Nova host, while this one has
    /// recorded none (a Decommissioned one keeps its record, and its host).
    fn claimed_by(&self) -> Option<&'a str> {
        let mine = self.input.status.lifecycle.nova_host.is_some();
        self.obs().claimed_by.as_deref().filter(|_| !mine)
    }

    fn nova_host(&self) -> &'a str {
        nova_host(self.input.name, self.input.spec, self.input.status)
    }

    fn warn(&mut self, reason: &'static str, message: String) {
        self.warnings.push(Warning { reason, message });
    }

    fn phase_since(&self) -> Option<Timestamp> {
        self.input.status.phase_since.as_ref().map(|t| t.0)
    }

    fn go(&mut self, to: Phase, reason: String) {
        if self.transition.is_none() && to != self.phase {
            // Adopted only on its way in: in service, or taken out of it.
            if matches!(to, Phase::Active | Phase::Maintenance | Phase::Evicting | Phase::Decommissioned) {
                self.record.adopted = false;
            }
            // Validated afresh: an adopted failure stands only until then.
            if to == Phase::Onboarding {
                self.record.adopted_checks_failed = None;
            }
            // A held host comes back from these only through its checks.
            if matches!(to, Phase::Onboarding | Phase::Maintenance | Phase::Decommissioned) {
                self.record.unseen = None;
            }
            self.transition = Some(Transition { from: self.phase, to, reason });
            self.phase = to;
        }
    }

    fn set(&mut self, type_: ConditionType, status: ConditionStatus, reason: &str, message: String) {
        self.set.retain(|c| c.type_ != type_);
        self.set.push(DesiredCondition { type_, status, reason: reason.to_string(), message });
    }

    fn abort(&mut self, condition: ConditionType, reason: &str, message: String) {
        self.set(condition, ConditionStatus::False, reason, message.clone());
        self.record.abort = Some(AbortRecord {
            condition,
            reason: reason.to_string(),
            message: message.clone(),
            from: self.phase,
        });
        self.go(Phase::Aborted, format!("{reason}: {message}"));
    }

    /// Whether the host is adopted (docs/lifecycle.md, "Adopting a host in
    /// service"): it was, or is now found in service (enabled, with
    /// servers) while never tested by us, so never put in service by us.
    /// Told once, with what its spec changes in Nova.
    fn adopts(&mut self, host: &NovaHost) -> bool {
        if self.record.adopted {
            return true;
        }
        if self.record.test_run > 0 || !host.enabled || host.instances.is_empty() {
            return false;
        }
        self.record.adopted = true;
        let want: BTreeSet<String> = self.input.spec.aggregates.iter().cloned().collect();
        let joins: Vec<&String> = want.difference(&host.aggregates).collect();
        let joins = if joins.is_empty() { String::new() } else { format!("; its spec adds it to {joins:?}") };
        let msg = format!(
            "{} is in service with {} server(s): adopted, left enabled; its checks run as a re-check{joins}",
            self.nova_host(),
            host.instances.len()
        );
        self.warn(HOST_ADOPTED, msg);
        true
    }

    /// A check run that did not pass: the host is Aborted, unless it is
    /// adopted and still in service as it was found (enabled), which is
    /// reported and stays in service: only an SRE empties or disables it.
    fn test_failed(&mut self, reason: &str, message: String) {
        let enabled = match &self.obs().nova {
            NovaObs::Registered(h) => h.enabled,
            // Adopted, Nova not read: decided on a look that reads it.
            _ if self.record.adopted => {
                let msg = format!("{message}; the host was adopted in service: decided once Nova is read");
                return self.set(ConditionType::Tested, ConditionStatus::Unknown, "WaitingForNova", msg);
            }
            _ => false,
        };
        if !self.record.adopted || !enabled {
            // No longer as it was found: a host as any other.
            self.record.adopted = false;
            return self.abort(ConditionType::Tested, reason, message);
        }
        // Left in service only as the machine Nova means.
        if let NovaObs::Registered(host) = &self.obs().nova
            && !same_machine(self, host, true)
        {
            return;
        }
        let msg = format!("{message}; the host was in service when adopted and stays so: an SRE decides");
        self.warn(ADOPTED_CHECKS_FAILED, format!("{}: {msg}", self.nova_host()));
        self.set(ConditionType::Tested, ConditionStatus::False, ADOPTED_CHECKS_FAILED, msg.clone());
        self.record.adopted_checks_failed = Some(msg);
        self.go(Phase::Active, format!("adopted; {reason}: reported, left in service"));
    }

    fn fresh_retry(&self) -> Option<&'a String> {
        self.obs().retry.as_ref().filter(|t| self.input.status.lifecycle.handled_retry.as_ref() != Some(*t))
    }

    /// The maintenance the host is in: the spec's; termination for a Node
    /// being deleted; `auto` for one an update asks to empty (while the
    /// spec asks for none).
    fn effective_maintenance(&self) -> MaintenanceMode {
        match self.obs().node {
            NodeObs::Deleting => MaintenanceMode::Termination,
            _ if self.input.spec.maintenance != MaintenanceMode::None => self.input.spec.maintenance,
            _ if self.update_asked().is_some() => MaintenanceMode::Auto,
            _ => MaintenanceMode::None,
        }
    }

    /// Why an update asks for the host to be emptied, if it does (and,
    /// for a host in service, may now: `update_wait`).
    fn update_asked(&self) -> Option<&'static str> {
        let phase = self.input.status.phase.unwrap_or_default();
        let adopted = self.record.adopted && matches!(phase, Phase::Onboarding | Phase::Testing);
        let in_service = adopted || matches!(phase, Phase::Active | Phase::Ready);
        if in_service && self.obs().update_wait.is_some() {
            return None;
        }
        match self.obs().node {
            NodeObs::Present { maintenance_required: true, .. } => Some(
                "the Node asks for it (hypervisor.cloud.sap/maintenance-required, or an --update-signal)",
            ),
            NodeObs::Present { cordoned: true, drain_refused: true, .. } => {
                Some("a drain of the Node was refused while VMs needed its pods")
            }
            NodeObs::Present { cordoned: true, .. } if self.input.policy.cordon_starts_maintenance => {
                Some("the Node is cordoned")
            }
            _ => None,
        }
    }

    /// The reason that goes with the maintenance: the spec's, or the
    /// update's.
    fn maintenance_reason(&self) -> String {
        if self.input.spec.maintenance == MaintenanceMode::None {
            self.update_asked().unwrap_or_default().to_string()
        } else {
            self.input.spec.maintenance_reason.clone()
        }
    }

    /// This reconcile's verdict lost sight of the host (Unreachable or
    /// Failed) at least the grace ago: the cause, for Nova's reason. Such a
    /// host is never enabled; it is held (disabled) unless the shell's
    /// fleet gate holds new holds back.
    fn unseen_due(&self) -> Option<String> {
        let h = self.obs().health.as_ref()?;
        if !matches!(h.state, HealthState::Unreachable | HealthState::Failed) {
            return None;
        }
        let lost_for = h.since.map(|s| self.input.now.duration_since(s));
        lost_for
            .is_none_or(|t| t >= self.input.policy.unreachable_grace)
            .then(|| format!("{}: {}", h.state, h.summary))
    }

    /// Clears a held host to come back: enabled, and the hold gone once
    /// Nova shows it so.
    fn lift(&mut self, host: &NovaHost) -> Recheck {
        if host.enabled {
            self.record.unseen = None;
            return Recheck::Lifted;
        }
        match self.enable_if_ours(host) {
            Enabling::Enables => Recheck::Enabling,
            // Someone else's disable since: the hold is over, theirs stays.
            Enabling::Theirs => {
                self.record.unseen = None;
                Recheck::Lifted
            }
            // Seen again, as another machine, or waiting for its
            // dependencies: still held.
            Enabling::NotThisMachine | Enabling::Waits => Recheck::Held,
        }
    }

    /// Enables the compute service when the disable Nova shows is ours
    /// ([`disables`]); one made by anyone else stands, shown in
    /// `SchedulingEnabled` (`DisabledElsewhere`, an Event when it begins).
    /// Answers whether it enables.
    fn enable_if_ours(&mut self, host: &NovaHost) -> Enabling {
        let phase = self.input.status.phase.unwrap_or_default();
        let in_service = !matches!(phase, Phase::Initial | Phase::Onboarding | Phase::Testing | Phase::Ready);
        let recorded = self.record.disabled_as.as_deref();
        match disables::ours_to_enable(host.disabled_reason.as_deref(), recorded, in_service) {
            // Ours, but for another machine than the one Nova means: held.
            Ok(()) if !same_machine(self, host, self.phase == Phase::Ready) => Enabling::NotThisMachine,
            Ok(()) => match self.dependencies_unmet() {
                Some(message) => {
                    let reason = DEPENDENCIES_NOT_READY;
                    self.set(ConditionType::SchedulingEnabled, ConditionStatus::False, reason, message);
                    Enabling::Waits
                }
                None => {
                    self.actions.push(Action::EnableService);
                    Enabling::Enables
                }
            },
            Err(reason) => {
                let message = disables::elsewhere_message(&reason);
                let shown = self.input.status.conditions.iter().any(|c| {
                    c.type_ == ConditionType::SchedulingEnabled.as_str() && c.reason == DISABLED_ELSEWHERE
                }) || self.warnings.iter().any(|w| w.reason == DISABLED_ELSEWHERE);
                if !shown {
                    self.warn(DISABLED_ELSEWHERE, format!("{}: {message}", self.nova_host()));
                }
                self.set(
                    ConditionType::SchedulingEnabled,
                    ConditionStatus::False,
                    DISABLED_ELSEWHERE,
                    message,
                );
                Enabling::Theirs
            }
        }
    }

    /// What the host's dependency pods lack before it may be enabled
    /// (every enable of ours waits for them: a host back from an eviction
    /// or a hold too); None when nothing.
    fn dependencies_unmet(&self) -> Option<String> {
        match &self.obs().dependencies {
            Some(unmet) if unmet.is_empty() => None,
            Some(unmet) => Some(format!("waiting for {}", unmet.join("; "))),
            None => Some("the dependency pods (--node-dependency) are not read yet".into()),
        }
    }

    fn hold_unseen(&mut self, cause: String) {
        self.record.unseen = Some(UnseenHold {
            disabled_at: Time(self.input.now),
            cause,
            recheck_run: None,
            recheck_failed: false,
        });
    }

    fn hold_requested(&self) -> bool {
        self.effective_maintenance().is_requested()
    }

    /// Disable the compute service if Nova shows it enabled, its reason
    /// recorded (the shell writes the record before it sends the disable).
    fn guard_disabled(&mut self, host: &NovaHost, reason: &str) {
        if host.enabled && !self.actions.iter().any(|a| matches!(a, Action::DisableService { .. })) {
            let reason = truncate(reason, 255);
            disables::record(&mut self.record.disabled_as, &reason);
            self.actions.push(Action::DisableService { reason });
        }
    }

    fn spec_traits(&self) -> Result<BTreeSet<String>, BTreeSet<String>> {
        let (good, bad): (BTreeSet<String>, BTreeSet<String>) =
            self.input.spec.custom_traits.iter().cloned().partition(|t| valid_trait(t));
        if bad.is_empty() { Ok(good) } else { Err(bad) }
    }

    /// Emit the aggregate and trait changes that bring Nova to spec (adds
    /// before removes) and record ownership. Returns what is still pending.
    fn sync_nova_config(&mut self, host: &NovaHost) -> Option<String> {
        let want_aggs: BTreeSet<String> = self.input.spec.aggregates.iter().cloned().collect();
        let mut owned_aggs: BTreeSet<String> = self.record.applied_aggregates.iter().cloned().collect();
        let to_add: BTreeSet<String> = want_aggs.difference(&host.aggregates).cloned().collect();
        // Forget aggregates we no longer want and Nova no longer has.
        owned_aggs.retain(|a| want_aggs.contains(a) || host.aggregates.contains(a));
        let mut pending = Vec::new();
        for a in &to_add {
            self.actions.push(Action::AddAggregate { name: a.clone() });
            owned_aggs.insert(a.clone());
            pending.push(format!("adding to aggregate {a}"));
        }
        if to_add.is_empty() {
            for a in owned_aggs.iter().filter(|a| !want_aggs.contains(*a) && host.aggregates.contains(*a)) {
                self.actions.push(Action::RemoveAggregate { name: a.clone() });
                pending.push(format!("removing from aggregate {a}"));
            }
        }
        self.record.applied_aggregates = owned_aggs.into_iter().collect();

        let Ok(mut want_traits) = self.spec_traits() else {
            return Some("invalid traits in spec".into());
        };
        let Some(have) = &host.traits else {
            pending.push("waiting for the resource provider in Placement".into());
            return Some(pending.join("; "));
        };
        let mut owned: BTreeSet<String> = self.record.applied_traits.iter().cloned().collect();
        match &self.obs().host_traits {
            Some(from_host) => want_traits.extend(from_host.iter().cloned()),
            // Capabilities not reported yet: the host's traits we added stay.
            None => want_traits.extend(owned.iter().filter(|t| host_traits::is_host_trait(t)).cloned()),
        }
        owned.retain(|t| want_traits.contains(t) || have.contains(t));
        let add: BTreeSet<String> = want_traits.difference(have).cloned().collect();
        let remove: BTreeSet<String> =
            owned.iter().filter(|t| !want_traits.contains(*t) && have.contains(*t)).cloned().collect();
        if !add.is_empty() {
            pending.push(format!("adding traits {}", list(&add)));
            owned.extend(add.iter().cloned());
            self.actions.push(Action::AddTraits { traits: add });
        }
        if !remove.is_empty() {
            pending.push(format!("removing traits {}", list(&remove)));
            self.actions.push(Action::RemoveTraits { traits: remove });
        }
        self.record.applied_traits = owned.into_iter().collect();
        if pending.is_empty() { None } else { Some(pending.join("; ")) }
    }

    fn start_test_run(&mut self) {
        self.record.test_run = self.record.test_run.saturating_add(1);
        self.record.test_started = Some(Time(self.input.now));
        if self.obs().agent.connected {
            self.actions.push(Action::RunChecks { run: self.record.test_run });
        }
    }

    fn observed_eviction(&self, name: &str) -> Option<&'a EvictionObs> {
        self.obs().eviction.as_ref().filter(|e| e.name == name)
    }

    /// When the host counted fenced, its fencing started (None: not fenced).
    fn fenced_since(&self) -> Option<Time> {
        let fencing = self.input.status.fencing.as_ref()?;
        fencing.fenced.as_ref()?;
        fencing.started.clone()
    }

    fn create_maintenance_eviction(&mut self, mode: MaintenanceMode) {
        let Some(reason) = mode.eviction_reason() else {
            return;
        };
        self.create_eviction(mode.as_str(), reason);
    }

    /// An Eviction the maintenance stands for, named after `kind`. Made
    /// for a fenced host, it is that fencing's evacuation, seen running or
    /// not (it may end before the next reconcile, or across a fail-over).
    fn create_eviction(&mut self, kind: &str, reason: EvictionReason) {
        if let Some(started) = self.fenced_since() {
            self.record.evacuated_for = Some(started);
        }
        let mode = self.effective_maintenance();
        self.record.eviction_seq = self.record.eviction_seq.saturating_add(1);
        let name = truncate(&format!("{}-{kind}-{}", self.input.name, self.record.eviction_seq), 253);
        self.record.eviction =
            Some(EvictionRef { name: name.clone(), reason, re_enable: false, for_maintenance: true });
        self.actions.push(Action::CreateEviction { name: name.clone(), reason });
        self.set(
            ConditionType::Evicted,
            ConditionStatus::False,
            "EvictionPending",
            format!("Eviction {name} requested"),
        );
        let why = if reason == EvictionReason::NodeFailure && mode != MaintenanceMode::Ha {
            format!("fenced in maintenance ({}) with servers left: they are evacuated", mode.as_str())
        } else {
            format!("maintenance ({}) requested", mode.as_str())
        };
        self.go(Phase::Evicting, why);
    }

    fn finish(mut self) -> Decision {
        if let Some(registered) = self.record.nova_host.clone()
            && registered != self.input.spec.nova_host(self.input.name)
        {
            let msg = format!(
                "spec.novaHost names {} but the compute service was found as {registered}, which stays in use; \
                 revert spec.novaHost, or decommission this Hypervisor and create a new one",
                self.input.spec.nova_host(self.input.name)
            );
            self.set(ConditionType::Onboarded, ConditionStatus::False, "NovaHostChanged", msg);
        }
        self.default_conditions();
        let phase_since = if self.transition.is_some() {
            Some(Time(self.input.now))
        } else {
            self.input.status.phase_since.clone().or(Some(Time(self.input.now)))
        };
        self.set.sort_by_key(|c| c.type_);
        Decision {
            phase: self.phase,
            phase_since,
            transition: self.transition,
            actions: self.actions,
            conditions: self.set,
            record: self.record,
            service_id: self.service_id,
            hypervisor_id: self.hypervisor_id,
            checks: self.checks,
            warnings: self.warnings,
            power_state: self.power_state,
        }
    }

    /// Fill in the owned conditions the phase logic did not set.
    fn default_conditions(&mut self) {
        use ConditionStatus::{False, True, Unknown};
        use ConditionType as T;
        let p = self.phase;
        let has = |set: &[DesiredCondition], t: T| set.iter().any(|c| c.type_ == t);
        if p == Phase::Aborted {
            let (reason, message) = match &self.record.abort {
                Some(a) => (a.reason.clone(), a.message.clone()),
                None => ("Unknown".into(), "aborted".into()),
            };
            // The cause is the reason, so `kubectl get -o wide` and alerts
            // can group aborted nodes by what went wrong.
            self.set(
                T::Aborted,
                True,
                &reason,
                format!("{message}; fix the cause, then `hvctl retry {}`", self.input.name),
            );
            // Said again as the abort set it: its condition and reason
            // are one record.
            if let Some(a) = self.record.abort.clone()
                && !has(&self.set, a.condition)
            {
                self.set(a.condition, False, &a.reason, a.message);
            }
        } else {
            self.set(T::Aborted, False, "NotAborted", String::new());
        }
        if !has(&self.set, T::Onboarded) {
            let (s, r) = match p {
                Phase::Initial | Phase::Onboarding | Phase::Aborted => (Unknown, "Pending"),
                Phase::Decommissioned => (False, "Decommissioned"),
                _ => (True, "Onboarded"),
            };
            self.set(T::Onboarded, s, r, String::new());
        }
        if !has(&self.set, T::Tested) {
            let (s, r) = match p {
                Phase::Initial | Phase::Onboarding | Phase::Aborted | Phase::Decommissioned => {
                    (Unknown, "Pending")
                }
                Phase::Testing => (Unknown, "Starting"),
                _ if self.record.adopted_checks_failed.is_some() => (False, ADOPTED_CHECKS_FAILED),
                _ if self.input.spec.skip_tests => (True, "Skipped"),
                _ => (True, "Passed"),
            };
            let m = if r == ADOPTED_CHECKS_FAILED {
                self.record.adopted_checks_failed.clone().unwrap_or_default()
            } else {
                String::new()
            };
            self.set(T::Tested, s, r, m);
        }
        if !has(&self.set, T::Evicted) {
            let (s, r) = match p {
                Phase::Maintenance | Phase::Decommissioned => (True, "Evicted"),
                Phase::Evicting => (False, "EvictionRunning"),
                _ => (False, "NotRequested"),
            };
            self.set(T::Evicted, s, r, String::new());
        }
        let enabled = match &self.obs().nova {
            NovaObs::Registered(h) if h.enabled => (True, "Enabled", String::new()),
            NovaObs::Registered(h) => (False, "Disabled", h.disabled_reason.clone().unwrap_or_default()),
            NovaObs::NotRegistered => (False, "NotRegistered", String::new()),
            _ => (Unknown, "NovaUnknown", String::new()),
        };
        // Report what Nova will be once our actions ran, so the condition
        // does not flap between reconciles.
        let enabling = self.actions.iter().any(|a| matches!(a, Action::EnableService));
        let disabling = self.actions.iter().find_map(|a| match a {
            Action::DisableService { reason } => Some(reason.clone()),
            _ => None,
        });
        let (s, r, m) = match (enabling, disabling) {
            (true, _) => (True, "Enabling", String::new()),
            (_, Some(reason)) => (False, "Disabling", reason),
            _ => enabled,
        };
        if !has(&self.set, T::SchedulingEnabled) {
            self.set(T::SchedulingEnabled, s, r, m);
        }
    }
}

// ------------------------------------------------------------------ helpers

fn disable_reason(mode: MaintenanceMode, reason: &str) -> String {
    if reason.is_empty() {
        format!("hv-lifecycle: maintenance ({})", mode.as_str())
    } else {
        format!("hv-lifecycle: maintenance ({}): {reason}", mode.as_str())
    }
}

/// The Eviction in a condition's message. Its counts only once it is over:
/// a running one's counts change with every VM moved, and its host is not
/// reconciled for each (the Eviction's own status has them).
fn eviction_summary(e: &EvictionObs) -> String {
    if !e.is_running() {
        format!("Eviction {} {:?}: {}/{} migrated", e.name, e.phase, e.migrated, e.total)
    } else {
        format!("Eviction {} {:?} (its status counts the VMs moved)", e.name, e.phase)
    }
}

/// `CUSTOM_` followed by upper-case letters, digits and underscores
/// (Placement's rule for custom traits), at most 255 characters.
pub fn valid_trait(t: &str) -> bool {
    t.len() <= 255
        && t.strip_prefix("CUSTOM_").is_some_and(|rest| {
            !rest.is_empty()
                && rest.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        })
}

fn list(set: &BTreeSet<String>) -> String {
    set.iter().map(String::as_str).collect::<Vec<_>>().join(", ")
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn human(d: SignedDuration) -> String {
    let secs = d.as_secs();
    if secs % 60 == 0 { format!("{}m", secs / 60) } else { format!("{secs}s") }
}
