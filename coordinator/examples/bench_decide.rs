//! `make bench` (for now): the cost of one lifecycle decision, the unit of
//! work the coordinator pays per hypervisor per reconcile. Run in release.
//! Prints figures; asserts nothing (benchmarks, not
//! timed tests).

use std::collections::BTreeSet;
use std::hint::black_box;
use std::time::Instant;

use hv_coordinator::api::hypervisor::{CheckResultStatus, HypervisorSpec, HypervisorStatus};
use hv_coordinator::api::{MaintenanceMode, Phase};
use hv_coordinator::lifecycle::{
    AgentObs, CheckReport, Input, NodeObs, NovaHost, NovaObs, Observations, Policy, decide,
};
use jiff::Timestamp;

fn main() {
    let policy = Policy::default();
    let spec = HypervisorSpec {
        aggregates: vec!["az-1".into(), "hana".into()],
        custom_traits: vec!["CUSTOM_HANA_EXCLUSIVE".into()],
        ..HypervisorSpec::default()
    };
    let host = NovaHost {
        service_id: "svc".into(),
        hypervisor_id: Some("rp".into()),
        hypervisor_hostname: Some("node-1".into()),
        enabled: true,
        aggregates: BTreeSet::from(["az-1".to_string(), "hana".to_string()]),
        traits: Some(BTreeSet::from(["CUSTOM_HANA_EXCLUSIVE".to_string(), "HW_CPU_X86_AVX2".to_string()])),
        instances: (0..40).map(|i| format!("00000000-0000-0000-0000-{i:012}")).collect(),
        ..NovaHost::default()
    };
    let report = CheckReport {
        run: 1,
        results: (0..6)
            .map(|i| CheckResultStatus { name: format!("check-{i}"), passed: true, ..Default::default() })
            .collect(),
    };
    let obs = Observations {
        node: NodeObs::Present {
            ready: true,
            cordoned: false,
            maintenance_required: false,
            drain_refused: false,
        },
        agent: AgentObs { connected: true, domains: Some(40), since: None },
        checks: Some(report),
        nova: NovaObs::Registered(host),
        eviction: None,
        retry: None,
        close_hosts: Vec::new(),
        update_wait: None,
        claimed_by: None,
        health: None,
        machine_hostname: Some("node-1".into()),
        host_traits: None,
        dependencies: Some(Vec::new()),
        power: Default::default(),
    };
    println!("lifecycle::decide, one hypervisor, 40 instances (release build)");
    println!("{:<34} {:>12} {:>14}", "case", "ns/decision", "decisions/s");
    let cases: [(&str, Phase, MaintenanceMode); 4] = [
        ("Active, steady state", Phase::Active, MaintenanceMode::None),
        ("Testing, report arrives", Phase::Testing, MaintenanceMode::None),
        ("Active -> Evicting (maintenance)", Phase::Active, MaintenanceMode::Manual),
        ("Maintenance, held", Phase::Maintenance, MaintenanceMode::Manual),
    ];
    for (label, phase, mode) in cases {
        let mut spec = spec.clone();
        spec.maintenance = mode;
        spec.maintenance_reason = "bench".into();
        let mut status = HypervisorStatus { phase: Some(phase), ..Default::default() };
        status.lifecycle.test_run = 1;
        status.lifecycle.applied_aggregates = spec.aggregates.clone();
        status.lifecycle.applied_traits = spec.custom_traits.clone();
        let now = Timestamp::UNIX_EPOCH;
        let input =
            Input { name: "node-0001", spec: &spec, status: &status, obs: &obs, policy: &policy, now };
        for _ in 0..10_000 {
            black_box(decide(black_box(&input)));
        }
        let n = 200_000u32;
        let start = Instant::now();
        for _ in 0..n {
            black_box(decide(black_box(&input)));
        }
        let per = start.elapsed().as_nanos() as f64 / f64::from(n);
        println!("{label:<34} {per:>12.0} {:>14.0}", 1e9 / per);
    }
    println!("\n(a fleet of 5,000 hypervisors reconciled once costs 5,000 x the steady-state figure)");
}
