//! `make demo` until the local region exists (issue 5): three nodes walked
//! through the real lifecycle core (`hv_coordinator::lifecycle::decide`)
//! against a small in-memory stand-in for Nova and the agent. Every phase
//! change and action printed here is what the core decided; what is
//! simulated is the world that answers it.

use std::collections::{BTreeMap, BTreeSet};

use hv_coordinator::api::eviction::EvictionPhase;
use hv_coordinator::api::hypervisor::{CheckResultStatus, HypervisorSpec, HypervisorStatus};
use hv_coordinator::api::{MaintenanceMode, Phase};
use hv_coordinator::lifecycle::{
    Action, AgentObs, CheckReport, EvictionObs, Input, NodeObs, NovaHost, NovaObs, Observations, Policy,
    decide,
};
use jiff::{SignedDuration, Timestamp};

/// The simulated world of one node.
struct World {
    name: &'static str,
    spec: HypervisorSpec,
    status: HypervisorStatus,
    nova: Option<NovaHost>,
    agent: bool,
    broken_bridge: bool,
    eviction: Option<EvictionObs>,
    retry: Option<String>,
    last_run_answered: u64,
    report: Option<CheckReport>,
}

impl World {
    fn new(name: &'static str, broken_bridge: bool) -> Self {
        World {
            name,
            spec: HypervisorSpec {
                aggregates: vec!["az-1".into(), "hana".into()],
                custom_traits: vec!["CUSTOM_HANA_EXCLUSIVE".into()],
                ..HypervisorSpec::default()
            },
            status: HypervisorStatus::default(),
            nova: None,
            agent: false,
            broken_bridge,
            eviction: None,
            retry: None,
            last_run_answered: 0,
            report: None,
        }
    }

    fn observe(&self) -> Observations {
        Observations {
            node: NodeObs::Present { ready: true },
            agent: AgentObs { connected: self.agent },
            checks: self.report.clone(),
            nova: match &self.nova {
                Some(h) => NovaObs::Registered(h.clone()),
                None => NovaObs::NotRegistered,
            },
            eviction: self.eviction.clone(),
            retry: self.retry.clone(),
        }
    }

    /// What Nova, Placement and the agent would do with each action.
    fn execute(&mut self, actions: &[Action]) {
        for a in actions {
            let host = self.nova.as_mut();
            match (a, host) {
                (Action::EnableService, Some(h)) => {
                    h.enabled = true;
                    h.disabled_reason = None;
                }
                (Action::DisableService { reason }, Some(h)) => {
                    h.enabled = false;
                    h.disabled_reason = Some(reason.clone());
                }
                (Action::AddAggregate { name }, Some(h)) => {
                    h.aggregates.insert(name.clone());
                }
                (Action::RemoveAggregate { name }, Some(h)) => {
                    h.aggregates.remove(name);
                }
                (Action::AddTraits { traits }, Some(h)) => {
                    h.traits.get_or_insert_with(BTreeSet::new).extend(traits.iter().cloned());
                }
                (Action::RemoveTraits { traits }, Some(h)) => {
                    if let Some(t) = h.traits.as_mut() {
                        t.retain(|x| !traits.contains(x));
                    }
                }
                (Action::RunChecks { run }, _) if *run > self.last_run_answered => {
                    self.last_run_answered = *run;
                    let bridge_ok = !self.broken_bridge;
                    let check = |name: &str, passed: bool, message: &str| CheckResultStatus {
                        name: name.into(),
                        passed,
                        message: message.into(),
                        duration_ms: 12,
                        time: None,
                    };
                    self.report = Some(CheckReport {
                        run: *run,
                        results: vec![
                            check("libvirt-reachable", true, "qemu+tcp://127.0.0.1:16509/system answered"),
                            check("libvirt-version", true, "9.0.0 >= 8.0.0"),
                            check("ovs-bridge/br-int", true, "present"),
                            check(
                                "ovs-bridge/br-ex",
                                bridge_ok,
                                if bridge_ok { "present" } else { "bridge br-ex does not exist" },
                            ),
                        ],
                    });
                }
                (Action::CreateEviction { name, reason }, _) => {
                    // The eviction controller (issue 6) is simulated: it
                    // empties the host at once.
                    self.eviction = Some(EvictionObs {
                        name: name.clone(),
                        reason: *reason,
                        re_enable: false,
                        phase: EvictionPhase::Succeeded,
                        message: String::new(),
                        migrated: 2,
                        total: 2,
                        deleting: false,
                    });
                    if let Some(h) = self.nova.as_mut() {
                        h.instances.clear();
                    }
                }
                _ => {}
            }
        }
    }
}

