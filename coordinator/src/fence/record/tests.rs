use super::*;
use crate::fence::decide::FenceHold;

fn facts<'a>(conditions: &'a [Condition], asked: &'a Asked) -> Facts<'a> {
    Facts {
        name: "node-1",
        now: Timestamp::UNIX_EPOCH,
        health: Some(HealthState::Failed),
        heartbeat_fresh: false,
        conditions,
        asked,
    }
}

fn under_way() -> FencingStatus {
    FencingStatus { started: Some(Time(Timestamp::UNIX_EPOCH)), ..Default::default() }
}

fn reason(out: &FenceOutcome) -> Option<&str> {
    out.condition.as_ref().map(|c| c.reason.as_str())
}

#[test]
fn a_new_fencing_is_recorded_before_any_step_with_what_was_asked_so_far() {
    let asked = Asked {
        retry: Some("r1".into()),
        clear: Some("c1".into()),
        retire: Some("t1".into()),
        machine_gone: Some("t1".into()),
        ..Asked::default()
    };
    let f = facts(&[], &asked);
    let take = Decision::Take(FenceStep::NovaForcedDown);
    let out = record(None, &take, Some(Taken::Claimed), &f);
    let r = out.record.clone().expect("recorded");
    assert_eq!(r.started, Some(Time(Timestamp::UNIX_EPOCH)));
    assert!(r.confirmed.is_empty(), "no step yet");
    // What was asked before the fencing started is not asked of it.
    assert_eq!((r.handled_retry.as_deref(), r.handled_clear.as_deref()), (Some("r1"), Some("c1")));
    assert_eq!(r.handled_retire.as_deref(), Some("t1"));
    let mut fenced = r.clone();
    fenced.fenced = Some(Time(Timestamp::UNIX_EPOCH));
    assert!(!asked.retires(&fenced) && !asked.machine_gone(&fenced), "a retirement asked before counts not");
    assert_eq!(reason(&out), Some("InProgress"));
    assert_eq!(out.event.as_ref().map(|e| e.0.as_str()), Some("FencingStarted"));
}

#[test]
fn a_step_confirmed_is_recorded_and_a_failed_one_counted_to_the_sres_turn() {
    let asked = Asked::default();
    let f = facts(&[], &asked);
    let take = Decision::Take(FenceStep::PoweredOff);
    let mut r = under_way();
    r.confirmed.push(FenceStep::NovaForcedDown);
    let mut before = Some(r);
    for attempt in 1..=ATTEMPTS {
        let out = record(before.as_ref(), &take, Some(Taken::Step(Err("BMC timed out".into()))), &f);
        let failed = out.record.as_ref().and_then(|r| r.failed.clone()).expect("recorded failed");
        assert_eq!((failed.step, failed.attempts), (FenceStep::PoweredOff, attempt));
        let want = if attempt < ATTEMPTS { "StepRetrying" } else { "StepNotConfirmed" };
        assert_eq!(reason(&out), Some(want), "try {attempt}");
        before = out.record;
    }
    // A failure of another step counts from one again.
    let other = Decision::Take(FenceStep::CephBlocklisted);
    let out = record(before.as_ref(), &other, Some(Taken::Step(Err("no monitor".into()))), &f);
    assert_eq!(out.record.and_then(|r| r.failed).map(|f| f.attempts), Some(1));
    // Confirmed: the failure goes, the step is recorded.
    let out = record(before.as_ref(), &take, Some(Taken::Step(Ok("read Off".into()))), &f);
    let r = out.record.expect("kept");
    assert_eq!(r.failed, None);
    assert_eq!(r.confirmed, [FenceStep::NovaForcedDown, FenceStep::PoweredOff]);
    assert_eq!(out.event.map(|e| e.0), Some("PoweredOffConfirmed".to_string()));
}

#[test]
fn the_storage_steps_addresses_are_recorded_before_they_are_blocklisted() {
    let asked = Asked::default();
    let f = facts(&[], &asked);
    let take = Decision::Take(FenceStep::CephBlocklisted);
    let mut r = under_way();
    r.ceph_addresses.push("10.0.0.1".into());
    let taken = Taken::AddressesFirst {
        addresses: vec!["10.0.0.1".into(), "10.0.0.2".into()],
        new: vec!["10.0.0.2".into()],
    };
    let out = record(Some(&r), &take, Some(taken), &f);
    assert_eq!(reason(&out), Some("InProgress"));
    let written = out.record.expect("kept");
    assert_eq!(written.ceph_addresses, ["10.0.0.1", "10.0.0.2"]);
    assert!(written.confirmed.is_empty(), "recorded, not yet taken");
}

