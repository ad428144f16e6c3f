use super::*;

fn parse(s: &str) -> Result<GroupPolicy, String> {
    s.parse()
}

#[test]
fn a_policy_names_its_group_and_takes_the_defaults_it_does_not_set() {
    let p = parse("zone=az-1").unwrap();
    assert_eq!(p.scope, Scope::Zone("az-1".into()));
    assert_eq!(
        p.policy,
        Policy {
            hibernate_after: Duration::from_secs(6 * 3600),
            headroom: Headroom::Hosts(1),
            keep_awake: 2
        }
    );
    let p = parse("aggregate=spares, hibernate-after=30m,headroom=20%,keep-awake=0").unwrap();
    assert_eq!(p.scope, Scope::Aggregate("spares".into()));
    assert_eq!(
        p.policy,
        Policy { hibernate_after: Duration::from_secs(1800), headroom: Headroom::Percent(20), keep_awake: 0 }
    );
    assert_eq!(parse("zone=a,headroom=3hosts").unwrap().policy.headroom, Headroom::Hosts(3));
    assert_eq!(parse("zone=a,headroom=1host").unwrap().policy.headroom, Headroom::Hosts(1));
}

#[test]
fn a_bad_policy_is_refused_saying_what_is_wrong() {
    for (bad, says) in [
        ("hibernate-after=1h", "names no aggregate= or zone="),
        ("zone=a,aggregate=b", "one aggregate or zone"),
        ("zone=", "the name is empty"),
        ("zone=a,headroom=101%", "headroom=\"101%\""),
        ("zone=a,headroom=2", "a count of hosts"),
        ("zone=a,hibernate-after=soon", "not a duration"),
        ("zone=a,keep-awake=-1", "not a count"),
        ("zone=a,wake-after=1h", "not a setting"),
        ("zone=a,keep-awake", "expected KEY=VALUE"),
    ] {
        let err = parse(bad).unwrap_err();
        assert!(err.contains(says), "{bad}: {err}");
    }
}

fn room(host: &str, zone: &str, aggregates: &[&str]) -> HostRoom {
    HostRoom {
        host: host.into(),
        zone: zone.into(),
        aggregates: aggregates.iter().map(|a| a.to_string()).collect(),
        in_service: true,
        capacity: Room { vcpu: 8, ram_mb: 16_384 },
        free: Room { vcpu: 6, ram_mb: 8_192 },
    }
}

fn ours(name: &str) -> OurHost {
    OurHost {
        name: name.into(),
        active: true,
        wish: DesiredPower::Running,
        power: Some(HostPower::Running),
        by_policy: false,
        bmc: true,
        paused: false,
        refused: false,
        servers: Some(0),
        domains: Some(0),
        empty_for: Some(Duration::from_secs(60)),
    }
}

#[test]
fn a_scope_holds_the_members_of_its_aggregate_or_its_zone() {
    let r = room("c1", "az-1", &["spares", "gpu"]);
    assert!(Scope::Aggregate("gpu".into()).holds(&r) && Scope::Zone("az-1".into()).holds(&r));
    assert!(!Scope::Aggregate("az-1".into()).holds(&r) && !Scope::Zone("spares".into()).holds(&r));
}

#[test]
fn a_wish_not_yet_carried_out_counts_as_under_way() {
    use HostPower as P;
    let with = |wish, power| OurHost { wish, power, ..ours("n") }.power();
    let (run, hib) = (DesiredPower::Running, DesiredPower::Hibernating);
    assert_eq!(with(run, None), Power::Awake);
    assert_eq!(with(hib, None), Power::Hibernating);
    assert_eq!(with(hib, Some(P::Running)), Power::Hibernating);
    assert_eq!(with(hib, Some(P::Hibernating)), Power::Hibernated);
    assert_eq!(with(run, Some(P::Hibernating)), Power::Waking);
    assert_eq!(with(run, Some(P::WaitingForChecks)), Power::Waking);
    assert_eq!(with(run, Some(P::FailedToStop)), Power::Awake);
    assert_eq!(with(hib, Some(P::FailedToStart)), Power::Hibernated);
    for p in HostPower::ALL {
        // Settled where the wish is: no change under way.
        let settled = if p.changing() { None } else { Some(with(run, Some(p))) };
        assert!(
            settled.is_none_or(|w| w != Power::Hibernating && w != Power::Waking) || p == P::Hibernating,
            "{p}"
        );
        // Changing: under way whatever the wish.
        if p.changing() {
            assert!(matches!(with(run, Some(p)), Power::Hibernating | Power::Waking), "{p}");
            assert!(matches!(with(hib, Some(p)), Power::Hibernating | Power::Waking), "{p}");
        }
    }
}

