//! Evictions in numbers: migrations asked, their outcomes (retried,
//! aborted, done, given up), how long each took, and the Evictions by phase.
//!
//! The counters are derived from each eviction step by a pure [`tally`]
//! and added only once the step's status write succeeded, so a step that is
//! computed again after a failed write is not counted twice. The outcomes
//! are one family with an `outcome` label; the separate
//! `hv_eviction_migrations_{retried,aborted,succeeded,non_migratable}_total`
//! families say the same and stay for one release (deprecated,
//! docs/metrics.md). The phases are counted from the Eviction cache at each
//! scrape, by the leader only.

use jiff::Timestamp;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::api::EvictionPhase;
use crate::api::eviction::{VmState, VmStatus};
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
            // Forces are counted once Nova took them ([`Evictions::forced`]).
            Action::ConfirmResize { .. }
            | Action::Start { .. }
            | Action::Mark { .. }
            | Action::Unmark { .. }
            | Action::ForceComplete { .. } => {}
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: &'static str,
}

/// The outcomes a step records of a VM's migrations, as labelled: an
/// attempt after a failed, aborted or unsent one (`retried`), an abort asked
/// of Nova, a VM moved, a VM given up on, a stuck live migration Nova was
/// asked to force to complete.
pub const OUTCOMES: [&str; 5] = ["succeeded", "retried", "aborted", "non_migratable", "forced"];

/// The eviction families.
pub struct Evictions {
    started: Counter,
    retried: Counter,
    aborted: Counter,
    succeeded: Counter,
    non_migratable: Counter,
    outcomes: Family<OutcomeLabel, Counter>,
    duration: Histogram,
    phases: Family<PhaseLabel, Gauge>,
}

impl Evictions {
    pub(super) fn register(registry: &mut Registry) -> Evictions {
        let e = Evictions {
            started: Counter::default(),
            retried: Counter::default(),
            aborted: Counter::default(),
            succeeded: Counter::default(),
            non_migratable: Counter::default(),
            outcomes: Family::default(),
            duration: Histogram::new(DURATION_BUCKETS),
            phases: Family::default(),
        };
        let deprecated = "Deprecated: hv_eviction_migration_outcomes_total{outcome} says the same";
        let counters = [
            ("started", "Migrations asked of Nova, retries included.".to_string(), &e.started),
            ("retried", format!("Migration attempts after a VM's first. {deprecated}."), &e.retried),
            (
                "aborted",
                format!("Abort requests sent to Nova (stuck or cancelled migrations). {deprecated}."),
                &e.aborted,
            ),
            ("succeeded", format!("VMs migrated by an eviction. {deprecated}."), &e.succeeded),
            (
                "non_migratable",
                format!("VMs given up on (attempts exhausted or incompatible). {deprecated}."),
                &e.non_migratable,
            ),
        ];
        for (name, help, c) in counters {
            registry.register(format!("hv_eviction_migrations_{name}"), help, c.clone());
        }
        registry.register(
            "hv_eviction_migration_outcomes",
            "Outcomes of the evictions' migrations: succeeded (a VM moved), retried (an attempt after a failed, \
             aborted or unsent one), aborted (an abort asked of Nova), non_migratable (a VM given up on), \
             forced (a stuck live migration whose force to complete Nova took).",
            e.outcomes.clone(),
        );
        for outcome in OUTCOMES {
            let _ = e.outcomes.get_or_create(&OutcomeLabel { outcome });
        }
        registry.register(
            "hv_eviction_migration_duration_seconds",
            "From asking Nova to seeing the VM on its new host.",
            e.duration.clone(),
        );
        registry.register(
            "hv_evictions",
            "Evictions per phase, every phase (shown by the leader only).",
            e.phases.clone(),
        );
        e
    }

    /// Shows the Evictions' `phases`, every phase with zeros too; `None` (a
    /// follower) shows no sample.
    pub(super) fn show(&self, phases: Option<Vec<EvictionPhase>>) {
        self.phases.clear();
        let Some(phases) = phases else { return };
        for p in EvictionPhase::ALL {
            let n = phases.iter().filter(|x| **x == p).count();
            self.phases
                .get_or_create(&PhaseLabel { phase: p.as_str() })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// A stuck live migration Nova took the ask to force to complete.
    pub fn forced(&self) {
        self.outcomes.get_or_create(&OutcomeLabel { outcome: "forced" }).inc();
    }

    pub fn add(&self, t: &Tally) {
        self.started.inc_by(t.started);
        self.retried.inc_by(t.retried);
        self.aborted.inc_by(t.aborted);
        self.succeeded.inc_by(t.succeeded);
        self.non_migratable.inc_by(t.non_migratable);
        let outcomes = [t.succeeded, t.retried, t.aborted, t.non_migratable, 0];
        for (outcome, n) in OUTCOMES.into_iter().zip(outcomes) {
            self.outcomes.get_or_create(&OutcomeLabel { outcome }).inc_by(n);
        }
        for d in &t.durations {
            self.duration.observe(*d);
        }
    }
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
}