#[test]
fn fenced_is_dated_and_told_once_and_says_when_the_agent_talks_again() {
    let asked = Asked::default();
    let f = facts(&[], &asked);
    let mut r = under_way();
    r.confirmed.push(FenceStep::NovaForcedDown);
    let out = record(Some(&r), &Decision::Fenced { by_hand: false }, None, &f);
    let fenced = out.record.clone().expect("kept");
    assert_eq!(fenced.fenced, Some(Time(Timestamp::UNIX_EPOCH)));
    assert_eq!(out.event.as_ref().map(|e| e.0.as_str()), Some("Fenced"));
    assert_eq!(reason(&out), Some("Fenced"));
    let talking = Facts { heartbeat_fresh: true, ..facts(&[], &asked) };
    let again = record(Some(&fenced), &Decision::Fenced { by_hand: false }, None, &talking);
    assert_eq!(again.event, None, "told once");
    assert_eq!(again.record, Some(fenced), "dated once");
    assert_eq!(reason(&again), Some("FencedAgentTalking"));
}

#[test]
fn a_hold_is_told_once_and_a_deposed_leader_takes_no_step() {
    let asked = Asked::default();
    let held =
        Decision::HeldBack { gate: FenceHold::NoAgentQuorum, message: "half the agents are gone".into() };
    let out = record(None, &held, None, &facts(&[], &asked));
    assert_eq!(reason(&out), Some("NoAgentQuorum"));
    assert!(out.event.is_some(), "news");
    let shown = [Condition {
        type_: "Fenced".into(),
        status: "False".into(),
        reason: "NoAgentQuorum".into(),
        message: String::new(),
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }];
    assert_eq!(record(None, &held, None, &facts(&shown, &asked)).event, None, "already shown");
    let r = under_way();
    let out = record(
        Some(&r),
        &Decision::Take(FenceStep::NovaForcedDown),
        Some(Taken::NotLeader),
        &facts(&[], &asked),
    );
    assert_eq!((out.record, out.condition, out.again), (Some(r), None, Some(Duration::from_millis(500))));
}

#[test]
fn a_retry_clears_a_failed_step_once_and_only_for_a_fencing_under_way() {
    let mut r = under_way();
    r.failed = Some(FailedFenceStep { step: FenceStep::PoweredOff, message: "x".into(), attempts: 3 });
    let asked = Asked { retry: Some("1".into()), ..Asked::default() };
    let cleared = retried(Some(r.clone()), &asked).expect("kept");
    assert_eq!((cleared.failed.clone(), cleared.handled_retry.as_deref()), (None, Some("1")));
    // The same retry again, on a step that failed since: not a new ask.
    let mut failed_again = cleared.clone();
    failed_again.failed = r.failed.clone();
    assert_eq!(retried(Some(failed_again.clone()), &asked), Some(failed_again));
    assert_eq!(retried(None, &asked), None, "nothing under way");
    assert_eq!(retried(Some(r.clone()), &Asked::default()), Some(r), "no retry asked");
}

#[test]
fn a_fencing_that_starts_or_only_waits_for_the_heartbeat_goes_first() {
    let starts = FenceOutcome { record: Some(under_way()), ..Default::default() };
    assert_eq!(goes_first(None, Some(HealthState::Failed), &starts), Some(Duration::from_millis(100)));
    assert_eq!(goes_first(Some(&under_way()), Some(HealthState::Failed), &starts), None, "already recorded");
    let ripens = FenceOutcome {
        condition: Some(cond(ConditionStatus::False, FenceHold::FreshHeartbeat.reason(), "")),
        again: Some(Duration::from_secs(3)),
        ..Default::default()
    };
    assert_eq!(goes_first(None, Some(HealthState::Failed), &ripens), Some(Duration::from_secs(3)));
    assert_eq!(goes_first(None, Some(HealthState::Unreachable), &ripens), None, "not Failed");
    let held = FenceOutcome {
        condition: Some(cond(ConditionStatus::False, FenceHold::NoAgentQuorum.reason(), "")),
        ..Default::default()
    };
    assert_eq!(goes_first(None, Some(HealthState::Failed), &held), None, "held for longer");
}

