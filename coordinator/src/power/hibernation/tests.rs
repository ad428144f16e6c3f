use super::*;
use proptest::prelude::*;

const DAY: Duration = Duration::from_secs(86_400);

fn room(vcpu: u64, ram_mb: u64) -> Room {
    Room { vcpu, ram_mb }
}

/// An awake host of 64 vCPU and 256 GiB, empty for a day, that the policy may power off.
fn idle(name: &str) -> Host {
    Host {
        name: name.into(),
        power: Power::Awake,
        takes_vms: true,
        may_hibernate: true,
        may_wake: false,
        servers: 0,
        domains: 0,
        empty_for: Some(DAY),
        capacity: room(64, 262_144),
        free: room(64, 262_144),
    }
}

fn busy(name: &str, free: Room) -> Host {
    Host { servers: 3, domains: 3, empty_for: None, free, ..idle(name) }
}

fn asleep(name: &str) -> Host {
    Host {
        power: Power::Hibernated,
        takes_vms: false,
        may_hibernate: false,
        may_wake: true,
        empty_for: None,
        ..idle(name)
    }
}

fn policy(headroom: Headroom) -> Policy {
    Policy { hibernate_after: Duration::from_secs(3600), headroom, keep_awake: 2 }
}

fn names(ds: &[Decision]) -> Vec<String> {
    ds.iter()
        .map(|d| match d {
            Decision::Hibernate { host, .. } => format!("hibernate {host}"),
            Decision::Wake { host, .. } => format!("wake {host}"),
        })
        .collect()
}

#[test]
fn the_headroom_in_hosts_is_the_largest_hosts_worth_and_in_percent_of_the_whole_group() {
    let hosts = [idle("a"), Host { capacity: room(128, 100), ..idle("b") }, asleep("c")];
    assert_eq!(required(&policy(Headroom::Hosts(2)), &hosts), room(256, 524_288));
    // 64 + 128 + 64 vCPU, 256 GiB * 2 + 100 MiB: a third, rounded up.
    assert_eq!(required(&policy(Headroom::Percent(33)), &hosts), room(85, 173_049));
    assert_eq!(required(&policy(Headroom::Percent(0)), &hosts), room(0, 0));
}

#[test]
fn the_host_empty_longest_hibernates_when_the_room_left_covers_the_headroom() {
    let mut older = idle("b");
    older.empty_for = Some(2 * DAY);
    let hosts = [busy("a", room(10, 10_000)), older, idle("c"), idle("d")];
    assert_eq!(names(&decide(&policy(Headroom::Hosts(1)), &hosts, &[])), ["hibernate b"]);
}

#[test]
fn what_is_not_idle_long_enough_or_not_ours_to_power_stays_on() {
    let p = policy(Headroom::Percent(0));
    let young = Host { empty_for: Some(Duration::from_secs(60)), ..idle("a") };
    let held = Host { may_hibernate: false, ..idle("b") };
    let running = Host { servers: 1, ..idle("c") };
    let domain_left = Host { domains: 1, ..idle("d") };
    let unknown = Host { empty_for: None, ..idle("e") };
    let hosts = [young, held, running, domain_left, unknown, busy("f", room(0, 0))];
    assert_eq!(decide(&p, &hosts, &[]), []);
}

#[test]
fn nothing_hibernates_that_would_leave_the_headroom_or_the_hosts_kept_awake_short() {
    // Two empty hosts, a headroom of two hosts' worth: neither may go.
    assert_eq!(decide(&policy(Headroom::Hosts(2)), &[idle("a"), idle("b"), busy("c", room(0, 0))], &[]), []);
    // Room enough, but the policy keeps two awake.
    let p = Policy { keep_awake: 2, ..policy(Headroom::Percent(0)) };
    assert_eq!(decide(&p, &[idle("a"), idle("b")], &[]), []);
    assert_eq!(names(&decide(&p, &[idle("a"), idle("b"), idle("c")], &[])), ["hibernate a"]);
}

