use super::*;
use crate::eviction::preflight::Finding;

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(secs).expect("a time")
}

fn condition(s: &EvictionStatus, type_: ConditionType) -> Option<(&str, &str)> {
    s.conditions.iter().find(|c| c.type_ == type_.as_str()).map(|c| (c.status.as_str(), c.reason.as_str()))
}

fn report(findings: usize) -> Report {
    let finding = |i: usize| Finding { check: "Resources", vm: format!("vm-{i}"), reason: "no room".into() };
    Report {
        findings: (0..findings).map(finding).collect(),
        plan: vec![],
        summary: "12 VM(s), room on 3 hosts".into(),
    }
}

#[test]
fn a_refused_eviction_fails_once_dated_and_says_why() {
    let r = Refusal { reason: "UnknownHypervisor", message: "no Hypervisor node-9".into() };
    let s = refused(EvictionStatus::default(), &r, Some(3), t(10));
    assert_eq!(s.phase, Some(EvictionPhase::Failed));
    assert_eq!(condition(&s, ConditionType::Target), Some(("False", "UnknownHypervisor")));
    assert_eq!((s.observed_generation, s.completed_at.clone()), (Some(3), Some(Time(t(10)))));
    let again = refused(s.clone(), &r, Some(3), t(20));
    assert_eq!(again.completed_at, Some(Time(t(10))), "its end is not dated again");
}

#[test]
fn only_a_failed_preflight_with_a_changed_spec_runs_again_as_a_run_of_its_own() {
    let (failed, _) = judged(EvictionStatus::default(), report(1), &FenceState::None, "h", Some(1), t(10));
    let again = run_again(&failed, Some(2), false).expect("runs again after a spec change");
    assert_eq!(again.phase, Some(EvictionPhase::Pending));
    assert_eq!((again.started_at, again.completed_at), (None, None));
    assert_eq!(run_again(&failed, Some(1), false), None, "the same spec");
    assert_eq!(run_again(&failed, Some(2), true), None, "being deleted");
    let (passed, _) = judged(EvictionStatus::default(), report(0), &FenceState::None, "h", Some(1), t(10));
    let mut ended = passed;
    ended.phase = Some(EvictionPhase::Failed);
    assert_eq!(run_again(&ended, Some(2), false), None, "failed after its preflight passed");
}

#[test]
fn the_preflight_passes_moves_on_on_a_fenced_host_and_stops_a_live_one() {
    let (s, on) = judged(EvictionStatus::default(), report(0), &FenceState::None, "h1", Some(1), t(10));
    assert!(on);
    assert_eq!((s.phase, s.host.as_deref()), (Some(EvictionPhase::Disabling), Some("h1")));
    assert_eq!(condition(&s, ConditionType::Preflight), Some(("True", "Passed")));
    assert_eq!(s.started_at, Some(Time(t(10))));
    let evacuation = Evacuation {
        by_default: true,
        rebuild_from_image: false,
        instance_disks_on_rbd: true,
        powered_off: true,
    };
    let fenced = FenceState::Fenced(evacuation);
    let (s, on) = judged(EvictionStatus::default(), report(2), &fenced, "h1", Some(1), t(10));
    assert!(on, "a fenced host's servers cannot stay");
    assert_eq!(condition(&s, ConditionType::Preflight), Some(("False", "FoundButEvacuating")));
    assert_eq!(condition(&s, ConditionType::HostFenced), Some(("True", "Evacuating")));
    let (s, on) = judged(EvictionStatus::default(), report(25), &FenceState::None, "h1", Some(1), t(10));
    assert!(!on);
    assert_eq!((s.phase, s.host), (Some(EvictionPhase::Failed), None));
    let message =
        s.conditions.iter().find(|c| c.type_ == "Preflight").map(|c| c.message.clone()).unwrap_or_default();
    assert!(message.starts_with("25 VM(s) cannot be moved") && message.contains("and 5 more"), "{message}");
}

#[test]
fn the_wait_for_the_disable_ends_in_migrations_or_fails_at_its_deadline() {
    let started = EvictionStatus { started_at: Some(Time(t(0))), ..Default::default() };
    let wait = |seen, now| disabling(&started, seen, "h1", Duration::from_secs(60), Some(1), t(now));
    assert!(matches!(wait(ServiceSeen::Disabled, 5), Disabling::Proceed(c) if c.reason == "Disabled"));
    assert_eq!(wait(ServiceSeen::Enabled, 59), Disabling::Wait(Duration::from_secs(1)));
    assert_eq!(
        wait(ServiceSeen::Unreadable, 600),
        Disabling::Wait(Duration::from_secs(5)),
        "Nova unread decides nothing"
    );
    let Disabling::Failed(s) = wait(ServiceSeen::Enabled, 60) else { panic!("the deadline") };
    assert_eq!(s.phase, Some(EvictionPhase::Failed));
    assert_eq!(condition(&s, ConditionType::HostDisabled), Some(("False", "NotDisabled")));
    let Disabling::Failed(s) = wait(ServiceSeen::Missing, 1) else { panic!("no service") };
    assert_eq!(condition(&s, ConditionType::HostDisabled), Some(("False", "NoComputeService")));
}