#[test]
fn only_our_empty_active_hosts_with_a_bmc_may_be_hibernated_and_only_the_policys_woken() {
    let rooms =
        [room("c1", "az", &[]), room("c2", "az", &[]), room("c3", "az", &[]), room("x", "other", &[])];
    let mut mine = BTreeMap::new();
    mine.insert("c1".to_string(), ours("n1"));
    mine.insert("c2".to_string(), OurHost { bmc: false, ..ours("n2") });
    let hosts = group_hosts(&Scope::Zone("az".into()), &rooms, &mine);
    let names: Vec<&str> = hosts.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["c1", "c2", "c3"]);
    assert!(hosts[0].may_hibernate && hosts[0].takes_vms && hosts[0].empty_for.is_some());
    assert!(!hosts[1].may_hibernate && hosts[1].takes_vms, "no BMC: never powered off");
    assert!(!hosts[2].may_hibernate && !hosts[2].may_wake && hosts[2].servers > 0, "not ours");

    // Unknown emptiness counts as not empty.
    let unknown = OurHost { domains: None, ..ours("n1") };
    let h = host(&rooms[0], Some(&unknown));
    assert!(h.domains > 0);

    let asleep = |by_policy, power| OurHost {
        wish: DesiredPower::Hibernating,
        power: Some(power),
        by_policy,
        ..ours("n1")
    };
    assert!(host(&rooms[0], Some(&asleep(true, HostPower::Hibernating))).may_wake);
    assert!(!host(&rooms[0], Some(&asleep(false, HostPower::Hibernating))).may_wake, "an SRE's");
    assert!(!host(&rooms[0], Some(&asleep(true, HostPower::FailedToStart))).may_wake);
    // Not Active (in maintenance, onboarding): takes no VMs, never hibernated.
    let h = host(&rooms[0], Some(&OurHost { active: false, ..ours("n1") }));
    assert!(!h.takes_vms && !h.may_hibernate);
    // Disabled or down in Nova: no room.
    let h = host(&HostRoom { in_service: false, ..rooms[0].clone() }, Some(&ours("n1")));
    assert!(!h.takes_vms && !h.may_hibernate);
}

