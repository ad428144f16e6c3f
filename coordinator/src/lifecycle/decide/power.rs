//! A host's power in the lifecycle (docs/power.md). An Active host whose
//! spec asks to hibernate is handed to [`machine`]: emptied hosts only,
//! disabled in Nova with our reason, powered off, and woken through their
//! checks. While its power stands anywhere but `Running`, the lifecycle
//! leaves the host to it: no enable, no drift repair, no unseen hold, and
//! its health is not judged ([`crate::lifecycle::judged`]).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::Draft;
use crate::api::power::{DesiredPower, HostPower, PowerRecord};
use crate::api::{ConditionStatus, ConditionType, MaintenanceMode, Phase};
use crate::lifecycle::action::Action;
use crate::lifecycle::disables::{self, Disabler};
use crate::lifecycle::observe::{NodeObs, NovaHost, NovaObs, ServiceState};
use crate::power::machine::{self, Checks, Next, Seen, Step};

/// Our disable of a host we hibernate: kept while it is off and on its way
/// back, lifted only once its checks pass.
pub const HIBERNATING_REASON: &str = "hv-lifecycle: hibernating (powered off while empty)";

/// What the host's power is held to: the spec's wish, but never
/// hibernating outside Active, nor under a maintenance or an Eviction
/// (which need the host up: its checks run again on the way back).
fn wish(d: &Draft<'_>) -> DesiredPower {
    if d.phase == Phase::Active && !leaving(d) { d.input.spec.power_state } else { DesiredPower::Running }
}

/// A maintenance or an Eviction takes the host out of service next.
fn leaving(d: &Draft<'_>) -> bool {
    d.hold_requested() || d.obs().eviction.as_ref().is_some_and(|e| e.is_active())
}

/// Answers whether the host's power holds it: then the lifecycle does
/// nothing else for it in this decision.
pub(super) fn holds(d: &mut Draft<'_>) -> bool {
    let state = d.input.status.power_state.unwrap_or(HostPower::Running);
    let wish = wish(d);
    if state == HostPower::Running && wish == DesiredPower::Running {
        if d.input.status.power_state.is_some() {
            say(d, wish, HostPower::Running, "Running", "running".into());
        }
        d.record.power = None;
        return false;
    }
    // A host off for good leaves Nova without waking: empty and disabled,
    // it needs nothing of its machine to be decommissioned.
    let off = matches!(state, HostPower::Hibernating | HostPower::FailedToStart | HostPower::FailedToStop);
    if off && d.effective_maintenance() == MaintenanceMode::Termination {
        return false;
    }
    let host = match &d.obs().nova {
        NovaObs::Registered(host) => host.clone(),
        // Nova unread: nothing is decided; a host on its way is left where it is.
        _ => return !matches!(state, HostPower::Running | HostPower::Unsupported),
    };
    let seen = seen(d, &host, state);
    if seen.retry
        && let Some(token) = d.fresh_retry()
    {
        d.record.handled_retry = Some(token.clone());
    }
    tested(d, state);
    let next = machine::decide(wish, state, &seen, &d.input.policy.power);
    match next.step {
        Some(Step::Disable) => d.guard_disabled(&host, HIBERNATING_REASON),
        // Back in service either way: an enable that waits (a dependency
        // pod not Ready) is the lifecycle's to finish, our disable being
        // recorded as ours. Not enabled at all when a maintenance or an
        // Eviction takes the host next: it stays disabled for them.
        Some(Step::Enable) if !leaving(d) => {
            d.enable_if_ours(&host);
        }
        Some(Step::Enable) => {}
        Some(Step::PowerOff) => d.actions.push(Action::PowerOff),
        Some(Step::PowerOn) => d.actions.push(Action::PowerOn),
        Some(Step::RunChecks) => d.start_test_run(),
        // Asked again at every look until its report comes: an ask lost
        // with a session (a new leader, an agent restarted) is not waited
        // out (the agent runs a run once per session).
        None if next.state == HostPower::WaitingForChecks && seen.checks == Checks::Running => {
            if let Some(run) =
                d.record.power.as_ref().and_then(|p| p.check_run).filter(|_| d.obs().agent.connected)
            {
                d.actions.push(Action::RunChecks { run });
            }
        }
        None => {}
    }
    record(d, state, &next);
    say(d, wish, next.state, next.reason, next.message.clone());
    // From Stopping on, the host is the power's: disabled with our reason.
    let held = !matches!(next.state, HostPower::Running | HostPower::Unsupported);
    if held {
        let msg = format!("{}: {}", next.state, next.message);
        d.set(ConditionType::SchedulingEnabled, ConditionStatus::False, "PowerManaged", msg);
    }
    held || next.step.is_some()
}

