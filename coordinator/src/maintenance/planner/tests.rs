use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

fn res(mem_gb: u64, vcpus: u64) -> Resources {
    BTreeMap::from([(MEMORY.to_string(), mem_gb * 1024), ("VCPU".to_string(), vcpus)])
}

fn host(name: &str, domain: &str, cap_gb: u64, vms: &[u64], in_plan: bool) -> PlanHost {
    PlanHost {
        name: name.into(),
        domain: domain.into(),
        aggregates: vec![],
        capacity: res(cap_gb, 64),
        vms: vms
            .iter()
            .enumerate()
            .map(|(i, g)| PlanVm { id: format!("{name}-vm{i}"), needs: res(*g, 2) })
            .collect(),
        in_plan,
        done: false,
    }
}

fn limits() -> Limits {
    Limits { per_domain: 8, per_aggregate: 8, per_wave: 8, headroom: 0.0 }
}

#[test]
fn the_first_wave_lands_on_hosts_outside_the_plan_and_later_ones_on_updated_hosts() {
    // One spare outside the plan with room for one host's VMs; three full hosts.
    let hosts = [
        host("spare", "r1", 64, &[], false),
        host("a", "r1", 64, &[16, 16], true),
        host("b", "r2", 64, &[16, 16], true),
        host("c", "r3", 64, &[16, 16], true),
    ];
    let waves = plan(&hosts, &Limits { headroom: 0.0, ..limits() }).unwrap_or_else(|s| panic!("{s:?}"));
    assert!(waves.len() >= 2, "{waves:?}");
    assert!(waves[0].moves.iter().all(|m| m.to == "spare"), "{:?}", waves[0]);
    let first: BTreeSet<&str> = waves[0].hosts.iter().map(String::as_str).collect();
    for m in waves.iter().skip(1).flat_map(|w| &w.moves) {
        assert!(m.to == "spare" || first.contains(m.to.as_str()), "{m:?}");
    }
}

#[test]
fn an_empty_host_of_the_plan_goes_first_and_gives_its_room() {
    let hosts = [host("empty", "r1", 64, &[], true), host("a", "r2", 64, &[32], true)];
    let waves = plan(&hosts, &limits()).unwrap_or_else(|s| panic!("{s:?}"));
    assert_eq!(waves[0].hosts, ["empty"]);
    assert_eq!(waves[1].moves, [Move { vm: "a-vm0".into(), from: "a".into(), to: "empty".into() }]);
}

#[test]
fn no_room_anywhere_is_told_with_the_host_and_the_room() {
    let hosts = [host("a", "r1", 64, &[32], true), host("b", "r2", 64, &[40], true)];
    let stuck = plan(&hosts, &limits()).unwrap_err();
    assert!(stuck.waves.is_empty());
    assert_eq!(stuck.left, ["a", "b"]);
    assert!(stuck.why.starts_with("a: its VMs (32768 MB of memory) do not fit on the 0"), "{}", stuck.why);
}

#[test]
fn the_headroom_holds_a_wave_back() {
    // Two hosts of 100 GB with 10 GB each: emptying both at once leaves
    // 0 GB free of 0 in service... one at a time leaves 80 of 100.
    let hosts = [
        host("spare", "r0", 100, &[], false),
        host("a", "r1", 100, &[10], true),
        host("b", "r2", 100, &[10], true),
    ];
    let loose = plan(&hosts, &limits()).unwrap_or_else(|s| panic!("{s:?}"));
    assert_eq!(loose[0].hosts.len(), 2, "{loose:?}");
    let tight = plan(&hosts, &Limits { headroom: 0.85, ..limits() }).unwrap_or_else(|s| panic!("{s:?}"));
    assert!(tight.iter().all(|w| w.hosts.len() == 1), "{tight:?}");
    let impossible = plan(&hosts, &Limits { headroom: 0.99, ..limits() }).unwrap_err();
    assert!(impossible.why.contains("headroom of 99%"), "{}", impossible.why);
}

#[test]
fn a_failure_domain_gives_at_most_its_limit_per_wave() {
    let hosts = [
        host("spare", "r0", 512, &[], false),
        host("a", "r1", 64, &[8], true),
        host("b", "r1", 64, &[8], true),
        host("c", "r1", 64, &[8], true),
    ];
    let waves = plan(&hosts, &Limits { per_domain: 1, ..limits() }).unwrap_or_else(|s| panic!("{s:?}"));
    assert_eq!(waves.len(), 3, "{waves:?}");
}

