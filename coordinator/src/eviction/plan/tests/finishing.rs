//! Evictions that finish: stuck live migrations forced to complete before
//! they are aborted, `liveMigrateIfPossible` going cold, and `external`
//! servers marked, waited for and unmarked.

use super::*;

fn stuck_at(id: &str, attempt: u32) -> AttemptObs {
    // Progress stopped at t=0; the progress timeout below is 30 s.
    running(id, attempt, 0, 0)
}

fn opts() -> EvictionOptions {
    EvictionOptions { progress_timeout_seconds: 30, ..EvictionOptions::default() }
}

#[test]
fn a_stuck_live_migration_is_forced_to_complete_once_and_lands() {
    let o = opts();
    let servers = vec![srv("a", 4)];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    let f = step(&input(&o, &s.vms, &servers, &[stuck_at("a", 1)], t(31)));
    assert!(
        matches!(&f.actions[..], [Action::ForceComplete { attempt: 1, nova_migration_id: 100, why, .. }] if why.contains("no progress")),
        "{:?}",
        f.actions
    );
    assert!(f.vms[0].reason.contains("forcing it to complete"), "{}", f.vms[0].reason);
    // Asked: waited for, never asked twice, never aborted within the grace.
    let forced = AttemptObs { forced_at: Some(t(31)), ..stuck_at("a", 1) };
    let w = step(&input(&o, &f.vms, &servers, std::slice::from_ref(&forced), t(61)));
    assert!(w.actions.is_empty(), "{:?}", w.actions);
    assert!(w.vms[0].reason.contains("forced to complete, waiting"), "{}", w.vms[0].reason);
    // Nova completes it: moved by its first attempt.
    let mut moved = servers.clone();
    moved[0].host = Some("dst".into());
    let done = AttemptObs { nova_status: Some("completed".into()), ..forced };
    let m = step(&input(&o, &w.vms, &moved, &[done], t(62)));
    assert_eq!(
        (m.vms[0].state, m.vms[0].attempts, m.phase),
        (VmState::Migrated, 1, EvictionPhase::Succeeded)
    );
}

#[test]
fn a_forced_migration_still_running_after_the_grace_is_aborted() {
    let o = opts();
    let servers = vec![srv("a", 4)];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    let forced = AttemptObs { forced_at: Some(t(31)), ..stuck_at("a", 1) };
    let on_the_edge = step(&input(&o, &s.vms, &servers, std::slice::from_ref(&forced), t(61)));
    assert!(on_the_edge.actions.is_empty());
    let a = step(&input(&o, &s.vms, &servers, std::slice::from_ref(&forced), t(62)));
    assert!(
        matches!(&a.actions[..], [Action::Abort { attempt: 1, why, .. }] if why.contains("31s after it was forced")),
        "{:?}",
        a.actions
    );
}

#[test]
fn without_force_complete_a_stuck_migration_is_aborted_at_once() {
    let o = EvictionOptions { force_complete: false, ..opts() };
    let servers = vec![srv("a", 4)];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    let a = step(&input(&o, &s.vms, &servers, &[stuck_at("a", 1)], t(31)));
    assert!(matches!(&a.actions[..], [Action::Abort { .. }]), "{:?}", a.actions);
}