/// What the machine decides on, from this reconcile's reads.
fn seen(d: &Draft<'_>, host: &NovaHost, state: HostPower) -> Seen {
    let obs = d.obs();
    let ours = !host.enabled
        && host.disabled_reason.as_deref().map(str::trim) == Some(HIBERNATING_REASON)
        && disables::disabler(host.disabled_reason.as_deref(), d.record.disabled_as.as_deref())
            == Disabler::Us;
    let since = d.record.power.as_ref().map(|p| p.since.0);
    let off_since = d.record.power.as_ref().and_then(|p| p.off_since.as_ref()).map(|t| t.0);
    let node_ready = matches!(obs.node, NodeObs::Present { ready: true, .. });
    let session_since_off = off_since.is_none_or(|off| obs.agent.since.is_some_and(|s| s > off));
    let in_state_for = since
        .map(|s| d.input.now.duration_since(s))
        .and_then(|s| Duration::try_from(s).ok())
        .unwrap_or_default();
    Seen {
        bmc: obs.power.bmc,
        servers: Some(host.instances.clone()),
        domains: obs.agent.connected.then_some(obs.agent.domains).flatten(),
        disabled_by_us: ours,
        disabled_by_others: !host.enabled && !ours,
        power: obs.power.reading,
        agent_connected: obs.agent.connected && node_ready && session_since_off,
        compute_up: host.service_state == ServiceState::Up,
        checks: checks(d),
        retry: matches!(state, HostPower::FailedToStop | HostPower::FailedToStart)
            && d.fresh_retry().is_some(),
        in_state_for,
    }
}

/// The wake's check run, as far as its report says.
fn checks(d: &Draft<'_>) -> Checks {
    if d.input.spec.skip_tests {
        return Checks::Passed;
    }
    let Some(run) = d.record.power.as_ref().and_then(|p| p.check_run) else { return Checks::NotRun };
    match d.obs().checks.as_ref().filter(|r| r.run == run) {
        None => Checks::Running,
        Some(r) if !r.results.is_empty() && r.results.iter().all(|c| c.passed) => Checks::Passed,
        Some(_) => Checks::Failed,
    }
}

/// The wake's check run, once reported: stored, and said in `Tested`.
fn tested(d: &mut Draft<'_>, state: HostPower) {
    let Some(run) = d.record.power.as_ref().and_then(|p| p.check_run) else { return };
    let Some(report) =
        d.obs().checks.clone().filter(|r| r.run == run && state == HostPower::WaitingForChecks)
    else {
        return;
    };
    let failing: Vec<String> =
        report.results.iter().filter(|c| !c.passed).map(|c| format!("{}: {}", c.name, c.message)).collect();
    let (status, reason, message) = match (report.results.is_empty(), failing.is_empty()) {
        (false, true) => {
            (ConditionStatus::True, "Passed", format!("run {run}: checks passed after the host was woken"))
        }
        (true, _) => {
            (ConditionStatus::False, "ChecksFailed", format!("run {run}: the agent reported no checks"))
        }
        (false, false) => {
            (ConditionStatus::False, "ChecksFailed", format!("run {run}: {}", failing.join("; ")))
        }
    };
    d.checks = Some(report.results);
    d.set(ConditionType::Tested, status, reason, message);
}