#[test]
fn a_dry_run_ends_planned_whatever_its_preflight_found() {
    use crate::api::eviction::PlannedVm;
    let vm = |id: &str, finding: Option<&str>| PlannedVm {
        id: id.into(),
        finding: finding.map(str::to_string),
        ..PlannedVm::default()
    };
    for (findings, progress) in [(0, "dry run: 2 VM(s), none stopped"), (1, "dry run: 2 VM(s), 1 stopped")] {
        let (mut s, _) =
            judged(EvictionStatus::default(), report(findings), &FenceState::None, "h", Some(1), t(10));
        s.preflight = vec![vm("a", None), vm("b", (findings > 0).then_some("capacity: no room"))];
        let s = planned(s, None, t(11));
        assert_eq!(s.phase, Some(EvictionPhase::Planned));
        assert!(s.phase.is_some_and(EvictionPhase::is_final));
        assert_eq!(s.progress.as_deref(), Some(progress));
        assert_eq!(s.completed_at, Some(Time(t(11))));
    }
}

#[test]
fn a_dry_run_held_ends_planned_saying_what_held_it() {
    let s = planned(EvictionStatus::default(), Some("Machine (NotTheMachine): none of the servers"), t(5));
    assert_eq!(s.phase, Some(EvictionPhase::Planned));
    assert_eq!(
        s.progress.as_deref(),
        Some("dry run: not judged: Machine (NotTheMachine): none of the servers")
    );
}

#[test]
fn a_preflight_short_only_of_room_waits_for_hibernated_hosts_then_fails_at_its_deadline() {
    use crate::eviction::preflight::{CAPACITY, COMPATIBILITY, CONSTRAINTS};
    let finding = |check| Finding { check, vm: "vm-1".into(), reason: "no room".into() };
    let short = Report { findings: vec![finding(CAPACITY), finding(CONSTRAINTS)], ..report(0) };
    let asleep = vec![("zone az-1".to_string(), vec!["c7".to_string()])];

    let s = waiting_for_room(EvictionStatus::default(), &short, &asleep, Some(1), t(100)).unwrap();
    assert_eq!(s.phase, Some(EvictionPhase::Preflight));
    assert_eq!(condition(&s, ConditionType::Preflight), Some(("False", WAITING_FOR_ROOM)));
    let c = s.conditions.iter().find(|c| c.type_ == "Preflight").unwrap();
    assert!(c.message.contains("zone az-1 (c7)") && c.message.contains("vm-1"), "{}", c.message);
    assert_eq!(c.last_transition_time.0, t(100));

    // Still waiting later: the wait is dated from its start, until the deadline.
    let wait = WAIT_FOR_ROOM.as_secs() as i64;
    let later = waiting_for_room(s.clone(), &short, &asleep, Some(1), t(100 + wait - 1)).unwrap();
    let c = later.conditions.iter().find(|c| c.type_ == "Preflight").unwrap();
    assert_eq!(c.last_transition_time.0, t(100));
    assert_eq!(waiting_for_room(s.clone(), &short, &asleep, Some(1), t(100 + wait)), None);

    // A wait after an earlier failure (False already) starts now.
    let (failed, _) = judged(EvictionStatus::default(), report(1), &FenceState::None, "h", Some(1), t(0));
    let s = waiting_for_room(failed, &short, &asleep, Some(2), t(5000)).unwrap();
    let c = s.conditions.iter().find(|c| c.type_ == "Preflight").unwrap();
    assert_eq!(c.last_transition_time.0, t(5000));

    // Nothing to wake, no finding, or a VM stopped by more than room: judged as usual.
    let empty: Vec<(String, Vec<String>)> = vec![];
    assert_eq!(waiting_for_room(EvictionStatus::default(), &short, &empty, None, t(0)), None);
    assert_eq!(waiting_for_room(EvictionStatus::default(), &report(0), &asleep, None, t(0)), None);
    let locked = Report { findings: vec![finding(CAPACITY), finding(COMPATIBILITY)], ..report(0) };
    assert_eq!(waiting_for_room(EvictionStatus::default(), &locked, &asleep, None, t(0)), None);
}
