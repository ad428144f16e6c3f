use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

/// A running VM asking `vcpus` and `ram_mb` (other tests build on it).
pub(crate) fn vm(id: &str, vcpus: u64, ram_mb: u64) -> Server {
    Server {
        id: id.into(),
        name: format!("vm-{id}"),
        host: Some("src".into()),
        status: "ACTIVE".into(),
        memory_bytes: ram_mb << 20,
        policy: None,
        locked: false,
        pci_passthrough: false,
        local_disk: false,
        host_disks: false,
        evacuate: None,
        evict_mark: None,
        needs: Needs {
            resources: BTreeMap::from([("VCPU".into(), vcpus), ("MEMORY_MB".into(), ram_mb)]),
            project_id: "p1".into(),
            ..Needs::default()
        },
    }
}

/// A candidate with `vcpus` and `ram_mb` free.
pub(crate) fn host(name: &str, vcpus: u64, ram_mb: u64) -> Candidate {
    Candidate {
        host: name.into(),
        az: "nova".into(),
        room: BTreeMap::from([
            ("VCPU".into(), Room { free: vcpus, max_unit: vcpus }),
            ("MEMORY_MB".into(), Room { free: ram_mb, max_unit: ram_mb }),
        ]),
        ..Candidate::default()
    }
}

fn checks(r: &Report) -> Vec<(&str, &str)> {
    r.findings.iter().map(|f| (f.check, f.vm.split(' ').next().unwrap_or_default())).collect()
}

#[test]
fn capacity_packs_largest_first_and_never_counts_the_same_room_twice() {
    // Two 6 GiB VMs and one 5 GiB: 10 GiB + 6 GiB of room takes the two
    // big ones (one each) but not the third: 4 GiB are left, in one place.
    let vms = [vm("a", 1, 6144), vm("b", 1, 6144), vm("c", 1, 5120)];
    let hosts = [host("h1", 8, 10240), host("h2", 8, 6144)];
    let r = preflight(&vms, MigrationPolicy::LiveMigrate, &hosts, &[]);
    assert_eq!(checks(&r), [("capacity", "c")]);
    assert!(r.findings[0].reason.contains("MEMORY_MB 5120"), "{}", r.findings[0].reason);
    assert!(
        r.findings[0].reason.contains("4096 MB, on h1"),
        "most free after packing: {}",
        r.findings[0].reason
    );

    let roomy = [host("h1", 8, 12288), host("h2", 8, 12288)];
    let ok = preflight(&vms, MigrationPolicy::LiveMigrate, &roomy, &[]);
    assert!(ok.findings.is_empty(), "{:?}", ok.findings);
    assert!(
        ok.summary.contains("2 other enabled host(s)") && ok.summary.contains("7168 MB"),
        "{}",
        ok.summary
    );
}

#[test]
fn every_resource_class_and_max_unit_counts() {
    let mut big_cpu = vm("a", 16, 512);
    big_cpu.needs.resources.insert("CUSTOM_GPU".into(), 1);
    let mut h = host("h1", 64, 100_000);
    assert_eq!(
        checks(&preflight(std::slice::from_ref(&big_cpu), MigrationPolicy::LiveMigrate, &[h.clone()], &[])),
        [("capacity", "a")],
        "no GPU inventory"
    );
    h.room.insert("CUSTOM_GPU".into(), Room { free: 2, max_unit: 1 });
    assert!(
        preflight(std::slice::from_ref(&big_cpu), MigrationPolicy::LiveMigrate, &[h.clone()], &[])
            .findings
            .is_empty()
    );
    h.room.insert("VCPU".into(), Room { free: 64, max_unit: 8 });
    assert_eq!(
        checks(&preflight(&[big_cpu], MigrationPolicy::LiveMigrate, &[h], &[])),
        [("capacity", "a")],
        "over max_unit"
    );
}