fn main() {
    println!("hv demo: the lifecycle core driving three simulated nodes.");
    println!("NOT YET REAL: Nova, Placement, libvirt, OVS and the agent are simulated in this");
    println!("process; the Kubernetes controllers, the agent and the local region come with");
    println!("issues 3-5. Every phase change and action below is decided by lifecycle::decide.\n");
    let policy = Policy::default();
    let mut now = Timestamp::UNIX_EPOCH;
    let mut worlds =
        vec![World::new("node-1", false), World::new("node-2", false), World::new("node-3", true)];
    let mut script: BTreeMap<u32, &str> = BTreeMap::new();
    script.insert(2, "nova-compute registers on every node (enabled, as Nova defaults)");
    script.insert(4, "agents connect");
    script.insert(14, "SRE: fix br-ex on node-3, then `hvctl retry node-3`");
    script.insert(22, "SRE: `kubectl patch hv node-1 --type merge -p '{\"spec\":{\"maintenance\":\"manual\",\"maintenanceReason\":\"BIOS update\"}}'`");
    script.insert(30, "SRE: maintenance on node-1 done, spec.maintenance cleared");
    for tick in 0..44u32 {
        now = now.checked_add(SignedDuration::from_secs(5)).unwrap_or(now);
        if let Some(what) = script.get(&tick) {
            println!("[t+{:>3}s] -- {what}", tick * 5);
        }
        for w in worlds.iter_mut() {
            match tick {
                2 => {
                    w.nova = Some(NovaHost {
                        service_id: format!("svc-{}", w.name),
                        hypervisor_id: Some(format!("rp-{}", w.name)),
                        enabled: true,
                        traits: Some(BTreeSet::from(["HW_CPU_X86_AVX2".to_string()])),
                        instances: if w.name == "node-1" {
                            vec!["vm-a".into(), "vm-b".into()]
                        } else {
                            vec![]
                        },
                        ..NovaHost::default()
                    })
                }
                4 => w.agent = true,
                14 if w.broken_bridge => {
                    w.broken_bridge = false;
                    w.retry = Some("retry-1".into());
                }
                22 if w.name == "node-1" => {
                    w.spec.maintenance = MaintenanceMode::Manual;
                    w.spec.maintenance_reason = "BIOS update".into();
                }
                30 if w.name == "node-1" => {
                    w.spec.maintenance = MaintenanceMode::None;
                    w.spec.maintenance_reason.clear();
                }
                _ => {}
            }
            let obs = w.observe();
            let d = decide(&Input {
                name: w.name,
                spec: &w.spec,
                status: &w.status,
                obs: &obs,
                policy: &policy,
                now,
            });
            if let Some(t) = &d.transition {
                println!("[t+{:>3}s] {:<7} {} -> {}  ({})", tick * 5, w.name, t.from, t.to, t.reason);
            }
            for a in &d.actions {
                println!("[t+{:>3}s] {:<7} {:<11} action: {a}", tick * 5, w.name, d.phase.as_str());
            }
            for drift in &d.drift {
                println!("[t+{:>3}s] {:<7} drift repaired: {drift}", tick * 5, w.name);
            }
            w.execute(&d.actions);
            w.status.phase = Some(d.phase);
            w.status.phase_since = d.phase_since;
            w.status.lifecycle = d.record;
            w.status.service_id = d.service_id;
            w.status.hypervisor_id = d.hypervisor_id;
        }
    }
    println!();
    let mut all_active = true;
    for w in &worlds {
        let phase = w.status.phase.unwrap_or_default();
        all_active &= phase == Phase::Active;
        let aggs = w
            .nova
            .as_ref()
            .map(|h| h.aggregates.iter().cloned().collect::<Vec<_>>().join(","))
            .unwrap_or_default();
        println!("{:<7} phase {:<11} nova aggregates [{aggs}]", w.name, phase.as_str());
    }
    if all_active {
        println!("\nall three nodes are Active.");
    } else {
        println!("\nnot every node reached Active: the walkthrough is broken.");
        std::process::exit(1);
    }
}