#[test]
fn only_a_running_live_migration_is_forced_and_a_cancelled_eviction_aborts() {
    let o = opts();
    let servers = vec![srv("a", 1)];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    // Queued in Nova: not on its 150 s clock yet, but queued past three
    // times that (maxParallel 2, plus its own turn) it is aborted, as Nova
    // forces only `running`.
    let queued =
        AttemptObs { nova_status: Some("queued".into()), progress_reported: false, ..stuck_at("a", 1) };
    let waiting = step(&input(&o, &s.vms, &servers, std::slice::from_ref(&queued), t(450)));
    assert!(waiting.actions.is_empty(), "{:?}", waiting.actions);
    let q = step(&input(&o, &s.vms, &servers, &[queued], t(451)));
    assert!(
        matches!(&q.actions[..], [Action::Abort { why, .. }] if why.contains("queued in Nova for 451s")),
        "{:?}",
        q.actions
    );
    // No Nova id known: nothing to force.
    let unknown = AttemptObs { nova_migration_id: None, ..stuck_at("a", 1) };
    let u = step(&input(&o, &s.vms, &servers, &[unknown], t(31)));
    assert!(matches!(&u.actions[..], [Action::Abort { nova_migration_id: None, .. }]), "{:?}", u.actions);
    // Cancelled: aborted, even one forced already.
    let forced = AttemptObs { forced_at: Some(t(31)), ..stuck_at("a", 1) };
    let mut i = input(&o, &s.vms, &servers, std::slice::from_ref(&forced), t(32));
    i.cancelled = true;
    let c = step(&i);
    assert!(
        matches!(&c.actions[..], [Action::Abort { why, .. }] if why.contains("cancelled")),
        "{:?}",
        c.actions
    );
}

#[test]
fn live_if_possible_goes_cold_for_pci_and_a_stopped_server_and_a_refusal_is_a_failure() {
    let o = EvictionOptions {
        default_policy: Some(MigrationPolicy::LiveMigrateIfPossible),
        max_parallel: 3,
        ..opts()
    };
    let mut pci = srv("p", 2);
    pci.pci_passthrough = true;
    let mut stopped = srv("s", 2);
    stopped.status = "SHUTOFF".into();
    let plain = srv("q", 1);
    let servers = vec![pci, stopped, plain];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    let live_of = |a: &[Action], id: &str| {
        a.iter().find_map(|x| match x {
            Action::Migrate { server_id, live, .. } if server_id == id => Some(*live),
            _ => None,
        })
    };
    assert_eq!(live_of(&s.actions, "p"), Some(false), "PCI passthrough: cold, not non-migratable");
    assert_eq!(live_of(&s.actions, "s"), Some(false), "not running: Nova moves it only cold");
    let went_cold = s.vms.iter().find(|v| v.id == "s").and_then(|v| v.cold_after_failures);
    assert_eq!(went_cold, Some(0), "cold for good, before any failure");
    assert_eq!(live_of(&s.actions, "q"), Some(true));
    // Nova refuses q's live request (a 409 while a task runs): an ordinary
    // failure, retried live.
    let refused =
        AttemptObs { nova_migration_id: None, nova_status: Some("error".into()), ..running("q", 1, 0, 0) };
    let others = [running("p", 1, 0, 0), running("s", 1, 0, 0)];
    let mut seen = others.to_vec();
    seen.push(refused);
    let r = step(&input(&o, &s.vms, &servers, &seen, t(1)));
    let q = r.vms.iter().find(|v| v.id == "q").cloned().unwrap_or_default();
    assert_eq!((q.state, q.cold_after_failures), (VmState::Backoff, None));
    let again = step(&input(&o, &r.vms, &servers, &others, t(12)));
    assert_eq!(live_of(&again.actions, "q"), Some(true));
}

#[test]
fn live_if_possible_gets_max_attempts_cold_after_its_live_ones_fail() {
    let o = EvictionOptions {
        default_policy: Some(MigrationPolicy::LiveMigrateIfPossible),
        max_attempts: 2,
        ..opts()
    };
    let servers = vec![srv("a", 1)];
    let failed = |n: u32| AttemptObs { nova_status: Some("error".into()), ..running("a", n, 0, 0) };
    let mut vms = step(&input(&o, &[], &servers, &[], t(0))).vms;
    let mut lives = vec![];
    let mut now = 0;
    for n in 1..=4 {
        now += 1000;
        let s = step(&input(&o, &vms, &servers, &[failed(n)], t(now)));
        now += 1000;
        let next = step(&input(&o, &s.vms, &servers, &[], t(now)));
        lives.extend(next.actions.iter().filter_map(|a| match a {
            Action::Migrate { live, .. } => Some(*live),
            _ => None,
        }));
        vms = next.vms;
    }
    assert_eq!(lives, [true, false, false], "attempt 1 was live; 2 live, then 2 cold");
    assert_eq!(vms[0].state, VmState::NonMigratable);
    assert_eq!(vms[0].attempts, 4);
    assert!(vms[0].reason.starts_with("2 attempts failed"), "{}", vms[0].reason);
}