#[test]
fn one_change_at_a_time_nothing_hibernates_while_a_host_wakes_or_powers_off() {
    let p = policy(Headroom::Percent(0));
    for power in [Power::Waking, Power::Hibernating] {
        let moving = Host { power, ..idle("z") };
        assert_eq!(decide(&p, &[idle("a"), idle("b"), idle("c"), moving], &[]), [], "{power:?}");
    }
}

#[test]
fn a_short_headroom_wakes_the_fewest_hosts_that_restore_it() {
    let small = Host { capacity: room(16, 65_536), free: room(16, 65_536), ..asleep("small") };
    let hosts = [busy("a", room(8, 8192)), busy("b", room(8, 8192)), small, asleep("big-1"), asleep("big-2")];
    // One host's worth (64 vCPU): one big host restores it; the small one would not.
    let ds = decide(&policy(Headroom::Hosts(1)), &hosts, &[]);
    assert_eq!(names(&ds), ["wake big-1"]);
    let Decision::Wake { reason, .. } = &ds[0] else { panic!() };
    assert!(
        reason.contains("(16 vCPU, 16384 MiB) is short of the headroom (64 vCPU, 262144 MiB)"),
        "{reason}"
    );
    // Two hosts' worth: both big ones, not the small one too.
    assert_eq!(names(&decide(&policy(Headroom::Hosts(2)), &hosts, &[])), ["wake big-1", "wake big-2"]);
}

#[test]
fn of_the_fewest_that_suffice_the_smallest_wakes() {
    let mid = Host { free: room(40, 100_000), ..asleep("mid") };
    let hosts = [busy("a", room(30, 200_000)), busy("b", room(0, 0)), asleep("big"), mid];
    let p = Policy { keep_awake: 3, ..policy(Headroom::Percent(0)) };
    assert_eq!(names(&decide(&p, &hosts, &[])), ["wake mid"]);
}

#[test]
fn the_hosts_a_preflight_needs_are_woken_and_nothing_hibernates_meanwhile() {
    let p = policy(Headroom::Percent(0));
    let hosts = [idle("a"), idle("b"), idle("e"), asleep("c"), asleep("d")];
    let want = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let ds = decide(&p, &hosts, &want(&["c", "d"]));
    assert_eq!(names(&ds), ["wake c", "wake d"]);
    let Decision::Wake { reason, .. } = &ds[0] else { panic!() };
    assert!(reason.starts_with("an eviction's preflight found no room"), "{reason}");
    // Asked for while waking, or not the policy's to wake: nothing more.
    let waking = Host { power: Power::Waking, ..asleep("c") };
    let theirs = Host { may_wake: false, ..asleep("d") };
    assert_eq!(decide(&p, &[idle("a"), idle("b"), idle("e"), waking, theirs], &want(&["c", "d"])), []);
    // A host not asked for stays off; while any is asked for, nothing hibernates.
    assert_eq!(decide(&p, &hosts, &want(&["x"])), []);
    assert_eq!(names(&decide(&p, &hosts, &[])), ["hibernate a"]);
}

#[test]
fn a_waking_hosts_room_counts_and_no_more_is_woken_for_it() {
    let waking = Host { power: Power::Waking, ..asleep("c") };
    let hosts = [busy("a", room(0, 0)), busy("b", room(0, 0)), waking, asleep("d")];
    assert_eq!(decide(&policy(Headroom::Hosts(1)), &hosts, &[]), []);
}

#[test]
fn too_few_awake_wakes_up_to_the_hosts_kept_awake() {
    let p = Policy { keep_awake: 3, ..policy(Headroom::Percent(0)) };
    let ds = decide(&p, &[busy("a", room(0, 0)), asleep("b"), asleep("c"), asleep("d")], &[]);
    assert_eq!(names(&ds), ["wake b", "wake c"]);
    let Decision::Wake { reason, .. } = &ds[0] else { panic!() };
    assert_eq!(reason, "1 hosts awake, the policy keeps 3");
}