#[test]
fn a_clearing_lifts_in_steps_and_drops_the_record_at_the_end() {
    let mut r = under_way();
    r.fenced = Some(Time(Timestamp::UNIX_EPOCH));
    let out = cleared(&r, "node-1", Cleared::Waiting("Nova refused".into()), &[]);
    assert_eq!((reason(&out), out.record.as_ref()), (Some("ClearWaiting"), Some(&r)));
    assert_eq!(out.event.map(|e| e.0), Some("FencingClearWaiting".to_string()));
    let out = cleared(&r, "node-1", Cleared::BlocklistLifted { addresses: vec!["10.0.0.1".into()] }, &[]);
    assert!(out.record.is_some_and(|r| r.blocklist_lifted));
    let out = cleared(&r, "node-1", Cleared::ForcedDownLifted { host: "node-1".into() }, &[]);
    assert_eq!(reason(&out), Some("Clearing"));
    let out = cleared(&r, "node-1", Cleared::Done, &[]);
    assert_eq!((out.record, out.condition), (None, None));
    let mut status = HypervisorStatus::default();
    status.conditions.push(Condition {
        type_: "Fenced".into(),
        status: "True".into(),
        reason: "Fenced".into(),
        message: String::new(),
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
        observed_generation: None,
    });
    status.fencing = Some(r);
    apply(&mut status, &FenceOutcome::default(), Timestamp::UNIX_EPOCH, None);
    assert_eq!((status.fencing, status.conditions.len()), (None, 0), "the record and its condition go");
}

#[test]
fn a_fenced_host_showing_life_is_recorded_first_and_fenced_again_by_power_or_by_hand() {
    let asked = Asked { confirm: Some("c1".into()), ..Asked::default() };
    let f = facts(&[], &asked);
    let mut fenced = under_way();
    fenced.confirmed = vec![FenceStep::NovaForcedDown, FenceStep::PoweredOff];
    fenced.fenced = Some(Time(Timestamp::UNIX_EPOCH));
    fenced.failed = Some(FailedFenceStep { step: FenceStep::PoweredOff, message: "old".into(), attempts: 1 });
    let lives = Decision::ShowsLife { sign: "its BMC reads power on".into() };
    let out = record(Some(&fenced), &lives, None, &f);
    let revived = out.record.clone().expect("kept");
    let revival = revived.revival.clone().expect("recorded");
    assert_eq!(
        (revival.sign.as_str(), revival.handled_confirm.as_deref()),
        ("its BMC reads power on", Some("c1"))
    );
    assert_eq!(revived.failed, None, "the first fencing's failure is not this one's");
    assert_eq!(reason(&out), Some(SHOWS_LIFE));
    assert_eq!(out.event.as_ref().map(|e| e.0.as_str()), Some(SHOWS_LIFE));
    assert_eq!(goes_first(Some(&fenced), None, &out), Some(Duration::from_millis(100)), "written first");
    assert_eq!(goes_first(Some(&revived), None, &out), None, "once");

    // Its power off again: not confirmed, tried as any step; confirmed, the
    // revival ends and the time is kept, the steps as they were.
    let take = Decision::Take(FenceStep::PoweredOff);
    let out = record(Some(&revived), &take, Some(Taken::Step(Err("BMC timed out".into()))), &f);
    assert_eq!(reason(&out), Some("StepRetrying"));
    assert!(out.record.as_ref().is_some_and(|r| r.revival.is_some()), "still revived");
    let now = Timestamp::from_second(60).expect("a time");
    let later = Facts { now, ..facts(&[], &asked) };
    let out = record(Some(&revived), &take, Some(Taken::Step(Ok("read Off twice".into()))), &later);
    let again = out.record.clone().expect("kept");
    assert_eq!((again.revival.clone(), again.refenced.clone()), (None, Some(Time(now))));
    assert_eq!(again.confirmed, fenced.confirmed, "no step added");
    assert_eq!(again.fenced, fenced.fenced, "fenced since the first time");
    assert_eq!(reason(&out), Some("Fenced"));
    assert_eq!(out.event.as_ref().map(|e| e.0.as_str()), Some("FencedAgain"));

    // By an SRE's word.
    let out = record(Some(&revived), &Decision::FencedAgain, None, &later);
    assert_eq!(out.record.and_then(|r| r.refenced), Some(Time(now)));
    assert!(out.event.is_some_and(|e| e.1.contains("an SRE confirmed it off")));
}

