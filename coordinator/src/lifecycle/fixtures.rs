//! Small builders for lifecycle tests: a configured spec, a host that matches
//! it, and observations of a healthy node.

use std::collections::BTreeSet;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::api::eviction::EvictionPhase;
use crate::api::hypervisor::{CheckResultStatus, EvictionRef, HypervisorSpec, HypervisorStatus};
use crate::api::{EvictionReason, Phase};

pub const NAME: &str = "node-1";

pub fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap_or(Timestamp::UNIX_EPOCH)
}

pub fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

pub fn spec() -> HypervisorSpec {
    HypervisorSpec {
        aggregates: vec!["az-a".into()],
        custom_traits: vec!["CUSTOM_HANA".into()],
        ..HypervisorSpec::default()
    }
}

pub fn status(phase: Phase) -> HypervisorStatus {
    let mut s = HypervisorStatus { phase: Some(phase), phase_since: Some(Time(t(0))), ..Default::default() };
    if phase != Phase::Initial && phase != Phase::Onboarding {
        s.service_id = Some("svc-1".into());
        s.hypervisor_id = Some("hv-1".into());
        s.lifecycle.applied_aggregates = vec!["az-a".into()];
        s.lifecycle.applied_traits = vec!["CUSTOM_HANA".into()];
    }
    if phase == Phase::Testing {
        s.lifecycle.test_run = 1;
        s.lifecycle.test_started = Some(Time(t(0)));
    }
    s
}

/// A registered host configured exactly as `spec()` asks.
pub fn host() -> NovaHost {
    NovaHost {
        service_id: "svc-1".into(),
        hypervisor_id: Some("hv-1".into()),
        hypervisor_hostname: Some("node-1.example.com".into()),
        enabled: false,
        disabled_reason: Some("hv-lifecycle: onboarding, not tested yet".into()),
        service_state: crate::lifecycle::ServiceState::Up,
        aggregates: set(&["az-a"]),
        unknown_aggregates: BTreeSet::new(),
        traits: Some(set(&["CUSTOM_HANA", "HW_CPU_X86_AVX2"])),
        instances: Vec::new(),
    }
}

pub fn obs() -> Observations {
    Observations {
        node: NodeObs::Present {
            ready: true,
            cordoned: false,
            maintenance_required: false,
            drain_refused: false,
        },
        agent: AgentObs { connected: true, domains: None, since: None },
        checks: None,
        nova: NovaObs::Registered(host()),
        eviction: None,
        retry: None,
        close_hosts: Vec::new(),
        update_wait: None,
        claimed_by: None,
        health: None,
        machine_hostname: Some("node-1.example.com".into()),
        host_traits: None,
        dependencies: Some(Vec::new()),
        power: Default::default(),
    }
}

pub fn report(run: u64, failing: &[&str]) -> CheckReport {
    let names = ["libvirt-reachable", "libvirt-version", "ovs-bridge/br-int", "ovs-bridge/br-ex"];
    CheckReport {
        run,
        results: names
            .iter()
            .map(|n| CheckResultStatus {
                name: n.to_string(),
                passed: !failing.contains(n),
                message: if failing.contains(n) { format!("{n} failed") } else { "ok".into() },
                duration_ms: 3,
                time: None,
            })
            .collect(),
    }
}

pub fn eviction(name: &str, reason: EvictionReason, phase: EvictionPhase) -> EvictionObs {
    EvictionObs {
        name: name.into(),
        reason,
        re_enable: reason.re_enables(None),
        phase,
        message: String::new(),
        migrated: 0,
        total: 3,
        deleting: false,
    }
}

pub fn eviction_ref(name: &str, reason: EvictionReason, for_maintenance: bool) -> EvictionRef {
    EvictionRef { name: name.into(), reason, re_enable: reason.re_enables(None), for_maintenance }
}

pub fn with_host(o: &mut Observations, f: impl FnOnce(&mut NovaHost)) {
    if let NovaObs::Registered(h) = &mut o.nova {
        f(h);
    }
}

pub fn decide_at(
    spec: &HypervisorSpec,
    status: &HypervisorStatus,
    obs: &Observations,
    now: Timestamp,
) -> Decision {
    let policy = Policy::default();
    decide(&Input { name: NAME, spec, status, obs, policy: &policy, now })
}