#[test]
fn a_host_held_for_its_update_is_no_room() {
    let held = Host { takes_vms: false, may_hibernate: false, ..idle("b") };
    let ds = decide(&policy(Headroom::Hosts(1)), &[busy("a", room(0, 0)), held, asleep("c")], &[]);
    assert_eq!(names(&ds), ["wake c"]);
}

#[test]
fn a_host_the_headroom_wakes_is_not_woken_twice_for_a_preflight() {
    let ds = decide(&policy(Headroom::Hosts(1)), &[busy("a", room(0, 0)), asleep("c")], &["c".to_string()]);
    assert_eq!(names(&ds), ["wake c"]);
}

#[test]
fn beyond_sixteen_hosts_what_is_short_is_covered_first() {
    // RAM is short, vCPU is not: one RAM-rich host, not a dozen vCPU-rich ones.
    let awake = Host { capacity: room(1000, 262_144), free: room(1000, 0), ..busy("awake", room(0, 0)) };
    let mut hosts = vec![awake.clone(), Host { name: "awake-2".into(), ..awake }];
    for i in 0..10 {
        let cpu = Host { capacity: room(64, 1000), free: room(64, 1000), ..asleep(&format!("a{i:02}")) };
        let ram = Host { capacity: room(8, 300_000), free: room(8, 300_000), ..asleep(&format!("z{i:02}")) };
        hosts.extend([cpu, ram]);
    }
    assert_eq!(required(&policy(Headroom::Hosts(1)), &hosts), room(1000, 300_000));
    assert_eq!(names(&decide(&policy(Headroom::Hosts(1)), &hosts, &[])), ["wake z00"]);
}

#[test]
fn a_host_hibernated_by_someone_else_is_never_woken_by_the_policy() {
    let theirs = Host { may_wake: false, ..asleep("b") };
    assert_eq!(decide(&policy(Headroom::Hosts(1)), &[busy("a", room(0, 0)), theirs], &[]), []);
}

fn any_host() -> impl Strategy<Value = Host> {
    let power = prop_oneof![
        6 => Just(Power::Awake),
        4 => Just(Power::Hibernated),
        1 => Just(Power::Waking),
        1 => Just(Power::Hibernating),
    ];
    // Mostly empty, long idle hosts: the ones a decision is about.
    let count = || prop_oneof![3 => Just(0u32), 1 => 1u32..3];
    let idle_h = proptest::option::weighted(0.8, prop_oneof![3 => 24u64..200, 1 => 0u64..24]);
    let flags = (any::<bool>(), any::<bool>(), prop::bool::weighted(0.8));
    (power, flags, count(), count(), idle_h, 1u64..128, 1u64..512)
        .prop_flat_map(|(power, flags, servers, domains, empty_h, cpu, ram)| {
            (Just((power, flags, servers, domains, empty_h, cpu, ram)), 0..=cpu, 0..=ram)
        })
        .prop_map(
            |((power, (may_hibernate, may_wake, takes_vms), servers, domains, empty_h, cpu, ram), fc, fr)| {
                let (free_cpu, free_ram) = if power == Power::Awake { (fc, fr) } else { (cpu, ram) };
                Host {
                    name: String::new(),
                    power,
                    takes_vms,
                    may_hibernate,
                    may_wake,
                    servers,
                    domains,
                    empty_for: empty_h.map(|h| Duration::from_secs(h * 3600)),
                    capacity: room(cpu, ram),
                    free: room(free_cpu, free_ram),
                }
            },
        )
}

fn any_policy() -> impl Strategy<Value = Policy> {
    let headroom = prop_oneof![(0u32..4).prop_map(Headroom::Hosts), (0u8..=100).prop_map(Headroom::Percent)];
    (headroom, 0u32..4).prop_map(|(headroom, keep_awake)| Policy {
        hibernate_after: Duration::from_secs(24 * 3600),
        headroom,
        keep_awake,
    })
}