#[test]
fn constraints_name_the_rule_that_rejects_every_host() {
    let mut pinned = vm("az", 1, 512);
    pinned.needs.pinned_az = Some("az-2".into());
    let mut traited = vm("tr", 1, 512);
    traited.needs.required_traits = BTreeSet::from(["CUSTOM_FAST".to_string()]);
    let mut forbids = vm("fb", 1, 512);
    forbids.needs.forbidden_traits = BTreeSet::from(["CUSTOM_SLOW".to_string()]);
    let mut agg = vm("ag", 1, 512);
    agg.needs.aggregate_specs = BTreeMap::from([("ssd".to_string(), "true".to_string())]);
    let mut other_project = vm("tn", 1, 512);
    other_project.needs.project_id = "p2".into();
    let plain = vm("ok", 1, 512);

    let mut h1 = host("h1", 8, 8192);
    h1.traits.insert("CUSTOM_SLOW".into());
    h1.aggregates.push(BTreeMap::from([("filter_tenant_id".to_string(), "p1, p3".to_string())]));
    let mut h2 = host("h2", 8, 8192);
    h2.traits.insert("CUSTOM_SLOW".into());
    h2.aggregates.push(BTreeMap::from([("ssd".to_string(), "false".to_string())]));
    h2.aggregates.push(BTreeMap::from([("filter_tenant_id_1".to_string(), "p1".to_string())]));

    let vms = [pinned, traited, forbids, agg, other_project, plain];
    let r = preflight(&vms, MigrationPolicy::LiveMigrate, &[h1.clone(), h2.clone()], &[]);
    let mut got = checks(&r);
    got.sort();
    assert_eq!(
        got,
        [
            ("constraints", "ag"),
            ("constraints", "az"),
            ("constraints", "fb"),
            ("constraints", "tn"),
            ("constraints", "tr")
        ]
    );
    let reason = |id: &str| {
        r.findings.iter().find(|f| f.vm.starts_with(id)).map(|f| f.reason.clone()).unwrap_or_default()
    };
    assert!(reason("az").contains("2 outside its availability zone az-2"), "{}", reason("az"));
    assert!(reason("tr").contains("without the required trait CUSTOM_FAST"));
    assert!(reason("fb").contains("with the forbidden trait CUSTOM_SLOW"));
    assert!(reason("ag").contains("in no aggregate with ssd=true"));
    assert!(reason("tn").contains("isolated to other projects than p2"));

    // A host that admits them: in az-2, fast, not slow, ssd, no isolation.
    let mut h3 = host("h3", 8, 8192);
    h3.az = "az-2".into();
    h3.traits.insert("CUSTOM_FAST".into());
    h3.aggregates.push(BTreeMap::from([("ssd".to_string(), "true,nvme".to_string())]));
    let r = preflight(&vms, MigrationPolicy::LiveMigrate, &[h1, h2, h3], &[]);
    assert!(r.findings.is_empty(), "{:?}", r.findings);
}

#[test]
fn compatibility_and_skip_and_force() {
    let mut locked = vm("lk", 1, 512);
    locked.locked = true;
    let mut pci = vm("pc", 1, 512);
    pci.pci_passthrough = true;
    let mut pci_cold = vm("pk", 1, 512);
    pci_cold.pci_passthrough = true;
    pci_cold.policy = Some(MigrationPolicy::ColdMigrate);
    let mut skip = vm("sk", 64, 1 << 30);
    skip.policy = Some(MigrationPolicy::Skip);
    let mut huge = vm("hg", 1, 1 << 20);
    huge.needs.pinned_az = Some("elsewhere".into());
    let vms = [locked, pci, pci_cold, skip, huge];
    let hosts = [host("h1", 8, 8192)];

    let r = preflight(&vms, MigrationPolicy::LiveMigrate, &hosts, &[]);
    assert_eq!(checks(&r), [("constraints", "hg"), ("compatibility", "lk"), ("compatibility", "pc")]);

    let force = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let r = preflight(&vms, MigrationPolicy::LiveMigrate, &hosts, &force(&["compatibility"]));
    assert_eq!(checks(&r), [("constraints", "hg")]);
    let r = preflight(&vms, MigrationPolicy::LiveMigrate, &hosts, &force(&["constraints"]));
    assert_eq!(
        checks(&r),
        [("capacity", "hg"), ("compatibility", "lk"), ("compatibility", "pc")],
        "past the zone, it is too big"
    );
    let r = preflight(
        &vms,
        MigrationPolicy::LiveMigrate,
        &hosts,
        &force(&["constraints", "capacity", "compatibility"]),
    );
    assert!(r.findings.is_empty());
    assert!(r.summary.contains("skipped (force): compatibility, constraints, capacity"), "{}", r.summary);

    // The cluster default policy applies to VMs without their own.
    let plain = [vm("a", 1, 1 << 20)];
    assert!(preflight(&plain, MigrationPolicy::Skip, &hosts, &[]).findings.is_empty());
}

