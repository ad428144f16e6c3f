//! `/metrics` (Prometheus text format), `/healthz` and `/readyz` of the coordinator.
//!
//! The eviction counters are derived from each eviction step by a pure
//! [`tally`] and added only once the step's status write succeeded, so a
//! step that is computed again after a failed write is not counted twice.
//! Counters start at zero in every process (Prometheus' `rate()` copes);
//! the durable record is the Eviction's and Migrations' status.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hv_listen::{Bytes, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use jiff::Timestamp;

use crate::api::Phase;
use crate::api::eviction::{VmState, VmStatus};
use crate::api::hypervisor::HealthState;
use crate::eviction::plan::{Action, Step};

/// Upper bounds (seconds) of the migration duration histogram.
pub const DURATION_BUCKETS: [f64; 10] = [5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0];

/// What one eviction step did, in metric terms.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally {
    /// Migrations asked of Nova (first attempts and retries).
    pub started: u64,
    /// Of those, attempts after the first.
    pub retried: u64,
    pub aborted: u64,
    /// VMs whose attempt completed in this step.
    pub succeeded: u64,
    pub non_migratable: u64,
    /// Seconds from asking Nova to seeing the VM migrated, per success.
    pub durations: Vec<f64>,
}

/// Compares the records before and after a step.
pub fn tally(before: &[VmStatus], step: &Step, now: Timestamp) -> Tally {
    let mut t = Tally::default();
    for a in &step.actions {
        match a {
            Action::Migrate { attempt, .. } | Action::Evacuate { attempt, .. } => {
                t.started += 1;
                t.retried += u64::from(*attempt > 1);
            }
            Action::Abort { .. } => t.aborted += 1,
            Action::ConfirmResize { .. } | Action::Start { .. } => {}
        }
    }
    for vm in &step.vms {
        let was = before.iter().find(|b| b.id == vm.id).map(|b| b.state);
        if was == Some(vm.state) {
            continue;
        }
        match vm.state {
            VmState::Migrated if was == Some(VmState::Migrating) => {
                t.succeeded += 1;
                if let Some(start) = &vm.attempt_started {
                    t.durations.push(now.duration_since(start.0).as_secs_f64().max(0.0));
                }
            }
            VmState::NonMigratable => t.non_migratable += 1,
            _ => {}
        }
    }
    t
}

#[derive(Default)]
pub struct Metrics {
    pub leader: AtomicBool,
    started: AtomicU64,
    retried: AtomicU64,
    aborted: AtomicU64,
    succeeded: AtomicU64,
    non_migratable: AtomicU64,
    /// Cumulative counts per bucket of [`DURATION_BUCKETS`], then +Inf.
    buckets: [AtomicU64; DURATION_BUCKETS.len() + 1],
    /// Sum of durations in milliseconds.
    sum_ms: AtomicU64,
    /// Agent sessions refused: the client certificate did not name the node.
    pub agent_sessions_refused: Arc<AtomicU64>,
    /// The gRPC listener's TLS counters, when it serves TLS.
    tls: std::sync::OnceLock<Arc<hv_tls::server::Stats>>,
    /// The fleet as this replica sees it (the Hypervisor cache and the
    /// agent sessions), shown only while it leads.
    fleet: std::sync::OnceLock<FleetSource>,
    /// Health changes by the state entered (in [`HEALTH_STATES`] order).
    health_transitions: [AtomicU64; 4],
    /// This replica's pod label, when it labels its pod (`k8s::leader_pod`).
    pod_label: std::sync::OnceLock<Arc<crate::k8s::leader_pod::LabelState>>,
}

type FleetSource = Box<dyn Fn() -> Fleet + Send + Sync>;

/// Phases in which a host's agent must be connected: a host in Maintenance
/// may be down for its work, one in Onboarding has none yet.
pub const AGENT_EXPECTED: [Phase; 4] = [Phase::Testing, Phase::Ready, Phase::Active, Phase::Evicting];

/// Every health state, in the order the metrics show them.
const HEALTH_STATES: [HealthState; 4] =
    [HealthState::Healthy, HealthState::Degraded, HealthState::Unreachable, HealthState::Failed];

/// The fleet in numbers, for alerts: Hypervisors per phase, and those that
/// should have an agent and have none.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fleet {
    pub phases: std::collections::BTreeMap<Phase, u64>,
    pub without_agent: u64,
    /// Hypervisors per health state (those judged at least once).
    pub health: std::collections::BTreeMap<HealthState, u64>,
}