/// The hosts after the decisions are carried out.
fn after(hosts: &[Host], ds: &[Decision]) -> Vec<Host> {
    let mut out = hosts.to_vec();
    for d in ds {
        let (name, power) = match d {
            Decision::Hibernate { host, .. } => (host, Power::Hibernated),
            Decision::Wake { host, .. } => (host, Power::Waking),
        };
        if let Some(h) = out.iter_mut().find(|h| &h.name == name) {
            h.power = power;
        }
    }
    out
}

proptest! {
    #[test]
    fn the_awake_room_never_drops_under_the_headroom_while_hibernated_hosts_remain(
        mut hosts in proptest::collection::vec(any_host(), 0..9),
        p in any_policy(),
        short in any::<bool>(),
    ) {
        for (i, h) in hosts.iter_mut().enumerate() {
            h.name = format!("h{i}");
        }
        let wanted: Vec<String> = if short { hosts.iter().map(|h| h.name.clone()).collect() } else { vec![] };
        let ds = decide(&p, &hosts, &wanted);
        let then = after(&hosts, &ds);
        let need = required(&p, &hosts);
        let (room, awake) = awake_room(&then);
        let wakeable = then.iter().any(|h| h.power == Power::Hibernated && h.may_wake);
        prop_assert!(!wakeable || (room.covers(need) && awake >= p.keep_awake), "{ds:?}");
        let hibernating = ds.iter().any(|d| matches!(d, Decision::Hibernate { .. }));
        prop_assert!(!hibernating || (room.covers(need) && awake >= p.keep_awake), "{ds:?}");
        let waking = ds.iter().any(|d| matches!(d, Decision::Wake { .. }));
        prop_assert!(!(hibernating && waking), "{ds:?}");
        let hibernated = ds.iter().filter(|d| matches!(d, Decision::Hibernate { .. })).count();
        prop_assert!(hibernated <= 1, "{ds:?}");
    }

    #[test]
    fn no_host_with_servers_or_domains_is_ever_powered_off(
        mut hosts in proptest::collection::vec(any_host(), 0..9),
        p in any_policy(),
        short in any::<bool>(),
    ) {
        for (i, h) in hosts.iter_mut().enumerate() {
            h.name = format!("h{i}");
        }
        let wanted: Vec<String> = if short { hosts.iter().map(|h| h.name.clone()).collect() } else { vec![] };
        for d in decide(&p, &hosts, &wanted) {
            match d {
                Decision::Hibernate { host, .. } => {
                    let h = hosts.iter().find(|h| h.name == host).unwrap();
                    prop_assert!(h.empty() && h.may_hibernate && h.takes_vms && h.power == Power::Awake, "{h:?}");
                    prop_assert!(h.empty_for.is_some_and(|d| d >= p.hibernate_after));
                }
                Decision::Wake { host, .. } => {
                    let h = hosts.iter().find(|h| h.name == host).unwrap();
                    prop_assert!(h.may_wake && h.power == Power::Hibernated, "{h:?}");
                }
            }
        }
    }

    #[test]
    fn no_smaller_set_of_hibernated_hosts_would_have_restored_the_headroom(
        mut hosts in proptest::collection::vec(any_host(), 0..9),
        p in any_policy(),
    ) {
        for (i, h) in hosts.iter_mut().enumerate() {
            h.name = format!("h{i}");
        }
        let woken: Vec<String> = decide(&p, &hosts, &[])
            .into_iter()
            .filter_map(|d| match d { Decision::Wake { host, .. } => Some(host), _ => None })
            .collect();
        let need = required(&p, &hosts);
        let (room, awake) = awake_room(&hosts);
        let sleeping: Vec<&Host> = hosts.iter().filter(|h| h.power == Power::Hibernated && h.may_wake).collect();
        // Every smaller subset falls short.
        for mask in 0u32..(1 << sleeping.len()) {
            let set: Vec<&&Host> = sleeping.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, h)| h).collect();
            if set.len() >= woken.len() || woken.is_empty() {
                continue;
            }
            let r = set.iter().fold(room, |r, h| r.plus(h.free));
            prop_assert!(!(r.covers(need) && awake as usize + set.len() >= p.keep_awake as usize), "{woken:?} {set:?}");
        }
    }
}