#[test]
fn an_eviction_short_of_room_waits_only_for_hosts_the_policy_may_wake_in_its_own_groups() {
    let rooms = [
        room("src", "az", &["agg"]),
        room("c1", "az", &[]),
        room("c2", "other", &["agg"]),
        room("c3", "other", &[]),
    ];
    let asleep = OurHost {
        wish: DesiredPower::Hibernating,
        power: Some(HostPower::Hibernating),
        by_policy: true,
        ..ours("n")
    };
    let mut mine = BTreeMap::new();
    for h in ["c1", "c2", "c3"] {
        mine.insert(h.to_string(), OurHost { name: format!("n-{h}"), ..asleep.clone() });
    }
    let zone = GroupPolicy { scope: Scope::Zone("az".into()), policy: parse("zone=x").unwrap().policy };
    let agg = GroupPolicy { scope: Scope::Aggregate("agg".into()), ..zone.clone() };
    let other = GroupPolicy { scope: Scope::Zone("other".into()), ..zone.clone() };
    let all = [zone.clone(), agg.clone(), other];
    let near = asleep_near(&all, &rooms, &mine, ("src", &[]));
    assert_eq!(
        near,
        vec![(zone.scope.clone(), vec!["c1".to_string()]), (agg.scope.clone(), vec!["c2".to_string()])]
    );
    assert!(asleep_near(&all, &rooms, &mine, ("unknown", &[])).is_empty());
    // Once woken, it is still waited for until it is back in service.
    let waking = OurHost { wish: DesiredPower::Running, by_policy: false, ..asleep.clone() };
    let mut woken = mine.clone();
    woken.insert("c1".into(), waking.clone());
    assert_eq!(asleep_near(std::slice::from_ref(&zone), &rooms, &woken, ("src", &[]))[0].1, ["c1"]);
    woken.insert("c1".into(), OurHost { power: Some(HostPower::WaitingForChecks), ..waking });
    assert_eq!(asleep_near(std::slice::from_ref(&zone), &rooms, &woken, ("src", &[]))[0].1, ["c1"]);
    // Powering off by the policy: waited for too; by an SRE: not.
    let going = OurHost { power: Some(HostPower::WaitingForPowerOff), ..asleep.clone() };
    woken.insert("c1".into(), going.clone());
    assert_eq!(asleep_near(std::slice::from_ref(&zone), &rooms, &woken, ("src", &[]))[0].1, ["c1"]);
    woken.insert("c1".into(), OurHost { by_policy: false, ..going });
    assert!(asleep_near(std::slice::from_ref(&zone), &rooms, &woken, ("src", &[])).is_empty());
    mine.insert("c1".into(), OurHost { by_policy: false, ..asleep });
    let near = asleep_near(std::slice::from_ref(&zone), &rooms, &mine, ("src", &[]));
    assert!(near.is_empty(), "an SRE's hibernation is not the policy's to undo: {near:?}");
    // Woken for this eviction, Active, its enable not landed yet: waited for
    // while it was asked for; any other disabled host is not.
    let mut enabling_rooms = rooms.clone();
    enabling_rooms[1].in_service = false;
    mine.insert("c1".into(), OurHost { name: "n-c1".into(), ..ours("n") });
    let asked = ["c1".to_string()];
    let near = asleep_near(std::slice::from_ref(&zone), &enabling_rooms, &mine, ("src", &asked));
    assert_eq!(near, vec![(zone.scope.clone(), vec!["c1".to_string()])]);
    assert!(asleep_near(std::slice::from_ref(&zone), &enabling_rooms, &mine, ("src", &[])).is_empty());
}

#[test]
fn a_wish_of_the_policys_that_will_not_be_carried_out_is_withdrawn() {
    let wished = OurHost {
        wish: DesiredPower::Hibernating,
        power: Some(HostPower::Running),
        by_policy: true,
        ..ours("n")
    };
    assert!(!withdraw(&wished), "on its way");
    assert!(withdraw(&OurHost { refused: true, ..wished.clone() }), "refused: not empty, no BMC");
    assert!(withdraw(&OurHost { active: false, ..wished.clone() }), "in maintenance before it began");
    assert!(withdraw(&OurHost { paused: true, ..wished.clone() }));
    assert!(withdraw(&OurHost { power: None, refused: true, ..wished.clone() }));
    // Begun: the lifecycle's own bounds and error states take it from there.
    for p in
        [HostPower::Stopping, HostPower::WaitingForPowerOff, HostPower::Hibernating, HostPower::FailedToStop]
    {
        assert!(!withdraw(&OurHost { power: Some(p), active: false, paused: true, ..wished.clone() }), "{p}");
    }
    // An SRE's wish is never touched; the policy's mark on a wish to run is
    // dropped (an SRE woke it by hand).
    assert!(!withdraw(&OurHost { by_policy: false, refused: true, ..wished.clone() }));
    assert!(withdraw(&OurHost { wish: DesiredPower::Running, ..wished.clone() }));
    // Paused: never picked, never woken.
    let rooms = [room("c1", "az", &[])];
    let paused = OurHost { paused: true, ..ours("n") };
    assert!(!host(&rooms[0], Some(&paused)).may_hibernate);
    // Its last hibernation refused: not picked again until the lifecycle says otherwise.
    assert!(!host(&rooms[0], Some(&OurHost { refused: true, ..ours("n") })).may_hibernate);
    let asleep = OurHost { paused: true, power: Some(HostPower::Hibernating), ..wished };
    assert!(!host(&rooms[0], Some(&asleep)).may_wake);
}