#[test]
fn no_other_host_is_a_finding_for_every_vm() {
    let r = preflight(&[vm("a", 1, 512), vm("b", 1, 512)], MigrationPolicy::LiveMigrate, &[], &[]);
    assert_eq!(checks(&r), [("constraints", "a"), ("constraints", "b")]);
    assert!(r.findings[0].reason.contains("no other enabled compute host"));
    assert!(
        preflight(&[], MigrationPolicy::LiveMigrate, &[], &[]).findings.is_empty(),
        "an empty host needs nowhere"
    );
}

#[test]
fn flavors_become_placement_requests_as_nova_builds_them() {
    let none = BTreeMap::new();
    let r = flavor_resources(2, 4096, 20, 5, 1536, false, &none);
    assert_eq!(r, BTreeMap::from([("VCPU".into(), 2), ("MEMORY_MB".into(), 4096), ("DISK_GB".into(), 27)]));
    let r = flavor_resources(2, 4096, 20, 0, 0, true, &none);
    assert_eq!(r.get("DISK_GB"), None, "a volume-backed root disk takes no local disk");
    let specs = BTreeMap::from([
        ("resources:VCPU".to_string(), "0".to_string()),
        ("resources:PCPU".to_string(), "2".to_string()),
        ("resources:CUSTOM_X".to_string(), "junk".to_string()),
        ("hw:cpu_policy".to_string(), "dedicated".to_string()),
    ]);
    let r = flavor_resources(2, 1024, 0, 0, 0, false, &specs);
    assert_eq!(r, BTreeMap::from([("PCPU".into(), 2), ("MEMORY_MB".into(), 1024)]));
    // Sizes at the edge of u64 (from Nova, not ours to trust) saturate.
    let r = flavor_resources(1, 1, u64::MAX, u64::MAX, u64::MAX, false, &none);
    assert_eq!(r.get("DISK_GB"), Some(&u64::MAX));
}

#[test]
fn room_is_reserved_off_then_overcommitted_then_used() {
    assert_eq!(room(1000, 0, 4.0, 1000, 10).free, 3990);
    assert_eq!(room(800_000, 512, 1.0, 800_000, 0).free, 799_488);
    assert_eq!(room(10, 20, 1.0, 10, 0).free, 0, "reserved above total");
    assert_eq!(room(10, 0, f64::NAN, 10, 0).free, 0);
    assert_eq!(room(10, 0, 1.0, 10, 50).free, 0, "over-used");
}

proptest! {
    /// Whatever passes is really placed: the VMs without a finding never
    /// need more of a resource than the hosts have free together; and a
    /// single VM has a finding exactly when no host alone can take it.
    #[test]
    fn capacity_never_overcommits_and_finds_room_when_there_is_some(
        vms in prop::collection::vec((1u64..8, 1u64..16), 0..10),
        hosts in prop::collection::vec((0u64..32, 0u64..64), 0..5),
    ) {
        let servers: Vec<Server> = vms.iter().enumerate().map(|(i, (c, g))| vm(&format!("v{i:02}"), *c, g * 1024)).collect();
        let cands: Vec<Candidate> = hosts.iter().enumerate().map(|(i, (c, g))| host(&format!("h{i}"), *c, g * 1024)).collect();
        let r = preflight(&servers, MigrationPolicy::LiveMigrate, &cands, &[]);
        let need = |k: &str| -> u64 {
            servers.iter().filter(|s| !r.findings.iter().any(|f| f.vm.starts_with(&s.id))).map(|s| s.needs.resources.get(k).copied().unwrap_or(0)).sum()
        };
        let have = |k: &str| -> u64 { cands.iter().map(|c| c.room.get(k).map_or(0, |r| r.free)).sum() };
        prop_assert!(need("VCPU") <= have("VCPU"));
        prop_assert!(need("MEMORY_MB") <= have("MEMORY_MB"));
        for s in &servers {
            let alone = preflight(std::slice::from_ref(s), MigrationPolicy::LiveMigrate, &cands, &[]);
            let room = cands.iter().any(|c| fits(&s.needs.resources, &c.room));
            prop_assert_eq!(alone.findings.is_empty(), room);
        }
    }
}