#[test]
fn an_external_server_is_marked_waited_for_and_unmarked_once_its_owner_moved_it() {
    let o = EvictionOptions::default();
    let mut ext = srv("e", 2);
    ext.policy = Some(MigrationPolicy::External);
    let servers = vec![ext.clone()];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    assert_eq!(s.vms[0].state, VmState::External);
    assert!(s.vms[0].reason.contains("hypervisor.cloud.sap:evict-from=src"), "{}", s.vms[0].reason);
    assert_eq!(
        s.actions,
        [Action::Mark { server_id: "e".into(), host: "src".into() }],
        "marked, not migrated"
    );
    assert_eq!(s.phase, EvictionPhase::Migrating);
    // Marked: waited for, nothing asked, for as long as it takes.
    let mut marked = ext.clone();
    marked.evict_mark = Some("src".into());
    let w = step(&input(&o, &s.vms, std::slice::from_ref(&marked), &[], t(86_400)));
    assert!(w.actions.is_empty(), "{:?}", w.actions);
    assert_eq!((w.vms[0].state, w.phase), (VmState::External, EvictionPhase::Migrating));
    // Its owner moved it: the mark is taken off, asked again at each step
    // until Nova shows it gone, and only then is it Migrated.
    marked.host = Some("dst".into());
    for at in [86_401, 86_402] {
        let m = step(&input(&o, &w.vms, std::slice::from_ref(&marked), &[], t(at)));
        assert_eq!((m.vms[0].state, m.phase), (VmState::External, EvictionPhase::Migrating));
        assert!(m.vms[0].reason.contains("taking our mark off"), "{}", m.vms[0].reason);
        assert_eq!(m.actions, [Action::Unmark { server_id: "e".into() }]);
    }
    marked.evict_mark = None;
    let done = step(&input(&o, &w.vms, std::slice::from_ref(&marked), &[], t(86_403)));
    assert_eq!((done.vms[0].state, done.phase), (VmState::Migrated, EvictionPhase::Succeeded));
    assert_eq!(done.vms[0].reason, "moved off by its owner");
    // Back on the host later: its owner's again, never moved by us.
    marked.host = Some("src".into());
    let back = step(&input(&o, &done.vms, std::slice::from_ref(&marked), &[], t(86_404)));
    assert_eq!(back.vms[0].state, VmState::External);
    assert_eq!(back.actions, [Action::Mark { server_id: "e".into(), host: "src".into() }]);
}

#[test]
fn a_cancelled_eviction_takes_its_marks_off_and_never_touches_others() {
    let o = EvictionOptions::default();
    let mut ext = srv("e", 2);
    ext.policy = Some(MigrationPolicy::External);
    ext.evict_mark = Some("src".into());
    // Marked for another host by somebody else: never overwritten nor taken off.
    let mut other = srv("o", 1);
    other.policy = Some(MigrationPolicy::External);
    other.evict_mark = Some("elsewhere".into());
    let servers = vec![ext.clone(), other];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    assert!(s.actions.is_empty(), "e is marked already, o by somebody else: {:?}", s.actions);
    let mut i = input(&o, &s.vms, &servers, &[], t(1));
    i.cancelled = true;
    let c = step(&i);
    assert_eq!(c.actions, [Action::Unmark { server_id: "e".into() }]);
    assert_eq!(c.phase, EvictionPhase::Migrating, "not over while our mark remains");
    ext.evict_mark = None;
    let servers = vec![ext, servers[1].clone()];
    let mut i = input(&o, &c.vms, &servers, &[], t(2));
    i.cancelled = true;
    let c2 = step(&i);
    assert!(c2.actions.is_empty(), "{:?}", c2.actions);
    assert_eq!(c2.phase, EvictionPhase::Cancelled);
}

