use std::collections::{BTreeMap, BTreeSet};

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;

use super::*;

const GIB: u64 = 1 << 30;

fn t(secs: i64) -> Timestamp {
    Timestamp::UNIX_EPOCH + SignedDuration::from_secs(1_800_000_000 + secs)
}

fn srv(id: &str, gib: u64) -> Server {
    Server {
        id: id.into(),
        name: format!("vm-{id}"),
        host: Some("src".into()),
        status: "ACTIVE".into(),
        memory_bytes: gib * GIB,
        policy: None,
        locked: false,
        pci_passthrough: false,
        local_disk: false,
        host_disks: false,
        evacuate: None,
        evict_mark: None,
        needs: Default::default(),
    }
}

fn input<'a>(
    o: &'a EvictionOptions,
    vms: &'a [VmStatus],
    servers: &'a [Server],
    attempts: &'a [AttemptObs],
    now: Timestamp,
) -> Input<'a> {
    Input {
        source: "src",
        options: o,
        vms,
        servers,
        attempts,
        slots: 5,
        cancelled: false,
        evacuation: None,
        now,
    }
}

fn running(id: &str, attempt: u32, started: i64, progress: i64) -> AttemptObs {
    AttemptObs {
        server_id: id.into(),
        attempt,
        nova_migration_id: Some(i64::from(attempt) * 100),
        nova_status: Some("running".into()),
        started_at: t(started),
        last_progress_at: t(progress),
        progress_reported: true,
        abort_requested: false,
        forced_at: None,
        not_sent: false,
    }
}