/// The record: since when the host stands where it does, and the run its
/// wake started.
fn record(d: &mut Draft<'_>, state: HostPower, next: &Next) {
    let now = Time(d.input.now);
    let started = (next.step == Some(Step::RunChecks)).then_some(d.record.test_run);
    let read_off = next.state == HostPower::Hibernating && state != HostPower::Hibernating;
    let off_since =
        if read_off { Some(now.clone()) } else { d.record.power.as_ref().and_then(|p| p.off_since.clone()) };
    if next.state == HostPower::Running {
        d.record.power = None;
    } else if next.state != state || d.record.power.is_none() {
        d.record.power = Some(PowerRecord { since: now, check_run: started, off_since });
    } else if let (Some(run), Some(p)) = (started, d.record.power.as_mut()) {
        p.check_run = Some(run);
    }
    d.power_state = Some(next.state);
}

/// The `PowerState` condition: True where the spec asks it to be.
fn say(d: &mut Draft<'_>, wish: DesiredPower, state: HostPower, reason: &str, message: String) {
    let there = match wish {
        DesiredPower::Running => state.in_service(),
        DesiredPower::Hibernating => state == HostPower::Hibernating,
    };
    let status = if there { ConditionStatus::True } else { ConditionStatus::False };
    d.power_state = Some(state);
    d.set(ConditionType::PowerState, status, reason, message);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::MaintenanceMode;
    use crate::api::hypervisor::{HypervisorSpec, HypervisorStatus};
    use crate::lifecycle::fixtures::{decide_at, obs, report, spec, status, t, with_host};
    use crate::lifecycle::{Decision, Observations, PowerObs};
    use crate::power::machine::Power;

    /// An Active host in service, empty, with a BMC, its agent reporting
    /// no domain.
    fn active() -> (HypervisorSpec, HypervisorStatus, Observations) {
        let mut o = obs();
        with_host(&mut o, |h| {
            h.enabled = true;
            h.disabled_reason = None;
        });
        o.agent.domains = Some(0);
        o.power = PowerObs { bmc: true, reading: Power::Unread };
        let mut status = status(Phase::Active);
        status.lifecycle.disabled_as = Some(vec![]);
        (spec(), status, o)
    }

    /// The status as the shell writes it from `d`.
    fn written(status: &HypervisorStatus, d: &Decision) -> HypervisorStatus {
        let mut s = status.clone();
        s.phase = Some(d.phase);
        s.power_state = d.power_state;
        s.lifecycle = d.record.clone();
        s
    }

    fn condition(d: &Decision, t: ConditionType) -> (ConditionStatus, String, String) {
        let c = d.conditions.iter().find(|c| c.type_ == t).cloned();
        c.map(|c| (c.status, c.reason, c.message)).unwrap_or((
            ConditionStatus::Unknown,
            String::new(),
            String::new(),
        ))
    }

    #[test]
    fn an_empty_host_hibernates_and_wakes_through_its_checks_and_nothing_else_acts_meanwhile() {
        let (mut spec, mut status, mut o) = active();
        spec.power_state = DesiredPower::Hibernating;
        // Disabled with our reason, kept in its aggregates.
        let d = decide_at(&spec, &status, &o, t(10));
        assert_eq!(d.actions, [Action::DisableService { reason: HIBERNATING_REASON.into() }]);
        assert_eq!(d.power_state, Some(HostPower::Stopping));
        assert_eq!(d.phase, Phase::Active);
        status = written(&status, &d);
        with_host(&mut o, |h| {
            h.enabled = false;
            h.disabled_reason = Some(HIBERNATING_REASON.into());
        });
        // Still empty: powered off, asked once.
        let d = decide_at(&spec, &status, &o, t(20));
        assert_eq!(d.actions, [Action::PowerOff]);
        assert_eq!(d.power_state, Some(HostPower::WaitingForPowerOff));
        status = written(&status, &d);
        let d = decide_at(&spec, &status, &o, t(25));
        assert!(d.actions.is_empty(), "waiting, not asked again: {:?}", d.actions);
        // Off twice: hibernating, its agent and nova-compute gone; nothing
        // enables it, nothing else is done for it.
        o.power.reading = Power::Off;
        o.agent = crate::lifecycle::AgentObs { connected: false, domains: None, since: None };
        with_host(&mut o, |h| h.service_state = ServiceState::Down);
        let d = decide_at(&spec, &status, &o, t(40));
        assert_eq!(d.power_state, Some(HostPower::Hibernating));
        status = written(&status, &d);
        o.power.reading = Power::Unread;
        for at in [t(100), t(100_000)] {
            let d = decide_at(&spec, &status, &o, at);
            assert!(d.actions.is_empty(), "{:?}", d.actions);
            assert_eq!((d.phase, d.power_state), (Phase::Active, Some(HostPower::Hibernating)));
            assert_eq!(condition(&d, ConditionType::PowerState).0, ConditionStatus::True);
            assert_eq!(condition(&d, ConditionType::SchedulingEnabled).1, "PowerManaged");
        }
        // Woken: powered on once, then its agent and nova-compute, its checks.
        spec.power_state = DesiredPower::Running;
        let d = decide_at(&spec, &status, &o, t(200));
        assert_eq!(d.actions, [Action::PowerOn]);
        assert_eq!(condition(&d, ConditionType::PowerState).0, ConditionStatus::False);
        status = written(&status, &d);
        o.power.reading = Power::On;
        let d = decide_at(&spec, &status, &o, t(210));
        assert_eq!((d.power_state, d.actions.len()), (Some(HostPower::WaitingForAgent), 0));
        status = written(&status, &d);
        o.power.reading = Power::Unread;
        o.agent = crate::lifecycle::AgentObs { connected: true, domains: Some(0), since: Some(t(250)) };
        with_host(&mut o, |h| h.service_state = ServiceState::Up);
        let d = decide_at(&spec, &status, &o, t(300));
        let run = status.lifecycle.test_run + 1;
        assert_eq!(d.actions, [Action::RunChecks { run }]);
        assert_eq!(d.power_state, Some(HostPower::WaitingForChecks));
        status = written(&status, &d);
        // A report of an earlier run counts for nothing (the run is asked
        // again); a failing one of this run stops it disabled.
        o.checks = Some(report(run - 1, &[]));
        let d = decide_at(&spec, &status, &o, t(310));
        assert_eq!(d.actions, [Action::RunChecks { run }]);
        let mut failing = o.clone();
        failing.checks = Some(report(run, &["libvirt-version"]));
        let d = decide_at(&spec, &status, &failing, t(310));
        assert_eq!((d.power_state, d.actions.len()), (Some(HostPower::FailedToStart), 0));
        // Passed: enabled, our disable lifted; then the lifecycle again.
        o.checks = Some(report(run, &[]));
        let d = decide_at(&spec, &status, &o, t(320));
        assert_eq!(d.actions, [Action::EnableService]);
        assert_eq!(d.power_state, Some(HostPower::Running));
        assert_eq!(d.record.power, None);
        status = written(&status, &d);
        with_host(&mut o, |h| {
            h.enabled = true;
            h.disabled_reason = None;
        });
        let d = decide_at(&spec, &status, &o, t(330));
        assert!(d.actions.is_empty(), "{:?}", d.actions);
        assert_eq!(condition(&d, ConditionType::PowerState).0, ConditionStatus::True);
        assert_eq!(condition(&d, ConditionType::SchedulingEnabled).0, ConditionStatus::True);
    }

    #[test]
    fn a_host_with_a_server_is_not_hibernated_and_the_server_is_named() {
        let (mut spec, status, mut o) = active();
        spec.power_state = DesiredPower::Hibernating;
        with_host(&mut o, |h| h.instances = vec!["vm-7f3a".into()]);
        let d = decide_at(&spec, &status, &o, t(10));
        assert!(d.actions.is_empty(), "{:?}", d.actions);
        assert_eq!(d.power_state, Some(HostPower::Running));
        let (s, reason, message) = condition(&d, ConditionType::PowerState);
        assert_eq!((s, reason.as_str()), (ConditionStatus::False, "HostNotEmpty"));
        assert!(message.contains("vm-7f3a"), "{message}");
        // Domains its agent reports count as much as Nova's list.
        let (_, status, mut o) = active();
        o.agent.domains = Some(2);
        let d = decide_at(&spec, &status, &o, t(10));
        assert!(d.actions.is_empty(), "{:?}", d.actions);
        assert!(condition(&d, ConditionType::PowerState).2.contains("2 domains"));
    }

    #[test]
    fn a_hibernated_host_asked_for_maintenance_is_woken_before_anything_else() {
        let (mut spec, mut status, mut o) = active();
        spec.maintenance = MaintenanceMode::Manual;
        spec.maintenance_reason = "firmware".into();
        spec.power_state = DesiredPower::Hibernating;
        status.power_state = Some(HostPower::Hibernating);
        status.lifecycle.power =
            Some(PowerRecord { since: Time(t(0)), check_run: None, off_since: Some(Time(t(0))) });
        o.agent = crate::lifecycle::AgentObs { connected: false, domains: None, since: None };
        with_host(&mut o, |h| {
            h.enabled = false;
            h.disabled_reason = Some(HIBERNATING_REASON.into());
        });
        status.lifecycle.disabled_as = Some(vec![HIBERNATING_REASON.into()]);
        let d = decide_at(&spec, &status, &o, t(10));
        assert_eq!(d.actions, [Action::PowerOn]);
        assert_eq!(d.phase, Phase::Active, "no eviction, no maintenance before it is back");
        // Nova not read: nothing decided, the host left where it is.
        o.nova = NovaObs::Unreachable("timeout".into());
        let d = decide_at(&spec, &status, &o, t(10));
        assert!(d.actions.is_empty(), "{:?}", d.actions);
        assert_eq!((d.phase, d.power_state), (Phase::Active, Some(HostPower::Hibernating)));
    }

    #[test]
    fn a_woken_host_a_maintenance_waits_for_is_never_enabled_and_its_checks_are_asked_again() {
        let (mut spec, mut status, mut o) = active();
        status.power_state = Some(HostPower::WaitingForChecks);
        status.lifecycle.test_run = 4;
        status.lifecycle.power =
            Some(PowerRecord { since: Time(t(0)), check_run: Some(4), off_since: Some(Time(t(0))) });
        status.lifecycle.disabled_as = Some(vec![HIBERNATING_REASON.into()]);
        with_host(&mut o, |h| {
            h.enabled = false;
            h.disabled_reason = Some(HIBERNATING_REASON.into());
        });
        o.agent.since = Some(t(5));
        // No report yet: the run is asked again (the same run).
        let d = decide_at(&spec, &status, &o, t(60));
        assert_eq!(d.actions, [Action::RunChecks { run: 4 }]);
        // Passed: enabled, unless a maintenance takes it next.
        o.checks = Some(report(4, &[]));
        let d = decide_at(&spec, &status, &o, t(70));
        assert_eq!(d.actions, [Action::EnableService]);
        spec.maintenance = MaintenanceMode::Manual;
        spec.maintenance_reason = "firmware".into();
        let d = decide_at(&spec, &status, &o, t(70));
        assert!(!d.actions.contains(&Action::EnableService), "{:?}", d.actions);
        assert_eq!(d.power_state, Some(HostPower::Running));
    }

    #[test]
    fn a_hibernated_host_whose_node_goes_is_decommissioned_without_waking() {
        let (mut spec, mut status, mut o) = active();
        spec.power_state = DesiredPower::Hibernating;
        status.power_state = Some(HostPower::Hibernating);
        status.lifecycle.power =
            Some(PowerRecord { since: Time(t(0)), check_run: None, off_since: Some(Time(t(0))) });
        o.node = crate::lifecycle::NodeObs::Deleting;
        o.agent = crate::lifecycle::AgentObs { connected: false, domains: None, since: None };
        with_host(&mut o, |h| {
            h.enabled = false;
            h.disabled_reason = Some(HIBERNATING_REASON.into());
        });
        let d = decide_at(&spec, &status, &o, t(10));
        assert!(!d.actions.contains(&Action::PowerOn), "{:?}", d.actions);
        assert!(d.actions.iter().any(|a| matches!(a, Action::CreateEviction { .. })), "{:?}", d.actions);
    }

    #[test]
    fn a_hibernated_host_powered_on_by_someone_else_is_read_again_and_an_old_session_does_not_count() {
        let (mut spec, mut status, mut o) = active();
        spec.power_state = DesiredPower::Hibernating;
        status.power_state = Some(HostPower::Hibernating);
        status.lifecycle.power =
            Some(PowerRecord { since: Time(t(0)), check_run: None, off_since: Some(Time(t(5))) });
        with_host(&mut o, |h| {
            h.enabled = false;
            h.disabled_reason = Some(HIBERNATING_REASON.into());
        });
        status.lifecycle.disabled_as = Some(vec![HIBERNATING_REASON.into()]);
        // A session from before it went off: not the machine back.
        o.agent = crate::lifecycle::AgentObs { connected: true, domains: Some(0), since: Some(t(1)) };
        let d = decide_at(&spec, &status, &o, t(10));
        assert_eq!(d.power_state, Some(HostPower::Hibernating));
        // Read On: back through its reads, and off again once empty.
        o.power.reading = Power::On;
        let d = decide_at(&spec, &status, &o, t(20));
        assert_eq!(d.power_state, Some(HostPower::WaitingForAgent));
        assert_eq!(condition(&d, ConditionType::PowerState).1, "PoweredOnElsewhere");
        status = written(&status, &d);
        o.power.reading = Power::Unread;
        o.agent.since = Some(t(30));
        let d = decide_at(&spec, &status, &o, t(40));
        assert_eq!(d.actions, [Action::PowerOff]);
    }

    #[test]
    fn a_wake_asked_while_the_power_off_may_still_land_waits_to_read_it_off() {
        let (spec, mut status, o) = active();
        status.power_state = Some(HostPower::WaitingForPowerOff);
        status.lifecycle.power = Some(PowerRecord { since: Time(t(0)), check_run: None, off_since: None });
        let mut o = o;
        o.power.reading = Power::On;
        let d = decide_at(&spec, &status, &o, t(10));
        assert!(d.actions.is_empty(), "{:?}", d.actions);
        assert_eq!(d.power_state, Some(HostPower::WaitingForPowerOff));
        o.power.reading = Power::Off;
        let d = decide_at(&spec, &status, &o, t(12));
        assert_eq!(d.actions, [Action::PowerOn]);
    }

    #[test]
    fn a_host_without_a_bmc_is_unsupported_and_stays_in_service() {
        let (mut spec, status, mut o) = active();
        spec.power_state = DesiredPower::Hibernating;
        o.power.bmc = false;
        let d = decide_at(&spec, &status, &o, t(10));
        assert!(d.actions.is_empty(), "{:?}", d.actions);
        assert_eq!(d.power_state, Some(HostPower::Unsupported));
        assert_eq!(condition(&d, ConditionType::PowerState).1, "NoBmc");
        assert_eq!(condition(&d, ConditionType::SchedulingEnabled).0, ConditionStatus::True);
    }

    #[test]
    fn only_a_host_powered_as_in_service_is_judged() {
        use crate::lifecycle::judged;
        let on_the_way = HostPower::ALL.into_iter().filter(|p| !p.in_service());
        assert_eq!(on_the_way.clone().count(), 7);
        for power in on_the_way {
            assert!(Phase::ALL.iter().all(|phase| !judged(*phase, Some(power))), "{power}");
        }
        assert!(judged(Phase::Active, None) && judged(Phase::Active, Some(HostPower::Running)));
        assert!(!judged(Phase::Maintenance, Some(HostPower::Running)));
        assert!(!judged(Phase::Active, Some(HostPower::Hibernating)));
        assert!(!judged(Phase::Active, Some(HostPower::WaitingForAgent)));
        assert!(judged(Phase::Active, Some(HostPower::Unsupported)));
        assert!(judged(Phase::Active, Some(HostPower::Stopping)), "not asked to power off yet");
    }
}