/// A region drawn at random: hosts in racks and aggregates, servers of
/// three sizes.
fn region() -> impl Strategy<Value = (Vec<PlanHost>, Limits)> {
    let one = (
        0usize..4,
        prop::collection::vec(0usize..3, 0..2),
        2u64..5,
        prop::collection::vec(0usize..3, 0..10),
        0u8..10,
    );
    (prop::collection::vec(one, 2..16), 1u32..4, 1u32..4, 1u32..8, 0u32..40).prop_map(
        |(hs, per_domain, per_aggregate, per_wave, headroom)| {
            let sizes = [2u64, 8, 32];
            let hosts = hs
                .into_iter()
                .enumerate()
                .map(|(i, (rack, aggs, cap, vms, kind))| {
                    let name = format!("h{i:02}");
                    let mut h = host(&name, &format!("r{rack}"), cap * 32, &[], kind >= 3);
                    h.aggregates = aggs.into_iter().map(|a| format!("agg{a}")).collect();
                    h.done = kind == 9;
                    let mut used = 0;
                    for (j, s) in vms.into_iter().enumerate() {
                        let g = sizes[s];
                        if used + g <= cap * 32 {
                            used += g;
                            h.vms.push(PlanVm { id: format!("{name}-vm{j}"), needs: res(g, 2) });
                        }
                    }
                    h
                })
                .collect();
            (hosts, Limits { per_domain, per_aggregate, per_wave, headroom: f64::from(headroom) / 100.0 })
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever the region: no VM is planned to move twice, nor onto a host
    /// still to be updated; no wave takes more of a failure domain or an
    /// aggregate than its limit; no host is filled past its capacity; the
    /// free memory in service never drops under the headroom; and a plan
    /// that is found updates every host of the plan once.
    #[test]
    fn waves_move_each_vm_once_within_the_limits_and_the_headroom((hosts, limits) in region()) {
        let (waves, finished) = match plan(&hosts, &limits) {
            Ok(w) => (w, true),
            Err(s) => (s.waves, false),
        };
        let by_name: BTreeMap<&str, &PlanHost> = hosts.iter().map(|h| (h.name.as_str(), h)).collect();
        let mut used: BTreeMap<&str, Resources> = hosts.iter().map(|h| {
            let mut r = Resources::new();
            for vm in &h.vms { for (c, n) in &vm.needs { *r.entry(c.clone()).or_default() += n; } }
            (h.name.as_str(), r)
        }).collect();
        let mut updated: BTreeSet<&str> = hosts.iter().filter(|h| h.done).map(|h| h.name.as_str()).collect();
        let mut moved: BTreeSet<&str> = BTreeSet::new();
        let mut waved: BTreeSet<&str> = BTreeSet::new();
        for w in &waves {
            prop_assert!(!w.hosts.is_empty() && w.hosts.len() <= limits.per_wave as usize);
            let here: Vec<&PlanHost> = w.hosts.iter().map(|h| by_name[h.as_str()]).collect();
            for h in &here {
                prop_assert!(h.in_plan && !h.done, "{} is not the plan's to update", h.name);
                prop_assert!(waved.insert(h.name.as_str()), "{} updated twice", h.name);
                let same = here.iter().filter(|x| x.domain == h.domain).count();
                prop_assert!(same <= limits.per_domain as usize, "domain {} over its limit", h.domain);
                for a in &h.aggregates {
                    let n = here.iter().filter(|x| x.aggregates.contains(a)).count();
                    prop_assert!(n <= limits.per_aggregate as usize, "aggregate {a} over its limit");
                }
            }
            for m in &w.moves {
                prop_assert!(moved.insert(m.vm.as_str()), "{} moved twice", m.vm);
                prop_assert!(w.hosts.contains(&m.from), "{} leaves a host not in its wave", m.vm);
                let to = by_name[m.to.as_str()];
                prop_assert!(!to.in_plan || updated.contains(m.to.as_str()), "{} lands on {}, not updated yet", m.vm, m.to);
                let needs = &by_name[m.from.as_str()].vms.iter().find(|v| v.id == m.vm).map(|v| v.needs.clone()).unwrap_or_default();
                for (c, n) in needs {
                    *used.entry(m.to.as_str()).or_default().entry(c.clone()).or_default() += n;
                    if let Some(u) = used.get_mut(m.from.as_str()).and_then(|r| r.get_mut(c)) { *u -= n; }
                }
            }
            for h in &here {
                let left: u64 = used[h.name.as_str()].values().sum();
                prop_assert_eq!(left, 0, "{} not emptied", h.name);
                prop_assert_eq!(w.moves.iter().filter(|m| m.from == h.name).count(), h.vms.len());
            }
            for (name, u) in &used {
                for (c, n) in u {
                    prop_assert!(*n <= amount(&by_name[name].capacity, c), "{name} past its {c}");
                }
            }
            let (mut cap, mut free) = (0u64, 0u64);
            for h in hosts.iter().filter(|h| !w.hosts.contains(&h.name)) {
                let c = amount(&h.capacity, MEMORY);
                cap += c;
                free += c - amount(&used[h.name.as_str()], MEMORY);
            }
            prop_assert!(cap == 0 || free as f64 >= limits.headroom * cap as f64, "under the headroom");
            updated.extend(w.hosts.iter().map(String::as_str));
        }
        let all_vms: usize = hosts.iter().filter(|h| h.in_plan && !h.done).map(|h| h.vms.len()).sum();
        if finished {
            prop_assert_eq!(moved.len(), all_vms, "every VM of the plan moved");
            prop_assert_eq!(waved.len(), hosts.iter().filter(|h| h.in_plan && !h.done).count());
        }
    }
}