/// Counts `hypervisors` (phase, agent connected, health).
pub fn fleet(hypervisors: impl IntoIterator<Item = (Phase, bool, Option<HealthState>)>) -> Fleet {
    let mut f = Fleet::default();
    for (phase, connected, health) in hypervisors {
        *f.phases.entry(phase).or_default() += 1;
        f.without_agent += u64::from(!connected && AGENT_EXPECTED.contains(&phase));
        if let Some(h) = health {
            *f.health.entry(h).or_default() += 1;
        }
    }
    f
}

impl Metrics {
    pub fn set_tls(&self, stats: Arc<hv_tls::server::Stats>) {
        let _ = self.tls.set(stats);
    }

    pub fn set_fleet(&self, source: impl Fn() -> Fleet + Send + Sync + 'static) {
        let _ = self.fleet.set(Box::new(source));
    }

    pub fn add(&self, t: &Tally) {
        self.started.fetch_add(t.started, Ordering::Relaxed);
        self.retried.fetch_add(t.retried, Ordering::Relaxed);
        self.aborted.fetch_add(t.aborted, Ordering::Relaxed);
        self.succeeded.fetch_add(t.succeeded, Ordering::Relaxed);
        self.non_migratable.fetch_add(t.non_migratable, Ordering::Relaxed);
        for d in &t.durations {
            let i = DURATION_BUCKETS.iter().position(|b| d <= b).unwrap_or(DURATION_BUCKETS.len());
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
            self.sum_ms.fetch_add((d * 1000.0) as u64, Ordering::Relaxed);
        }
    }