#[test]
fn only_the_traits_vms_name_are_asked_about_and_each_candidate_gets_those_its_provider_carries() {
    let mut a = vm("a", 1, 512);
    a.needs.required_traits = BTreeSet::from(["CUSTOM_GPU".to_string()]);
    let mut b = vm("b", 1, 512);
    b.needs.forbidden_traits = BTreeSet::from(["CUSTOM_SLOW".to_string()]);
    let plain = vm("c", 1, 512);
    assert!(named_traits(std::slice::from_ref(&plain)).is_empty(), "no VM names one: none asked");
    let named = named_traits(&[a.clone(), b.clone(), plain.clone()]);
    assert_eq!(named, BTreeSet::from(["CUSTOM_GPU".to_string(), "CUSTOM_SLOW".to_string()]));

    let mut hosts = vec![host("h1", 8, 8192), host("h2", 8, 8192), host("h3", 8, 8192)];
    for (h, uuid) in hosts.iter_mut().zip(["p1", "p2", "p3"]) {
        h.provider = uuid.into();
    }
    let carried = BTreeMap::from([
        ("CUSTOM_GPU".to_string(), BTreeSet::from(["p2".to_string()])),
        ("CUSTOM_SLOW".to_string(), BTreeSet::from(["p2".to_string(), "p3".to_string()])),
    ]);
    with_traits(&mut hosts, &carried);
    let traits: Vec<Vec<&str>> =
        hosts.iter().map(|h| h.traits.iter().map(String::as_str).collect()).collect();
    assert_eq!(traits, [vec![], vec!["CUSTOM_GPU", "CUSTOM_SLOW"], vec!["CUSTOM_SLOW"]]);
    // The VM that requires the GPU fits only on h2; the one that forbids
    // slow hosts only on h1.
    let r = preflight(std::slice::from_ref(&a), MigrationPolicy::LiveMigrate, &hosts[..1], &[]);
    assert_eq!(checks(&r), [("constraints", "a")]);
    let r = preflight(&[a], MigrationPolicy::LiveMigrate, &hosts[1..2], &[]);
    assert!(r.findings.is_empty(), "a on h2: {r:?}");
    let r = preflight(std::slice::from_ref(&b), MigrationPolicy::LiveMigrate, &hosts[1..], &[]);
    assert_eq!(checks(&r), [("constraints", "b")]);
    let r = preflight(&[b], MigrationPolicy::LiveMigrate, &hosts[..1], &[]);
    assert!(r.findings.is_empty(), "b on h1: {r:?}");
    let r = preflight(&[plain], MigrationPolicy::LiveMigrate, &hosts, &[]);
    assert!(r.findings.is_empty(), "{r:?}");
}