fn migrated_ids(actions: &[Action]) -> Vec<&str> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Migrate { server_id, .. } => Some(server_id.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn the_largest_vms_go_first_within_the_per_host_limit_and_skip_is_respected() {
    let o = EvictionOptions::default();
    let mut skip = srv("d", 64);
    skip.policy = Some(MigrationPolicy::Skip);
    let servers = vec![srv("a", 2), srv("b", 16), srv("c", 8), skip, srv("e", 1)];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    assert_eq!(s.vms.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(), ["d", "b", "c", "a", "e"]);
    assert_eq!(s.vms[0].state, VmState::Skipped);
    assert_eq!(migrated_ids(&s.actions), ["b", "c"], "two at once, largest first");
    assert!(s.vms.iter().filter(|v| v.state == VmState::Migrating).all(|v| v.attempts == 1));
    assert_eq!(s.phase, EvictionPhase::Migrating);

    let mut tight = input(&o, &[], &servers, &[], t(0));
    tight.slots = 1;
    assert_eq!(migrated_ids(&step(&tight).actions), ["b"], "the cluster-wide limit binds too");
}

#[test]
fn a_completed_migration_frees_its_slot_for_the_next_vm() {
    let o = EvictionOptions::default();
    let mut servers = vec![srv("a", 4), srv("b", 2), srv("c", 1)];
    let first = step(&input(&o, &[], &servers, &[], t(0)));
    servers[0].host = Some("dst-1".into());
    let mut done = running("a", 1, 0, 5);
    done.nova_status = Some("completed".into());
    let attempts = vec![done, running("b", 1, 0, 5)];
    let s = step(&input(&o, &first.vms, &servers, &attempts, t(6)));
    assert_eq!((s.vms[0].state, s.vms[0].target_host.as_deref()), (VmState::Migrated, Some("dst-1")));
    assert_eq!(migrated_ids(&s.actions), ["c"]);
}

#[test]
fn a_failed_attempt_backs_off_and_retries_until_the_attempts_run_out() {
    let o = EvictionOptions { max_attempts: 2, ..EvictionOptions::default() };
    let servers = vec![srv("a", 1)];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    let mut failed = running("a", 1, 0, 0);
    failed.nova_status = Some("error".into());
    let s = step(&input(&o, &s.vms, &servers, std::slice::from_ref(&failed), t(3)));
    assert_eq!(s.vms[0].state, VmState::Backoff);
    assert!(s.actions.is_empty(), "no retry before the backoff");
    assert_eq!(s.vms[0].retry_at.as_ref().map(|r| r.0), Some(t(13)));
    let s2 = step(&input(&o, &s.vms, &servers, std::slice::from_ref(&failed), t(12)));
    assert!(s2.actions.is_empty());
    let s3 = step(&input(&o, &s.vms, &servers, std::slice::from_ref(&failed), t(13)));
    assert_eq!(
        s3.actions,
        vec![Action::Migrate { server_id: "a".into(), attempt: 2, live: true, block_migration: false }]
    );
    let mut failed2 = running("a", 2, 13, 13);
    failed2.nova_status = Some("failed".into());
    let s4 = step(&input(&o, &s3.vms, &servers, &[failed, failed2], t(20)));
    assert_eq!(s4.vms[0].state, VmState::NonMigratable);
    assert!(s4.vms[0].reason.contains("2 attempts failed"), "{}", s4.vms[0].reason);
    assert_eq!(s4.phase, EvictionPhase::Succeeded, "every VM is in a final state");
}

#[test]
fn a_stuck_migration_is_aborted_once_and_retried_after_nova_confirms() {
    let o = EvictionOptions {
        progress_timeout_seconds: 150,
        force_complete: false,
        ..EvictionOptions::default()
    };
    // 4 GiB: 600 s to complete, so only the progress clock can fire here.
    let servers = vec![srv("a", 4)];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    // Progress stopped at t=10: fine at t=160, stuck at t=161.
    let s1 = step(&input(&o, &s.vms, &servers, &[running("a", 1, 0, 10)], t(160)));
    assert!(s1.actions.is_empty());
    let s2 = step(&input(&o, &s.vms, &servers, &[running("a", 1, 0, 10)], t(161)));
    assert!(
        matches!(&s2.actions[..], [Action::Abort { attempt: 1, nova_migration_id: Some(100), why, .. }] if why.contains("no progress"))
    );
    let mut aborting = running("a", 1, 0, 10);
    aborting.abort_requested = true;
    let s3 = step(&input(&o, &s2.vms, &servers, std::slice::from_ref(&aborting), t(170)));
    assert!(s3.actions.is_empty(), "no second abort while Nova works on the first");
    assert_eq!(s3.vms[0].state, VmState::Migrating);
    aborting.nova_status = Some("cancelled".into());
    let s4 = step(&input(&o, &s3.vms, &servers, &[aborting], t(175)));
    assert_eq!(s4.vms[0].state, VmState::Backoff);
    assert!(s4.vms[0].reason.contains("no progress"), "the stuck reason is kept: {}", s4.vms[0].reason);
}

#[test]
fn an_attempt_nova_never_shows_fails_after_a_progress_timeout() {
    let o = EvictionOptions { progress_timeout_seconds: 30, ..EvictionOptions::default() };
    let servers = vec![srv("a", 1)];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    let wait = step(&input(&o, &s.vms, &servers, &[], t(30)));
    assert_eq!(wait.vms[0].state, VmState::Migrating);
    assert!(wait.actions.is_empty(), "no second request while the first may still show up");
    let failed = step(&input(&o, &s.vms, &servers, &[], t(31)));
    assert_eq!(failed.vms[0].state, VmState::Backoff);
    assert!(failed.vms[0].reason.contains("never showed"));
}

#[test]
fn without_progress_counters_only_the_completion_clock_runs() {
    let o = EvictionOptions { progress_timeout_seconds: 10, ..EvictionOptions::default() };
    let servers = vec![srv("a", 1)];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    let silent = AttemptObs { progress_reported: false, ..running("a", 1, 0, 0) };
    let quiet = step(&input(&o, &s.vms, &servers, std::slice::from_ref(&silent), t(100)));
    assert!(quiet.actions.is_empty(), "no counters is not the same as no progress");
    let late = step(&input(&o, &s.vms, &servers, std::slice::from_ref(&silent), t(151)));
    assert!(
        matches!(&late.actions[..], [Action::ForceComplete { why, .. }] if why.contains("over the 150s"))
    );
}

#[test]
fn the_completion_limit_scales_with_memory() {
    let o = EvictionOptions::default();
    assert_eq!(completion_limit(&o, 4 * GIB), SignedDuration::from_secs(600));
    assert_eq!(completion_limit(&o, GIB / 2), SignedDuration::from_secs(150));
    assert_eq!(completion_limit(&o, GIB + 1), SignedDuration::from_secs(300), "rounded up to whole GiB");
    let servers = vec![srv("a", 4)];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    // Always progressing, but running 601 s on 4 GiB (limit 600 s).
    let ok = step(&input(&o, &s.vms, &servers, &[running("a", 1, 0, 599)], t(600)));
    assert!(ok.actions.is_empty());
    let stuck = step(&input(&o, &s.vms, &servers, &[running("a", 1, 0, 600)], t(601)));
    assert!(
        matches!(&stuck.actions[..], [Action::ForceComplete { why, .. }] if why.contains("over the 600s"))
    );
}

#[test]
fn deleted_and_moved_servers_end_gone_and_migrated() {
    let o = EvictionOptions { max_parallel: 1, ..EvictionOptions::default() };
    let servers = vec![srv("a", 4), srv("b", 2), srv("c", 1)];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    let mut moved = srv("b", 2);
    moved.host = Some("elsewhere".into());
    let now = vec![moved]; // a deleted while migrating, c deleted while pending
    let s = step(&input(&o, &s.vms, &now, &[], t(1)));
    let states: Vec<VmState> = s.vms.iter().map(|v| v.state).collect();
    assert_eq!(states, [VmState::Gone, VmState::Migrated, VmState::Gone]);
    assert_eq!(s.phase, EvictionPhase::Succeeded);
}

#[test]
fn locked_and_pci_servers_are_non_migratable_unless_forced_or_cold() {
    let o = EvictionOptions { max_parallel: 5, ..EvictionOptions::default() };
    let mut locked = srv("a", 1);
    locked.locked = true;
    let mut pci = srv("b", 1);
    pci.pci_passthrough = true;
    let mut cold_pci = srv("c", 1);
    cold_pci.pci_passthrough = true;
    cold_pci.policy = Some(MigrationPolicy::ColdMigrate);
    let mut local = srv("d", 1);
    local.local_disk = true;
    let servers = vec![locked, pci, cold_pci, local];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    let by_id: BTreeMap<&str, &VmStatus> = s.vms.iter().map(|v| (v.id.as_str(), v)).collect();
    assert_eq!(by_id["a"].state, VmState::NonMigratable);
    assert!(by_id["a"].reason.contains("locked"));
    assert_eq!(by_id["b"].state, VmState::NonMigratable);
    assert!(s.actions.contains(&Action::Migrate {
        server_id: "c".into(),
        attempt: 1,
        live: false,
        block_migration: false
    }));
    assert!(s.actions.contains(&Action::Migrate {
        server_id: "d".into(),
        attempt: 1,
        live: true,
        block_migration: true
    }));
    let forced = EvictionOptions { force: vec!["compatibility".into()], ..o };
    assert_eq!(step(&input(&forced, &[], &servers, &[], t(0))).actions.len(), 4);
}

#[test]
fn a_cancelled_eviction_aborts_in_flight_starts_nothing_and_ends_cancelled() {
    let o = EvictionOptions::default();
    let servers = vec![srv("a", 4), srv("b", 2), srv("c", 1)];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    let in_flight = [running("a", 1, 0, 1), running("b", 1, 0, 1)];
    let mut i = input(&o, &s.vms, &servers, &in_flight, t(2));
    i.cancelled = true;
    let c = step(&i);
    assert!(migrated_ids(&c.actions).is_empty(), "nothing new starts");
    let aborted: Vec<&str> = c
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Abort { server_id, why, .. } if why.contains("cancelled") => Some(server_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(aborted, ["a", "b"], "what is in flight is aborted");
    assert_eq!(c.phase, EvictionPhase::Migrating, "still moving: not Cancelled yet");
    let mut done_a = running("a", 1, 0, 1);
    done_a.nova_status = Some("cancelled".into());
    let mut done_b = running("b", 1, 0, 1);
    done_b.nova_status = Some("cancelled".into());
    let attempts = [done_a, done_b];
    let mut i = input(&o, &c.vms, &servers, &attempts, t(3));
    i.cancelled = true;
    assert_eq!(step(&i).phase, EvictionPhase::Cancelled);
}

#[test]
fn a_cold_migration_is_confirmed_and_migrated_only_once_confirmed_and_never_aborted() {
    let o = EvictionOptions { completion_timeout_per_gib_seconds: 10, ..EvictionOptions::default() };
    let mut cold = srv("a", 1);
    cold.policy = Some(MigrationPolicy::ColdMigrate);
    let first = step(&input(&o, &[], std::slice::from_ref(&cold), &[], t(0)));
    assert!(matches!(first.actions[..], [Action::Migrate { live: false, .. }]));

    // Running past its clock: reported, not aborted (Nova cannot abort a cold migration).
    let att = |status: &str| AttemptObs { nova_status: Some(status.into()), ..running("a", 1, 0, 0) };
    let late = step(&input(&o, &first.vms, std::slice::from_ref(&cold), &[att("migrating")], t(60)));
    assert!(late.actions.is_empty(), "{:?}", late.actions);
    assert!(late.vms[0].reason.contains("over the 10s"), "{}", late.vms[0].reason);
    assert_eq!(late.vms[0].state, VmState::Migrating);

    // Finished: the server waits in VERIFY_RESIZE on the target; confirm it.
    let mut moved = cold.clone();
    moved.host = Some("dst".into());
    moved.status = "VERIFY_RESIZE".into();
    let fin = step(&input(&o, &first.vms, std::slice::from_ref(&moved), &[att("finished")], t(5)));
    assert_eq!(fin.actions, [Action::ConfirmResize { server_id: "a".into(), attempt: 1 }]);
    assert_eq!(fin.vms[0].state, VmState::Migrating, "not migrated before the confirmation");

    // Confirming: nothing more to ask; confirmed: migrated.
    moved.status = "ACTIVE".into();
    let confirming = step(&input(&o, &fin.vms, std::slice::from_ref(&moved), &[att("finished")], t(6)));
    assert!(confirming.actions.is_empty());
    let done = step(&input(&o, &fin.vms, std::slice::from_ref(&moved), &[att("confirmed")], t(7)));
    assert_eq!(done.vms[0].state, VmState::Migrated);
    assert_eq!(done.vms[0].target_host.as_deref(), Some("dst"));
    assert_eq!(done.phase, EvictionPhase::Succeeded);

    // A reverted one is a failed attempt.
    let reverted = step(&input(&o, &first.vms, std::slice::from_ref(&cold), &[att("reverted")], t(7)));
    assert_eq!(reverted.vms[0].state, VmState::Backoff);
}

#[test]
fn the_default_policy_applies_to_vms_without_their_own() {
    let o =
        EvictionOptions { default_policy: Some(MigrationPolicy::ColdMigrate), ..EvictionOptions::default() };
    let mut own = srv("a", 2);
    own.policy = Some(MigrationPolicy::LiveMigrate);
    let s = step(&input(&o, &[], &[own, srv("b", 1)], &[], t(0)));
    let live: Vec<bool> = s
        .actions
        .iter()
        .filter_map(|a| if let Action::Migrate { live, .. } = a { Some(*live) } else { None })
        .collect();
    assert_eq!(live, [true, false], "a keeps its own policy; b takes the default");
    let skip = EvictionOptions { default_policy: Some(MigrationPolicy::Skip), ..EvictionOptions::default() };
    let s = step(&input(&skip, &[], &[srv("b", 1)], &[], t(0)));
    assert_eq!((s.vms[0].state, s.phase), (VmState::Skipped, EvictionPhase::Succeeded));
}

#[test]
fn backoff_doubles_and_is_capped() {
    let b: Vec<i64> = (1..=8).map(|a| backoff(a).as_secs()).collect();
    assert_eq!(b, [10, 20, 40, 80, 160, 300, 300, 300]);
    assert_eq!(backoff(u32::MAX).as_secs(), 300);
}

/// What a fake Nova does with each attempt, drawn at random.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fate {
    Completes,
    Fails,
    Hangs,
    Deleted,
    /// The request never reached Nova.
    NotSent,
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![
        4 => Just(Fate::Completes),
        2 => Just(Fate::Fails),
        1 => Just(Fate::Hangs),
        1 => Just(Fate::Deleted),
        1 => Just(Fate::NotSent),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Against a Nova whose every attempt completes, fails, hangs or loses
    /// its server at random: the host limit holds, no attempt is asked for
    /// twice, every VM ends final, and the eviction finishes.
    #[test]
    fn every_vm_ends_final_and_no_attempt_starts_twice(
        sizes in prop::collection::vec(1u64..32, 1..12),
        fates in prop::collection::vec(fate(), 64),
        parallel in 1u32..4,
        evacuating in any::<bool>(),
    ) {
        let o = EvictionOptions { max_parallel: parallel, max_attempts: 3, ..EvictionOptions::default() };
        // Every third server cold-migrates (finished, then confirmed); of
        // the others, some go live if they can, and some are moved by
        // their owner once marked.
        let mut servers: Vec<Server> = sizes.iter().enumerate().map(|(i, g)| {
            let mut s = srv(&format!("s{i:02}"), *g);
            s.policy = match i % 6 {
                2 | 5 => Some(MigrationPolicy::ColdMigrate),
                1 => Some(MigrationPolicy::LiveMigrateIfPossible),
                3 if i % 4 == 3 => Some(MigrationPolicy::External),
                _ => None,
            };
            s
        }).collect();
        let mut cold_attempts: BTreeSet<(String, u32)> = BTreeSet::new();
        let mut went_cold: BTreeSet<String> = BTreeSet::new();
        let mut attempts: Vec<AttemptObs> = Vec::new();
        let mut vms: Vec<VmStatus> = Vec::new();
        let mut asked: BTreeSet<(String, u32)> = BTreeSet::new();
        let mut fates = fates.into_iter().cycle();
        let mut now = 0i64;
        let mut finished = false;
        let evacuation = evacuating.then_some(Evacuation { by_default: true, rebuild_from_image: false, instance_disks_on_rbd: true, powered_off: true });
        for _ in 0..2000 {
            let s = step(&Input { evacuation, ..input(&o, &vms, &servers, &attempts, t(now)) });
            let in_flight = s.vms.iter().filter(|v| v.state == VmState::Migrating).count();
            prop_assert!(in_flight <= parallel as usize, "{in_flight} in flight");
            for a in &s.actions {
                match a {
                    Action::Evacuate { server_id, attempt } => {
                        prop_assert!(evacuating, "an evacuation of a host not fenced");
                        prop_assert!(asked.insert((server_id.clone(), *attempt)), "{server_id} attempt {attempt} asked twice");
                        let here = servers.iter().find(|x| &x.id == server_id);
                        prop_assert!(here.is_none_or(|x| x.host.as_deref() == Some("src")), "{server_id} evacuated twice");
                        let obs = running(server_id, *attempt, now, now);
                        match fates.next().unwrap_or(Fate::Completes) {
                            // Nova cannot abort an evacuation; a hanging one would never end.
                            Fate::Completes | Fate::Hangs => {
                                if let Some(sv) = servers.iter_mut().find(|x| &x.id == server_id) {
                                    sv.host = Some("dst".into());
                                    sv.status = "SHUTOFF".into();
                                }
                                attempts.push(AttemptObs { nova_status: Some("done".into()), ..obs });
                            }
                            Fate::Fails => {
                                if let Some(sv) = servers.iter_mut().find(|x| &x.id == server_id) { sv.status = "ERROR".into(); }
                                attempts.push(AttemptObs { nova_status: Some("error".into()), ..obs });
                            }
                            Fate::Deleted => servers.retain(|x| &x.id != server_id),
                            Fate::NotSent => attempts.push(AttemptObs { nova_migration_id: None, nova_status: None, not_sent: true, ..obs }),
                        }
                    }
                    Action::Start { server_id } => {
                        let sv = servers.iter_mut().find(|x| &x.id == server_id);
                        prop_assert!(sv.as_ref().is_some_and(|x| x.host.as_deref() == Some("dst") && x.status == "SHUTOFF"), "start of a server not rebuilt");
                        if let Some(x) = sv { x.status = "ACTIVE".into(); }
                    }
                    Action::Migrate { server_id, attempt, live, .. } => {
                        prop_assert!(!evacuating, "a migration off a fenced host");
                        prop_assert!(asked.insert((server_id.clone(), *attempt)), "{server_id} attempt {attempt} asked twice");
                        let policy = servers.iter().find(|x| &x.id == server_id).and_then(|x| x.policy);
                        prop_assert!(policy != Some(MigrationPolicy::External), "{server_id} is its owner's to move");
                        match policy {
                            Some(MigrationPolicy::ColdMigrate) => prop_assert!(!live, "{server_id} cold by policy"),
                            Some(MigrationPolicy::LiveMigrateIfPossible) => prop_assert!(!(*live && went_cold.contains(server_id)), "{server_id} live again after it went cold"),
                            _ => prop_assert!(live, "{server_id} live by policy"),
                        }
                        if !live { went_cold.insert(server_id.clone()); }
                        let obs = running(server_id, *attempt, now, now);
                        let cold = !live;
                        if cold { cold_attempts.insert((server_id.clone(), *attempt)); }
                        match fates.next().unwrap_or(Fate::Completes) {
                            // Nova cannot abort a cold migration; a hanging one would never end.
                            Fate::Completes | Fate::Hangs if cold => {
                                if let Some(sv) = servers.iter_mut().find(|x| &x.id == server_id) {
                                    sv.host = Some("dst".into());
                                    sv.status = "VERIFY_RESIZE".into();
                                }
                                attempts.push(AttemptObs { nova_status: Some("finished".into()), ..obs });
                            }
                            Fate::Completes => {
                                if let Some(sv) = servers.iter_mut().find(|x| &x.id == server_id) { sv.host = Some("dst".into()); }
                                attempts.push(AttemptObs { nova_status: Some("completed".into()), ..obs });
                            }
                            Fate::Fails => attempts.push(AttemptObs { nova_status: Some("error".into()), ..obs }),
                            Fate::Hangs => attempts.push(obs),
                            Fate::Deleted => servers.retain(|x| &x.id != server_id),
                            Fate::NotSent => attempts.push(AttemptObs { nova_migration_id: None, nova_status: None, not_sent: true, ..obs }),
                        }
                    }
                    Action::ConfirmResize { server_id, attempt } => {
                        let att = attempts.iter_mut().find(|x| &x.server_id == server_id && x.attempt == *attempt);
                        prop_assert!(att.as_ref().is_some_and(|x| x.nova_status == Some(NovaState::Finished)), "confirm of an unfinished migration");
                        if let Some(x) = att { x.nova_status = Some("confirmed".into()); }
                        if let Some(sv) = servers.iter_mut().find(|x| &x.id == server_id) { sv.status = "ACTIVE".into(); }
                    }
                    Action::ForceComplete { server_id, attempt, .. } => {
                        prop_assert!(!cold_attempts.contains(&(server_id.clone(), *attempt)), "a cold migration forced");
                        let att = attempts.iter_mut().find(|x| &x.server_id == server_id && x.attempt == *attempt);
                        prop_assert!(att.as_ref().is_some_and(|x| x.forced_at.is_none() && x.nova_status == Some(NovaState::Running { live_running: true })), "forced twice, or not running");
                        if let Some(x) = att {
                            x.forced_at = Some(t(now));
                            // Forcing sometimes ends it; else it hangs on.
                            if fates.next() == Some(Fate::Completes) {
                                x.nova_status = Some("completed".into());
                                if let Some(sv) = servers.iter_mut().find(|x| &x.id == server_id) { sv.host = Some("dst".into()); }
                            }
                        }
                    }
                    Action::Mark { server_id, host } => {
                        let sv = servers.iter_mut().find(|x| &x.id == server_id);
                        prop_assert!(sv.as_ref().is_some_and(|x| x.policy == Some(MigrationPolicy::External) && x.host.as_deref() == Some("src")), "{server_id} marked");
                        prop_assert_eq!(host.as_str(), "src");
                        // Its owner sees the mark and moves it.
                        if let Some(x) = sv { x.evict_mark = Some("src".into()); x.host = Some("dst".into()); }
                    }
                    Action::Unmark { server_id } => {
                        let sv = servers.iter_mut().find(|x| &x.id == server_id);
                        prop_assert!(sv.as_ref().is_some_and(|x| x.evict_mark.is_some()), "{server_id} unmarked, never marked");
                        if let Some(x) = sv { x.evict_mark = None; }
                    }
                    Action::Abort { server_id, attempt, .. } => {
                        prop_assert!(!cold_attempts.contains(&(server_id.clone(), *attempt)), "a cold migration aborted");
                        let att = attempts.iter_mut().find(|x| &x.server_id == server_id && x.attempt == *attempt);
                        prop_assert!(att.is_some(), "abort of an attempt Nova does not know");
                        if let Some(x) = att {
                            x.abort_requested = true;
                            x.nova_status = Some("cancelled".into());
                        }
                    }
                }
            }
            vms = s.vms;
            if s.phase == EvictionPhase::Succeeded {
                finished = true;
                break;
            }
            now += 7;
        }
        prop_assert!(finished, "the eviction did not finish: {vms:?}");
        prop_assert_eq!(vms.len(), sizes.len());
        prop_assert!(vms.iter().all(|v| is_final(v.state)));
        prop_assert!(vms.iter().all(|v| v.attempts - v.not_sent <= 3 + v.cold_after_failures.unwrap_or(0)), "attempts Nova never got do not count");
        prop_assert!(servers.iter().all(|x| x.evict_mark.is_none()), "a mark of ours left behind");
        for v in &vms {
            if v.state == VmState::Migrated {
                prop_assert_eq!(v.target_host.as_deref(), Some("dst"));
                // Every server ran before: an evacuated one runs again.
                let status = servers.iter().find(|x| x.id == v.id).map(|x| x.status.as_str());
                prop_assert_eq!(status, Some("ACTIVE"), "{} not restored", v.id);
            }
        }
    }
}

#[test]
fn a_server_that_lands_on_the_host_after_the_start_is_moved_too() {
    let o = EvictionOptions::default();
    let first = step(&input(&o, &[], &[srv("a", 4)], &[], t(0)));
    assert_eq!(first.vms.len(), 1);
    // "a" is moved; meanwhile "late" was scheduled onto the host before
    // Nova saw it disabled.
    let mut a = srv("a", 4);
    a.host = Some("dst".into());
    let done = AttemptObs { nova_status: Some(NovaState::Completed), ..running("a", 1, 0, 0) };
    let servers = vec![a, srv("late", 2)];
    let s = step(&input(&o, &first.vms, &servers, &[done], t(10)));
    assert_eq!(
        s.vms.iter().map(|v| (v.id.as_str(), v.state)).collect::<Vec<_>>(),
        [("a", VmState::Migrated), ("late", VmState::Migrating)]
    );
    assert_eq!(migrated_ids(&s.actions), ["late"]);
    assert_eq!(s.phase, EvictionPhase::Migrating, "not Succeeded while a server remains on the host");
}

#[test]
fn a_server_whose_host_nova_does_not_say_is_not_counted_migrated() {
    let o = EvictionOptions::default();
    let first = step(&input(&o, &[], &[srv("a", 4)], &[], t(0)));
    let mut a = srv("a", 4);
    a.host = None;
    let done = AttemptObs { nova_status: Some(NovaState::Completed), ..running("a", 1, 0, 0) };
    let s = step(&input(&o, &first.vms, std::slice::from_ref(&a), std::slice::from_ref(&done), t(10)));
    assert_eq!(s.vms[0].state, VmState::Migrating, "unknown is not elsewhere");
    assert_eq!(s.phase, EvictionPhase::Migrating);
    // Nor is a pending one with no host.
    let pending = step(&input(&o, &[], &[srv("b", 1)], &[], t(0)));
    let mut vms = pending.vms.clone();
    vms[0].state = VmState::Pending;
    let mut b = srv("b", 1);
    b.host = None;
    let mut i = input(&o, &vms, std::slice::from_ref(&b), &[], t(1));
    i.slots = 0;
    assert_eq!(step(&i).vms[0].state, VmState::Pending);
}

#[test]
fn a_migrated_server_that_comes_back_is_moved_again() {
    let o = EvictionOptions::default();
    let vm = VmStatus {
        id: "a".into(),
        state: VmState::Migrated,
        attempts: 1,
        target_host: Some("dst".into()),
        ..Default::default()
    };
    let s = step(&input(&o, &[vm], &[srv("a", 4)], &[], t(100)));
    assert_eq!(s.vms[0].state, VmState::Migrating, "{:?}", s.vms[0]);
    assert_eq!(s.vms[0].attempts, 2);
    assert_eq!(migrated_ids(&s.actions), ["a"]);
}

#[test]
fn a_request_that_never_reached_nova_is_asked_again_and_does_not_count() {
    let o = EvictionOptions { max_attempts: 1, ..EvictionOptions::default() };
    let servers = vec![srv("a", 1)];
    let s = step(&input(&o, &[], &servers, &[], t(0)));
    let unsent =
        AttemptObs { nova_migration_id: None, nova_status: None, not_sent: true, ..running("a", 1, 0, 0) };
    let s = step(&input(&o, &s.vms, &servers, std::slice::from_ref(&unsent), t(1)));
    assert_eq!((s.vms[0].state, s.vms[0].not_sent), (VmState::Backoff, 1), "{:?}", s.vms[0]);
    assert!(s.vms[0].reason.contains("could not be reached"), "{}", s.vms[0].reason);
    let s = step(&input(&o, &s.vms, &servers, std::slice::from_ref(&unsent), t(11)));
    assert_eq!(
        s.actions,
        vec![Action::Migrate { server_id: "a".into(), attempt: 2, live: true, block_migration: false }],
        "a new attempt, though maxAttempts is 1"
    );
    // Attempt 2 reaches Nova and fails: that is the one attempt allowed.
    let mut failed = running("a", 2, 11, 11);
    failed.nova_status = Some("error".into());
    let s = step(&input(&o, &s.vms, &servers, &[unsent, failed], t(12)));
    assert_eq!(s.vms[0].state, VmState::NonMigratable);
    assert!(s.vms[0].reason.starts_with("1 attempts failed"), "{}", s.vms[0].reason);
}

fn fenced(by_default: bool, rebuild_from_image: bool, rbd: bool) -> Evacuation {
    Evacuation { by_default, rebuild_from_image, instance_disks_on_rbd: rbd, powered_off: true }
}

fn evacuated_ids(actions: &[Action]) -> Vec<&str> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Evacuate { server_id, .. } => Some(server_id.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_fenced_hosts_servers_are_evacuated_by_their_opt_in_and_their_disks() {
    let o = EvictionOptions { max_parallel: 8, ..EvictionOptions::default() };
    let with = |id: &str, evacuate: Option<OptIn>, host_disks: bool, status: &str| {
        let mut s = srv(id, 1);
        s.evacuate = evacuate;
        s.host_disks = host_disks;
        s.status = status.into();
        s
    };
    let servers = [
        with("in", Some(OptIn::Yes), false, "ACTIVE"),
        with("out", Some(OptIn::No), false, "ACTIVE"),
        with("typo", Some(OptIn::Unreadable("flase".into())), false, "ACTIVE"),
        with("plain", None, false, "SHUTOFF"),
        with("local", None, true, "ACTIVE"),
        with("paused", None, false, "PAUSED"),
    ];
    let judged = |e: Evacuation| {
        let s = step(&Input { evacuation: Some(e), ..input(&o, &[], &servers, &[], t(0)) });
        let states: Vec<(String, VmState)> = s.vms.iter().map(|v| (v.id.clone(), v.state)).collect();
        (states, evacuated_ids(&s.actions).into_iter().map(String::from).collect::<Vec<_>>(), s)
    };
    let (_, evacuated, s) = judged(fenced(true, false, false));
    assert_eq!(evacuated, ["in", "plain"], "opted out, local disks and PAUSED are not evacuated");
    let reason = |s: &Step, id: &str| s.vms.iter().find(|v| v.id == id).map(|v| (v.state, v.reason.clone()));
    assert!(matches!(reason(&s, "out"), Some((VmState::Skipped, r)) if r.contains("opted out")));
    assert!(matches!(reason(&s, "typo"), Some((VmState::Skipped, r)) if r.contains("\"flase\"")));
    assert!(matches!(reason(&s, "local"), Some((VmState::NonMigratable, r)) if r.contains("would lose")));
    assert!(matches!(reason(&s, "paused"), Some((VmState::NonMigratable, r)) if r.contains("PAUSED")));
    assert!(s.actions.iter().all(|a| matches!(a, Action::Evacuate { attempt: 1, .. })), "no migration");
    let former: Vec<Option<&str>> = s.vms.iter().map(|v| v.former_status.as_deref()).collect();
    assert!(
        former.contains(&Some("SHUTOFF")) && former.contains(&Some("ACTIVE")),
        "the status before is kept"
    );
    // Disks in Ceph, or a site that accepts a rebuild from the image: local too.
    assert_eq!(judged(fenced(true, false, true)).1, ["in", "local", "plain"]);
    assert_eq!(judged(fenced(true, true, false)).1, ["in", "local", "plain"]);
    // A rebuild from the image only once the host is surely off: no copy beside it.
    let not_off = Evacuation { powered_off: false, ..fenced(true, true, false) };
    let (_, evacuated, s) = judged(not_off);
    assert_eq!(evacuated, ["in", "plain"]);
    assert!(
        matches!(reason(&s, "local"), Some((VmState::NonMigratable, r)) if r.contains("power off is not confirmed"))
    );
    assert_eq!(
        judged(Evacuation { powered_off: false, ..fenced(true, false, true) }).1,
        ["in", "local", "plain"]
    );
    // Opt-in only: the server without the key is left, and named.
    let (states, evacuated, _) = judged(fenced(false, false, false));
    assert_eq!(evacuated, ["in"]);
    assert!(states.contains(&("plain".to_string(), VmState::Skipped)));
}

#[test]
fn an_evacuated_server_that_ran_is_started_and_counts_once_it_runs() {
    let o = EvictionOptions::default();
    let e = Some(fenced(true, false, true));
    let mut servers = vec![srv("a", 1)];
    let first = step(&Input { evacuation: e, ..input(&o, &[], &servers, &[], t(0)) });
    assert_eq!(evacuated_ids(&first.actions), ["a"]);
    // Rebuilt elsewhere, stopped, as Nova 2.95+ leaves it.
    servers[0].host = Some("dst".into());
    servers[0].status = "SHUTOFF".into();
    let done =
        [AttemptObs { nova_status: Some("done".into()), progress_reported: false, ..running("a", 1, 0, 0) }];
    let s = step(&Input { evacuation: e, ..input(&o, &first.vms, &servers, &done, t(5)) });
    assert_eq!(s.actions, [Action::Start { server_id: "a".into() }]);
    assert_eq!(s.vms[0].state, VmState::Migrating, "not moved until it runs");
    assert_eq!(s.phase, EvictionPhase::Migrating);
    // Still rebuilding: waited for, nothing asked.
    servers[0].status = "REBUILD".into();
    let s = step(&Input { evacuation: e, ..input(&o, &first.vms, &servers, &done, t(6)) });
    assert!(s.actions.is_empty() && s.vms[0].state == VmState::Migrating);
    servers[0].status = "ACTIVE".into();
    let s = step(&Input { evacuation: e, ..input(&o, &first.vms, &servers, &done, t(9)) });
    assert_eq!((s.vms[0].state, s.vms[0].target_host.as_deref()), (VmState::Migrated, Some("dst")));
    assert!(s.actions.is_empty());
    assert_eq!(s.phase, EvictionPhase::Succeeded);
    // One that never starts counts as moved after its completion clock, said: never evacuated twice.
    servers[0].status = "SHUTOFF".into();
    let late = step(&Input { evacuation: e, ..input(&o, &first.vms, &servers, &done, t(151)) });
    assert_eq!(late.vms[0].state, VmState::Migrated);
    assert!(late.vms[0].reason.contains("start it by hand"), "{}", late.vms[0].reason);
    assert!(late.actions.is_empty());
    // One that was SHUTOFF before stays so.
    let mut off = vec![srv("b", 1)];
    off[0].status = "SHUTOFF".into();
    let first = step(&Input { evacuation: e, ..input(&o, &[], &off, &[], t(0)) });
    off[0].host = Some("dst".into());
    let done = [AttemptObs { nova_status: Some("done".into()), ..running("b", 1, 0, 0) }];
    let s = step(&Input { evacuation: e, ..input(&o, &first.vms, &off, &done, t(5)) });
    assert_eq!(s.vms[0].state, VmState::Migrated);
    assert!(s.actions.is_empty(), "not started");
}

#[test]
fn a_failed_evacuation_is_retried_and_a_stuck_one_waited_for_never_aborted() {
    let o = EvictionOptions { max_attempts: 2, ..EvictionOptions::default() };
    let e = Some(fenced(true, false, true));
    let servers = vec![srv("a", 1)];
    let first = step(&Input { evacuation: e, ..input(&o, &[], &servers, &[], t(0)) });
    // Stuck past the completion clock: reported, not aborted, not retried.
    let hung = [AttemptObs {
        nova_status: Some("pre-migrating".into()),
        progress_reported: false,
        ..running("a", 1, 0, 0)
    }];
    let s = step(&Input { evacuation: e, ..input(&o, &first.vms, &servers, &hung, t(200)) });
    assert!(s.actions.is_empty(), "{:?}", s.actions);
    assert_eq!(s.vms[0].state, VmState::Migrating);
    assert!(s.vms[0].reason.contains("running"), "{}", s.vms[0].reason);
    // Failed: a new attempt after the backoff, then recorded.
    let mut err = servers.clone();
    err[0].status = "ERROR".into();
    let failed = [AttemptObs { nova_status: Some("error".into()), ..running("a", 1, 0, 0) }];
    let s = step(&Input { evacuation: e, ..input(&o, &first.vms, &err, &failed, t(5)) });
    assert_eq!(s.vms[0].state, VmState::Backoff);
    let again = step(&Input { evacuation: e, ..input(&o, &s.vms, &err, &[], t(20)) });
    assert_eq!(again.actions, [Action::Evacuate { server_id: "a".into(), attempt: 2 }]);
    assert_eq!(again.vms[0].former_status.as_deref(), Some("ACTIVE"), "the status before the first attempt");
    let failed2 = [AttemptObs { nova_status: Some("error".into()), ..running("a", 2, 20, 20) }];
    let end = step(&Input { evacuation: e, ..input(&o, &again.vms, &err, &failed2, t(25)) });
    assert_eq!(end.vms[0].state, VmState::NonMigratable);
    assert_eq!(end.phase, EvictionPhase::Succeeded);
}

#[test]
fn a_migration_in_flight_when_its_host_is_fenced_is_never_aborted_retried_or_evacuated() {
    let o = EvictionOptions::default();
    let servers = vec![srv("a", 1), srv("b", 1)];
    // Two live migrations in flight, then the host is fenced.
    let first = step(&input(&o, &[], &servers, &[], t(0)));
    assert_eq!(migrated_ids(&first.actions), ["a", "b"]);
    let e = Some(fenced(true, false, true));
    let failed = AttemptObs { nova_status: Some("error".into()), ..running("b", 1, 0, 0) };
    let s = step(&Input {
        evacuation: e,
        ..input(&o, &first.vms, &servers, &[running("a", 1, 0, 0), failed], t(600))
    });
    let a = &s.vms[0];
    assert_eq!(a.state, VmState::NonMigratable, "{a:?}");
    assert!(a.reason.contains("in flight when the host was fenced"), "{}", a.reason);
    assert!(
        !s.actions.iter().any(|x| matches!(x, Action::Abort { .. })),
        "the dead host is not asked: {:?}",
        s.actions
    );
    // One that failed before did not move: it is evacuated, after its backoff.
    assert_eq!(s.vms[1].state, VmState::Backoff);
    let later = step(&Input { evacuation: e, ..input(&o, &s.vms, &servers, &[], t(700)) });
    assert_eq!(later.actions, [Action::Evacuate { server_id: "b".into(), attempt: 2 }]);
}

#[test]
fn an_evacuation_given_up_on_that_lands_after_all_counts_moved_and_is_started_never_evacuated_again() {
    let o = EvictionOptions { max_attempts: 1, ..EvictionOptions::default() };
    let e = Some(fenced(true, false, true));
    let mut servers = vec![srv("a", 1)];
    let first = step(&Input { evacuation: e, ..input(&o, &[], &servers, &[], t(0)) });
    // Hung past twice its clock (150 s per GiB): recorded, nothing asked.
    let hung = [AttemptObs {
        nova_status: Some("pre-migrating".into()),
        progress_reported: false,
        ..running("a", 1, 0, 0)
    }];
    let s = step(&Input { evacuation: e, ..input(&o, &first.vms, &servers, &hung, t(301)) });
    assert_eq!(s.vms[0].state, VmState::NonMigratable);
    assert!(s.vms[0].reason.contains("cannot abort"), "{}", s.vms[0].reason);
    assert!(s.actions.is_empty());
    // Nova finishes it after all: moved, started once as it ran before.
    servers[0].host = Some("dst".into());
    servers[0].status = "SHUTOFF".into();
    let late = step(&Input { evacuation: e, ..input(&o, &s.vms, &servers, &[], t(400)) });
    assert_eq!((late.vms[0].state, late.vms[0].target_host.as_deref()), (VmState::Migrated, Some("dst")));
    assert_eq!(late.actions, [Action::Start { server_id: "a".into() }]);
    // A VM waiting out its backoff that turns up elsewhere is not evacuated again either.
    let o = EvictionOptions::default();
    let mut servers = vec![srv("b", 1)];
    let first = step(&Input { evacuation: e, ..input(&o, &[], &servers, &[], t(0)) });
    let failed = [AttemptObs { nova_status: Some("error".into()), ..running("b", 1, 0, 0) }];
    let backoff = step(&Input { evacuation: e, ..input(&o, &first.vms, &servers, &failed, t(5)) });
    assert_eq!(backoff.vms[0].state, VmState::Backoff);
    servers[0].host = Some("dst".into());
    servers[0].status = "SHUTOFF".into();
    let s = step(&Input { evacuation: e, ..input(&o, &backoff.vms, &servers, &failed, t(60)) });
    assert_eq!(s.vms[0].state, VmState::Migrated);
    assert_eq!(s.actions, [Action::Start { server_id: "b".into() }]);
}

mod finishing;