#[test]
fn a_deleted_external_server_is_gone_and_a_fenced_hosts_is_evacuated() {
    let o = EvictionOptions::default();
    let mut ext = srv("e", 2);
    ext.policy = Some(MigrationPolicy::External);
    let s = step(&input(&o, &[], std::slice::from_ref(&ext), &[], t(0)));
    let g = step(&input(&o, &s.vms, &[], &[], t(5)));
    assert_eq!((g.vms[0].state, g.phase), (VmState::Gone, EvictionPhase::Succeeded));
    // A fenced host: nobody's tooling can move it off a dead host.
    let e = Evacuation {
        by_default: true,
        rebuild_from_image: false,
        instance_disks_on_rbd: true,
        powered_off: true,
    };
    let f = step(&Input { evacuation: Some(e), ..input(&o, &[], std::slice::from_ref(&ext), &[], t(0)) });
    assert!(matches!(&f.actions[..], [Action::Evacuate { .. }]), "{:?}", f.actions);
    // One waiting for its owner when the host is fenced: unmarked, evacuated.
    ext.evict_mark = Some("src".into());
    let later =
        step(&Input { evacuation: Some(e), ..input(&o, &s.vms, std::slice::from_ref(&ext), &[], t(9)) });
    assert!(later.actions.contains(&Action::Unmark { server_id: "e".into() }), "{:?}", later.actions);
    assert!(later.actions.iter().any(|a| matches!(a, Action::Evacuate { .. })), "{:?}", later.actions);
}

#[test]
fn a_migration_in_post_copy_is_never_aborted_nor_forced() {
    let o = opts();
    let servers = vec![srv("a", 1)];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    let post = AttemptObs {
        nova_status: Some("running (post-copy)".into()),
        progress_reported: false,
        forced_at: Some(t(10)),
        ..stuck_at("a", 1)
    };
    let w = step(&input(&o, &s.vms, &servers, &[post], t(10_000)));
    assert!(w.actions.is_empty(), "{:?}", w.actions);
    assert!(w.vms[0].reason.contains("post-copy"), "{}", w.vms[0].reason);
}

#[test]
fn a_forced_migration_still_copying_is_not_aborted() {
    // Stuck by its completion clock (40 s for 4 GiB), not by its progress.
    let o = EvictionOptions { completion_timeout_per_gib_seconds: 10, ..opts() };
    let servers = vec![srv("a", 4)];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    // Forced at 31 s; its counters still moved at 80 s: not aborted at 100 s.
    let copying = AttemptObs { forced_at: Some(t(31)), last_progress_at: t(80), ..stuck_at("a", 1) };
    let w = step(&input(&o, &s.vms, &servers, std::slice::from_ref(&copying), t(100)));
    assert!(w.actions.is_empty(), "{:?}", w.actions);
    let a = step(&input(&o, &s.vms, &servers, &[copying], t(111)));
    assert!(matches!(&a.actions[..], [Action::Abort { .. }]), "{:?}", a.actions);
}

#[test]
fn a_live_if_possible_attempt_running_is_forced_though_its_server_reads_migrating() {
    let o = EvictionOptions { default_policy: Some(MigrationPolicy::LiveMigrateIfPossible), ..opts() };
    let servers = vec![srv("a", 4)];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    assert!(matches!(&s.actions[..], [Action::Migrate { live: true, .. }]), "{:?}", s.actions);
    let mut moving = servers.clone();
    moving[0].status = "MIGRATING".into();
    let f = step(&input(&o, &s.vms, &moving, &[stuck_at("a", 1)], t(31)));
    assert!(matches!(&f.actions[..], [Action::ForceComplete { .. }]), "{:?}", f.actions);
    // Its live attempts ran out while it read MIGRATING: cold next, not given up.
    let o1 = EvictionOptions { max_attempts: 1, ..o };
    let failed = AttemptObs { nova_status: Some("error".into()), ..running("a", 1, 0, 0) };
    let g = step(&input(&o1, &s.vms, &moving, &[failed], t(32)));
    assert_eq!((g.vms[0].state, g.vms[0].cold_after_failures), (VmState::Backoff, Some(1)));
}