#[test]
fn the_plan_names_each_vm_with_where_its_room_was_counted_or_what_stops_it() {
    let mut skipped = vm("s", 1, 512);
    skipped.policy = Some(MigrationPolicy::Skip);
    let mut locked = vm("l", 1, 512);
    locked.locked = true;
    let vms = [vm("a", 1, 6144), vm("b", 1, 6144), vm("c", 1, 5120), skipped, locked];
    let hosts = [host("h1", 8, 10240), host("h2", 8, 6144)];
    let r = preflight(&vms, MigrationPolicy::LiveMigrate, &hosts, &[]);
    let plan: Vec<(&str, Option<&str>, Option<&str>)> =
        r.plan.iter().map(|p| (p.id.as_str(), p.fits_on.as_deref(), p.finding.as_deref())).collect();
    assert_eq!(plan.len(), 5, "every VM, in the order given: {plan:?}");
    assert_eq!(plan[0], ("a", Some("h1"), None));
    assert_eq!(plan[1], ("b", Some("h2"), None));
    assert_eq!((plan[2].0, plan[2].1), ("c", None));
    assert!(plan[2].2.is_some_and(|f| f.starts_with("capacity: needs")), "{plan:?}");
    assert_eq!(plan[3], ("s", None, None));
    assert_eq!(r.plan[3].policy, MigrationPolicy::Skip);
    assert_eq!(plan[4], ("l", None, Some("compatibility: the server is locked")));
}

fn software(hv: &str) -> os_check::HostSoftware {
    os_check::HostSoftware {
        hypervisor_type: "QEMU".into(),
        hypervisor_version: hv.into(),
        libvirt_version: "10.0.0".into(),
        arch: "x86_64".into(),
        ..Default::default()
    }
}

#[test]
fn a_vm_whose_every_admissible_host_is_older_is_named_by_the_os_check() {
    let mut a = vm("a", 1, 1024);
    a.needs.runs_on = Some(software("9.0.0"));
    let older = |name: &str| Candidate { software: Some(software("8.2.2")), ..host(name, 8, 8192) };
    let r = preflight(&[a.clone()], MigrationPolicy::LiveMigrate, &[older("h1"), older("h2")], &[]);
    assert_eq!(checks(&r), [("os", "a")]);
    assert_eq!(
        r.findings[0].reason,
        "none of the 2 admissible hosts can run it as it runs now: 2 with a hypervisor older than the source's 9.0.0"
    );
    assert!(r.plan[0].finding.as_deref().is_some_and(|f| f.starts_with("os: ")), "{:?}", r.plan[0]);

    // One newer host is enough; one whose software is not known is not judged.
    let newer = Candidate { software: Some(software("9.1.0")), ..host("h3", 8, 8192) };
    let r = preflight(&[a.clone()], MigrationPolicy::LiveMigrate, &[older("h1"), newer], &[]);
    assert!(r.findings.is_empty(), "{:?}", r.findings);
    assert_eq!(r.plan[0].fits_on.as_deref(), Some("h3"), "placed on the host that can run it");
    let unknown = host("h4", 8, 8192);
    assert!(
        preflight(&[a.clone()], MigrationPolicy::LiveMigrate, &[older("h1"), unknown], &[])
            .findings
            .is_empty()
    );

    // Forced, the check is skipped and said so; a host out of its zone is no candidate.
    let r = preflight(&[a.clone()], MigrationPolicy::LiveMigrate, &[older("h1")], &["os".to_string()]);
    assert!(r.findings.is_empty() && r.summary.contains("skipped (force): os"), "{}", r.summary);
    a.needs.pinned_az = Some("az-2".into());
    let r = preflight(&[a], MigrationPolicy::LiveMigrate, &[older("h1")], &[]);
    assert_eq!(checks(&r), [("constraints", "a")], "constraints are judged first");
}

fn in_group(mut s: Server, rule: server_groups::Rule, members: &[(&str, &str)]) -> Server {
    s.needs.group = Some(Group {
        id: "g".into(),
        name: "web".into(),
        rule,
        members_on: members.iter().map(|(m, h)| (m.to_string(), h.to_string())).collect(),
    });
    s
}