#[test]
fn a_retirement_counts_only_for_a_fenced_host_and_keeps_the_record() {
    let mut r = under_way();
    r.handled_retire = Some("old".into());
    r.ceph_addresses = vec!["10.0.0.1".into()];
    let asked = Asked { retire: Some("t1".into()), clear: Some("c1".into()), ..Asked::default() };
    assert!(!asked.retires(&r), "not fenced yet");
    r.fenced = Some(Time(Timestamp::UNIX_EPOCH));
    assert!(asked.retires(&r));
    assert!(asked.clears(&r), "a clearing is asked too: the shell takes the retirement first");
    assert!(!asked.machine_gone(&r), "no word on the machine");
    let gone = Asked { machine_gone: Some("t1".into()), ..asked.clone() };
    assert!(gone.machine_gone(&r));
    let stale = Asked { machine_gone: Some("t0".into()), ..asked.clone() };
    assert!(!stale.machine_gone(&r), "a word given with another retirement");
    assert!(!Asked::default().retires(&r), "nothing asked");
    // The Node's deletion asks it too, whenever it began (the annotation
    // seen at the fencing's start is the only one handled), unless a
    // clearing waits.
    let by_node = Asked { node_deleted: Some("its Node deleted at t".into()), ..Asked::default() };
    assert!(by_node.retires(&r));
    assert!(!by_node.retires(&under_way()), "not fenced yet");
    let clearing = Asked { clear: Some("c9".into()), ..by_node.clone() };
    assert!(!clearing.retires(&r), "a clearing waits: the SRE says it is not gone");

    // Waiting for the machine: recorded, said once, the blocklist kept.
    let now = Timestamp::from_second(60).expect("a time");
    let out = retired(&r, "node-1", now, &asked, Retired::Waiting("its BMC reads power on".into()), &[]);
    let waiting = out.record.clone().expect("kept");
    let retirement = waiting.retirement.clone().expect("recorded");
    assert_eq!((retirement.asked, retirement.handled.as_str()), (Some(Time(now)), "t1"));
    assert!(!waiting.blocklist_lifted && retirement.machine.is_none() && retirement.retired.is_none());
    assert_eq!(reason(&out), Some(RETIRE_WAITING));
    assert!(out.event.is_some_and(|e| e.1.contains("power on")));
    let stored = [Condition {
        type_: "Fenced".into(),
        status: "True".into(),
        reason: RETIRE_WAITING.into(),
        message: String::new(),
        last_transition_time: Time(now),
        observed_generation: None,
    }];
    let out = retired(&waiting, "node-1", now, &asked, Retired::Waiting("still on".into()), &stored);
    assert_eq!(out.event, None, "said once");
    assert!(Asked::default().retires(&waiting), "under way whatever the annotation says now");
    assert_eq!(waiting.retirement.as_ref().and_then(|x| x.handled_clear.as_deref()), Some("c1"));
    assert!(asked.retires(&waiting), "the clearing asked before it does not cancel it");
    let cancel = Asked { clear: Some("c2".into()), ..asked.clone() };
    assert!(!cancel.retires(&waiting) && cancel.clears(&waiting), "a clearing asked since cancels it");

    // Lifted, then retired: dated once, the record kept.
    let lifted = Retired::BlocklistLifted { addresses: vec!["10.0.0.1".into()], machine: "read off".into() };
    let later = Timestamp::from_second(90).expect("a time");
    let out = retired(&waiting, "node-1", later, &asked, lifted, &stored);
    let r = out.record.clone().expect("kept");
    assert!(r.blocklist_lifted);
    let retirement = r.retirement.clone().expect("kept");
    assert_eq!((retirement.asked, retirement.machine.as_deref()), (Some(Time(now)), Some("read off")));
    let out = retired(&r, "node-1", later, &asked, Retired::Done, &stored);
    let done = out.record.clone().expect("the record is kept");
    assert_eq!(done.retirement.as_ref().and_then(|x| x.retired.clone()), Some(Time(later)));
    assert_eq!(done.fenced, r.fenced);
    assert_eq!((reason(&out), out.event.as_ref().map(|e| e.0.as_str())), (Some(RETIRED), Some(RETIRED)));
    let out = retired(
        &done,
        "node-1",
        Timestamp::from_second(200).expect("a time"),
        &Asked::default(),
        Retired::Done,
        &[],
    );
    assert_eq!(out.event, None, "retired once");
    assert_eq!(out.record.and_then(|r| r.retirement).and_then(|x| x.retired), Some(Time(later)));
}