    pub fn render(&self) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut s = String::new();
        s.push_str("# HELP hv_coordinator_leader Whether this replica leads.\n");
        s.push_str("# TYPE hv_coordinator_leader gauge\n");
        s.push_str(&format!("hv_coordinator_leader {}\n", u8::from(self.leader.load(Ordering::Relaxed))));
        let counters = [
            ("started", "Migrations asked of Nova, retries included.", &self.started),
            ("retried", "Migration attempts after a VM's first.", &self.retried),
            ("aborted", "Abort requests sent to Nova (stuck or cancelled migrations).", &self.aborted),
            ("succeeded", "VMs migrated by an eviction.", &self.succeeded),
            ("non_migratable", "VMs given up on (attempts exhausted or incompatible).", &self.non_migratable),
        ];
        for (name, help, v) in counters {
            s.push_str(&format!("# HELP hv_eviction_migrations_{name}_total {help}\n"));
            s.push_str(&format!("# TYPE hv_eviction_migrations_{name}_total counter\n"));
            s.push_str(&format!("hv_eviction_migrations_{name}_total {}\n", get(v)));
        }
        let refused = "hv_coordinator_agent_sessions_refused_total";
        s.push_str(&format!(
            "# HELP {refused} Agent sessions refused: the client certificate named another node or none.\n"
        ));
        s.push_str(&format!("# TYPE {refused} counter\n{refused} {}\n", get(&self.agent_sessions_refused)));
        if let Some(tls) = self.tls.get() {
            let failed = "hv_coordinator_grpc_tls_handshakes_failed_total";
            s.push_str(&format!("# HELP {failed} gRPC TLS handshakes refused (no, expired or foreign client certificate) or timed out.\n"));
            s.push_str(&format!("# TYPE {failed} counter\n{failed} {}\n", get(&tls.handshakes_failed)));
            let open = "hv_coordinator_grpc_connections";
            s.push_str(&format!(
                "# HELP {open} gRPC connections open.\n# TYPE {open} gauge\n{open} {}\n",
                get(&tls.connections)
            ));
        }
        if let Some(source) = self.fleet.get().filter(|_| self.leader.load(Ordering::Relaxed)) {
            let f = source();
            s.push_str("# HELP hv_hypervisors Hypervisors per phase (shown by the leader only).\n");
            s.push_str("# TYPE hv_hypervisors gauge\n");
            for p in Phase::ALL {
                let n = f.phases.get(&p).copied().unwrap_or(0);
                s.push_str(&format!("hv_hypervisors{{phase=\"{}\"}} {n}\n", p.as_str()));
            }
            let w = "hv_hypervisors_without_agent";
            s.push_str(&format!(
                "# HELP {w} Hypervisors in Testing, Ready, Active or Evicting whose agent is not connected.\n"
            ));
            s.push_str(&format!("# TYPE {w} gauge\n{w} {}\n", f.without_agent));
            let h = "hv_hypervisors_by_health";
            s.push_str(&format!(
                "# HELP {h} Hypervisors per health state (docs/health.md).\n# TYPE {h} gauge\n"
            ));
            for state in HEALTH_STATES {
                let n = f.health.get(&state).copied().unwrap_or(0);
                s.push_str(&format!("{h}{{state=\"{state}\"}} {n}\n"));
            }
        }
        let t = "hv_health_transitions_total";
        s.push_str(&format!(
            "# HELP {t} Changes of a host's health, by the state entered.\n# TYPE {t} counter\n"
        ));
        for (i, state) in HEALTH_STATES.iter().enumerate() {
            s.push_str(&format!("{t}{{to=\"{state}\"}} {}\n", get(&self.health_transitions[i])));
        }
        let name = "hv_eviction_migration_duration_seconds";
        s.push_str(&format!("# HELP {name} From asking Nova to seeing the VM on its new host.\n"));
        s.push_str(&format!("# TYPE {name} histogram\n"));
        let mut cumulative = 0;
        for (i, b) in DURATION_BUCKETS.iter().enumerate() {
            cumulative += get(&self.buckets[i]);
            s.push_str(&format!("{name}_bucket{{le=\"{b}\"}} {cumulative}\n"));
        }
        cumulative += get(&self.buckets[DURATION_BUCKETS.len()]);
        s.push_str(&format!("{name}_bucket{{le=\"+Inf\"}} {cumulative}\n"));
        s.push_str(&format!("{name}_sum {}\n", get(&self.sum_ms) as f64 / 1000.0));
        s.push_str(&format!("{name}_count {cumulative}\n"));
        s
    }

    fn route(&self, req: &Request<Incoming>) -> Response<Full<Bytes>> {
        let (code, body) = self.answer(req.uri().path());
        hv_listen::text(code, body)
    }

    /// A host's health changed to `to`.
    pub fn health_changed(&self, to: HealthState) {
        if let Some(i) = HEALTH_STATES.iter().position(|s| *s == to) {
            self.health_transitions[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Readiness follows this replica's pod label from now on.
    pub fn set_pod_label(&self, state: Arc<crate::k8s::leader_pod::LabelState>) {
        let _ = self.pod_label.set(state);
    }

    /// `/healthz` is liveness: the process answers, whatever its peers do.
    /// `/readyz` is readiness (`k8s::leader_pod::readiness`): a replica whose
    /// pod label agrees with its role, or without pod labels only the
    /// leader (the kubelet's probes speak no TLS, so they cannot use the
    /// gRPC health service).
    fn answer(&self, path: &str) -> (StatusCode, String) {
        match path {
            "/metrics" => (StatusCode::OK, self.render()),
            "/healthz" => (StatusCode::OK, "ok\n".into()),
            "/readyz" => {
                let label = self.pod_label.get().map(|s| s.get());
                match crate::k8s::leader_pod::readiness(self.leader.load(Ordering::Relaxed), label) {
                    (true, why) => (StatusCode::OK, format!("{why}\n")),
                    (false, why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
                }
            }
            _ => (StatusCode::NOT_FOUND, "not found\n".into()),
        }
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` until the process ends; answers the bound address.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    hv_listen::serve(addr, hv_listen::Limits::default(), move |req| {
        let m = metrics.clone();
        async move { m.route(&req) }
    })
    .await
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::api::eviction::EvictionPhase;

    fn vm(id: &str, state: VmState, attempts: u32, started: Option<Timestamp>) -> VmStatus {
        VmStatus { id: id.into(), state, attempts, attempt_started: started.map(Time), ..Default::default() }
    }

    #[test]
    fn the_fleet_is_counted_by_phase_and_missing_agents_only_where_one_belongs() {
        let f = fleet([
            (Phase::Active, true, Some(HealthState::Healthy)),
            (Phase::Active, false, Some(HealthState::Unreachable)),
            (Phase::Maintenance, false, Some(HealthState::Failed)),
            (Phase::Onboarding, false, None),
            (Phase::Aborted, true, Some(HealthState::Healthy)),
            (Phase::Evicting, false, Some(HealthState::Unreachable)),
        ]);
        assert_eq!(f.health.get(&HealthState::Unreachable), Some(&2));
        assert_eq!(f.health.values().sum::<u64>(), 5, "a host never judged is not counted");
        assert_eq!(f.phases.get(&Phase::Active), Some(&2));
        assert_eq!(
            f.without_agent, 2,
            "Active and Evicting without an agent; Maintenance and Onboarding may be"
        );
        let m = Metrics::default();
        let snapshot = f.clone();
        m.set_fleet(move || snapshot.clone());
        assert!(!m.render().contains("hv_hypervisors{"), "a follower does not speak for the fleet");
        m.leader.store(true, Ordering::Relaxed);
        let text = m.render();
        assert!(text.contains("hv_hypervisors{phase=\"Active\"} 2\n"), "{text}");
        assert!(text.contains("hv_hypervisors{phase=\"Decommissioned\"} 0\n"), "every phase, zeros too");
        assert!(text.contains("hv_hypervisors_without_agent 2\n"));
        assert!(text.contains("hv_hypervisors_by_health{state=\"Unreachable\"} 2\n"), "{text}");
        assert!(text.contains("hv_hypervisors_by_health{state=\"Degraded\"} 0\n"), "every state, zeros too");
        m.health_changed(HealthState::Failed);
        m.health_changed(HealthState::Failed);
        assert!(m.render().contains("hv_health_transitions_total{to=\"Failed\"} 2\n"));
    }

    #[test]
    fn only_the_leader_is_ready_and_every_replica_is_alive() {
        let m = Metrics::default();
        assert_eq!(m.answer("/healthz").0, StatusCode::OK);
        assert_eq!(m.answer("/readyz"), (StatusCode::SERVICE_UNAVAILABLE, "follower\n".into()));
        m.leader.store(true, Ordering::Relaxed);
        assert_eq!(m.answer("/readyz"), (StatusCode::OK, "leader\n".into()));
        assert_eq!(m.answer("/healthz").0, StatusCode::OK);
        assert_eq!(m.answer("/nope").0, StatusCode::NOT_FOUND);
    }

    #[test]
    fn a_step_is_tallied_by_its_actions_and_its_state_changes() {
        let t0 = Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(1_800_000_000);
        let now = t0 + jiff::SignedDuration::from_secs(42);
        let before = [
            vm("a", VmState::Migrating, 1, Some(t0)),
            vm("b", VmState::Migrating, 2, Some(t0)),
            vm("c", VmState::Pending, 0, None),
            vm("d", VmState::Backoff, 1, None),
            vm("e", VmState::Pending, 0, None),
        ];
        let step = Step {
            phase: EvictionPhase::Migrating,
            vms: vec![
                vm("a", VmState::Migrated, 1, Some(t0)),
                vm("b", VmState::NonMigratable, 2, Some(t0)),
                vm("c", VmState::Migrating, 1, Some(now)),
                vm("d", VmState::Migrating, 2, Some(now)),
                // Moved by somebody else: not our success.
                vm("e", VmState::Migrated, 0, None),
            ],
            actions: vec![
                Action::Migrate { server_id: "c".into(), attempt: 1, live: true, block_migration: false },
                Action::Migrate { server_id: "d".into(), attempt: 2, live: true, block_migration: false },
                Action::Abort {
                    server_id: "x".into(),
                    attempt: 1,
                    nova_migration_id: Some(1),
                    why: "x".into(),
                },
            ],
        };
        let t = tally(&before, &step, now);
        assert_eq!(
            t,
            Tally {
                started: 2,
                retried: 1,
                aborted: 1,
                succeeded: 1,
                non_migratable: 1,
                durations: vec![42.0]
            }
        );
        // The same records again: nothing new.
        let again = Step { actions: vec![], ..step.clone() };
        assert_eq!(tally(&step.vms, &again, now), Tally::default());
    }

    #[test]
    fn the_text_format_has_cumulative_buckets() {
        let m = Metrics::default();
        m.add(&Tally { started: 3, succeeded: 2, durations: vec![4.0, 45.5], ..Tally::default() });
        m.add(&Tally { durations: vec![7200.0], ..Tally::default() });
        let s = m.render();
        for line in [
            "hv_eviction_migrations_started_total 3",
            "hv_eviction_migrations_succeeded_total 2",
            "hv_eviction_migrations_aborted_total 0",
            "hv_eviction_migration_duration_seconds_bucket{le=\"5\"} 1",
            "hv_eviction_migration_duration_seconds_bucket{le=\"30\"} 1",
            "hv_eviction_migration_duration_seconds_bucket{le=\"60\"} 2",
            "hv_eviction_migration_duration_seconds_bucket{le=\"3600\"} 2",
            "hv_eviction_migration_duration_seconds_bucket{le=\"+Inf\"} 3",
            "hv_eviction_migration_duration_seconds_sum 7249.5",
            "hv_eviction_migration_duration_seconds_count 3",
            "hv_coordinator_leader 0",
        ] {
            assert!(s.lines().any(|l| l == line), "missing {line:?} in\n{s}");
        }
    }
}