#[test]
fn anti_affinity_members_are_placed_apart_and_a_third_with_two_hosts_is_a_finding() {
    let anti = server_groups::Rule::AntiAffinity { max_per_host: 1 };
    let members = [("a", "src"), ("b", "src"), ("c", "src")];
    let vms: Vec<Server> =
        ["a", "b", "c"].iter().map(|id| in_group(vm(id, 1, 1024), anti, &members)).collect();
    // Room for all three on h1 alone; the group lets only one go there.
    let hosts = [host("h1", 8, 8192), host("h2", 8, 2048)];
    let r = preflight(&vms, MigrationPolicy::LiveMigrate, &hosts, &[]);
    assert_eq!(checks(&r), [("constraints", "c")], "{:?}", r.findings);
    assert!(r.findings[0].reason.contains("anti-affinity group web"), "{}", r.findings[0].reason);
    let on: Vec<Option<&str>> = r.plan.iter().map(|p| p.fits_on.as_deref()).collect();
    assert_eq!(on, [Some("h1"), Some("h2"), None], "one member per host");
    // A member already on h2 leaves only h1 for them all.
    let elsewhere = [("a", "src"), ("x", "h2")];
    let one = [in_group(vm("a", 1, 1024), anti, &elsewhere)];
    let r = preflight(&one, MigrationPolicy::LiveMigrate, &hosts, &[]);
    assert_eq!(r.plan[0].fits_on.as_deref(), Some("h1"));
    // Forced past the constraints: the group is not judged.
    let forced = preflight(&vms, MigrationPolicy::LiveMigrate, &hosts, &["constraints".into()]);
    assert!(forced.findings.is_empty(), "{:?}", forced.findings);
}

#[test]
fn an_affinity_member_cannot_leave_its_group_behind() {
    let members = [("a", "src"), ("b", "src")];
    let vms = [in_group(vm("a", 1, 1024), server_groups::Rule::Affinity, &members)];
    let hosts = [host("h1", 8, 8192)];
    let r = preflight(&vms, MigrationPolicy::LiveMigrate, &hosts, &[]);
    assert_eq!(checks(&r), [("constraints", "a")]);
    assert!(r.findings[0].reason.contains("cannot move alone"), "{}", r.findings[0].reason);
}

#[test]
fn the_room_other_running_evictions_planned_is_held() {
    use crate::api::Eviction;
    use crate::api::eviction::{
        EvictionPhase, EvictionReason, EvictionSpec, EvictionStatus, VmState, VmStatus,
    };
    let other = |name: &str, phase: EvictionPhase, dry_run: bool, state: Option<VmState>| {
        let spec = EvictionSpec {
            hypervisor: "other".into(),
            reason: EvictionReason::AdminRequest,
            options: Default::default(),
            dry_run,
        };
        let mut e = Eviction::new(name, spec);
        e.status = Some(EvictionStatus {
            phase: Some(phase),
            preflight: vec![PlannedVm {
                id: "o1".into(),
                fits_on: Some("h1".into()),
                takes: BTreeMap::from([("MEMORY_MB".into(), 6144)]),
                ..Default::default()
            }],
            vms: state
                .map(|s| VmStatus { id: "o1".into(), state: s, ..Default::default() })
                .into_iter()
                .collect(),
            ..Default::default()
        });
        std::sync::Arc::new(e)
    };
    let all = vec![
        other("waiting", EvictionPhase::Migrating, false, Some(VmState::Pending)),
        other("not-started", EvictionPhase::Disabling, false, None),
        other("judging", EvictionPhase::Preflight, false, None),
        other("moving", EvictionPhase::Migrating, false, Some(VmState::Migrating)),
        other("done", EvictionPhase::Succeeded, false, Some(VmState::Pending)),
        other("dry", EvictionPhase::Planned, true, None),
        other("me", EvictionPhase::Preflight, false, None),
    ];
    let held = others_planned(&all, "me");
    assert_eq!(held.len(), 2, "the pending VM and the one not started yet: {held:?}");
    let mut hosts = [host("h1", 8, 16384), host("h2", 8, 4096)];
    hold_for_others(&mut hosts, &held);
    assert_eq!(hosts[0].room["MEMORY_MB"].free, 4096);
    // Two evictions of 6 GiB each starting together: the second finds h1 taken.
    let r = preflight(&[vm("a", 1, 6144)], MigrationPolicy::LiveMigrate, &hosts, &[]);
    assert_eq!(checks(&r), [("capacity", "a")]);
}
