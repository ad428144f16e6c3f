//! What an Eviction's status write tells, as Kubernetes Events: its phase
//! changes on the Eviction, each attempt's start and end on its Migration,
//! and the few an SRE watching the host must see also on the Node
//! (`kubectl describe node` is where a drain's operator looks). Pure: the
//! status before and after one write in, the Events out. Told once: a
//! write that changes nothing tells nothing, and a new leader that reads
//! the same status tells nothing again.

use crate::api::eviction::{EvictionPhase, EvictionStatus, VmState, VmStatus};
use crate::api::migration::migration_name;

/// Which object an Event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum About {
    Eviction,
    /// The Migration of that name (one attempt of one VM).
    Migration(String),
    /// The host's Node.
    Node,
}

/// One Event to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct News {
    pub about: About,
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

/// The Events that the write from `before` to `after` of the Eviction
/// `eviction` tells; `unmet` is what it waits on, or why it stopped. A dry
/// run's are told on itself only: it moves nothing, and its host's Node
/// has nothing to show.
pub fn news(
    eviction: &str,
    before: &EvictionStatus,
    after: &EvictionStatus,
    unmet: &str,
    dry_run: bool,
) -> Vec<News> {
    let mut out = phase_news(before, after, unmet);
    for vm in &after.vms {
        let was = before.vms.iter().find(|b| b.id == vm.id);
        out.extend(vm_news(eviction, was, vm));
    }
    if dry_run {
        out.retain(|n| n.about == About::Eviction);
    }
    out
}

fn phase_news(before: &EvictionStatus, after: &EvictionStatus, unmet: &str) -> Vec<News> {
    let (was, is) = (before.phase.unwrap_or_default(), after.phase.unwrap_or_default());
    if was == is {
        return vec![];
    }
    let host = after.host.as_deref().unwrap_or("the host");
    let progress = after.progress.as_deref().unwrap_or("0/0");
    let (warning, reason, note) = match is {
        EvictionPhase::Migrating => {
            (false, "EvictionStarted", format!("moving {} VMs off {host}", after.total))
        }
        EvictionPhase::Succeeded => (false, "EvictionSucceeded", format!("{host} emptied: {progress} moved")),
        EvictionPhase::Failed => (true, "EvictionFailed", format!("stopped with {progress} moved: {unmet}")),
        EvictionPhase::Cancelled => (false, "EvictionCancelled", format!("cancelled with {progress} moved")),
        EvictionPhase::Planned => {
            let note = format!("dry run: {}", after.progress.as_deref().unwrap_or("planned"));
            return vec![News { about: About::Eviction, warning: false, reason: "EvictionPlanned", note }];
        }
        EvictionPhase::Pending | EvictionPhase::Preflight | EvictionPhase::Disabling => return vec![],
    };
    let on = |about| News { about, warning, reason, note: note.clone() };
    vec![on(About::Eviction), on(About::Node)]
}

/// A VM's attempts, each told on its own Migration (named as the
/// eviction names them): its start, and how it ended.
fn vm_news(eviction: &str, was: Option<&VmStatus>, vm: &VmStatus) -> Vec<News> {
    let before = was.map(|w| w.state).unwrap_or_default();
    let old_attempt = was.map_or(0, |w| w.attempts);
    let who = if vm.name.is_empty() { vm.id.clone() } else { format!("{} ({})", vm.name, vm.id) };
    let attempt = |n: u32| About::Migration(migration_name(eviction, &vm.id, n));
    let mut out = vec![];
    if before == VmState::Migrating && (vm.state != VmState::Migrating || vm.attempts != old_attempt) {
        out.push(ended(attempt(old_attempt), &who, vm));
    }
    if vm.state == VmState::Migrating && (before != VmState::Migrating || vm.attempts != old_attempt) {
        let note = format!("{who}: attempt {} asked of Nova", vm.attempts);
        out.push(News { about: attempt(vm.attempts), warning: false, reason: "MigrationStarted", note });
    }
    if vm.state == VmState::External && was.is_none_or(|w| w.state != VmState::External) {
        let note = format!("{who}: {}", vm.reason);
        out.push(News { about: About::Eviction, warning: false, reason: "VmLeftToItsOwner", note });
    }
    if vm.state == VmState::NonMigratable && before != VmState::NonMigratable {
        let note = format!("{who} stays on the host: {}", vm.reason);
        for about in [About::Eviction, About::Node] {
            out.push(News { about, warning: true, reason: "VmNonMigratable", note: note.clone() });
        }
    }
    out
}

/// How the attempt in flight ended, on its Migration: a VM migrating
/// again under a new attempt had its earlier one fail.
fn ended(m: About, who: &str, vm: &VmStatus) -> News {
    let target = vm.target_host.as_deref().unwrap_or("another host");
    let (warning, reason, note) = match vm.state {
        VmState::Migrated => (false, "MigrationCompleted", format!("{who} now runs on {target}")),
        VmState::Gone => (false, "MigrationEnded", format!("{who} was deleted by its owner")),
        VmState::Skipped | VmState::External => (false, "MigrationEnded", format!("{who}: {}", vm.reason)),
        VmState::Backoff | VmState::Pending | VmState::NonMigratable | VmState::Migrating => {
            (true, "MigrationFailed", format!("{who}: {}", vm.reason))
        }
    };
    News { about: m, warning, reason, note }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The VM `u1`, at its attempt `attempt`.
    fn vm(state: VmState, attempt: u32) -> VmStatus {
        VmStatus { id: "u1".into(), name: "web".into(), state, attempts: attempt, ..Default::default() }
    }

    fn m(attempt: u32) -> About {
        About::Migration(format!("ev-u1-{attempt}"))
    }

    fn status(phase: EvictionPhase, vms: Vec<VmStatus>) -> EvictionStatus {
        EvictionStatus {
            phase: Some(phase),
            host: Some("node-a".into()),
            total: u32::try_from(vms.len()).unwrap(),
            progress: Some("1/1".into()),
            vms,
            ..Default::default()
        }
    }

    fn reasons(n: &[News]) -> Vec<(&'static str, About)> {
        n.iter().map(|n| (n.reason, n.about.clone())).collect()
    }

    #[test]
    fn nothing_changed_tells_nothing() {
        let s = status(EvictionPhase::Migrating, vec![vm(VmState::Migrating, 1)]);
        assert!(news("ev", &s, &s, "", false).is_empty());
    }

    #[test]
    fn the_phases_an_sre_waits_for_are_told_on_the_eviction_and_the_node() {
        let before = status(EvictionPhase::Disabling, vec![]);
        for (phase, reason, warning) in [
            (EvictionPhase::Migrating, "EvictionStarted", false),
            (EvictionPhase::Succeeded, "EvictionSucceeded", false),
            (EvictionPhase::Failed, "EvictionFailed", true),
            (EvictionPhase::Cancelled, "EvictionCancelled", false),
        ] {
            let n =
                news("ev", &before, &status(phase, vec![]), "Preflight (NoRoom): vm-1 fits nowhere", false);
            assert_eq!(reasons(&n), vec![(reason, About::Eviction), (reason, About::Node)], "{phase:?}");
            assert!(n.iter().all(|n| n.warning == warning));
        }
        let failed = news(
            "ev",
            &before,
            &status(EvictionPhase::Failed, vec![]),
            "Preflight (NoRoom): vm-1 fits nowhere",
            false,
        );
        assert!(failed[0].note.ends_with("vm-1 fits nowhere"), "{}", failed[0].note);
        assert!(news("ev", &status(EvictionPhase::Pending, vec![]), &before, "", false).is_empty());
    }

    #[test]
    fn an_attempt_is_told_on_its_migration_from_start_to_end() {
        let start = news(
            "ev",
            &status(EvictionPhase::Migrating, vec![vm(VmState::Pending, 0)]),
            &status(EvictionPhase::Migrating, vec![vm(VmState::Migrating, 1)]),
            "",
            false,
        );
        assert_eq!(reasons(&start), vec![("MigrationStarted", m(1))]);
        let mut done = vm(VmState::Migrated, 1);
        done.target_host = Some("node-b".into());
        let end = news(
            "ev",
            &status(EvictionPhase::Migrating, vec![vm(VmState::Migrating, 1)]),
            &status(EvictionPhase::Migrating, vec![done]),
            "",
            false,
        );
        assert_eq!(reasons(&end), vec![("MigrationCompleted", m(1))]);
        assert_eq!(end[0].note, "web (u1) now runs on node-b");
    }

    #[test]
    fn a_failed_attempt_warns_and_a_vm_given_up_is_told_on_the_node() {
        let mut failed = vm(VmState::Backoff, 1);
        failed.reason = "Nova: migration error".into();
        let n = news(
            "ev",
            &status(EvictionPhase::Migrating, vec![vm(VmState::Migrating, 1)]),
            &status(EvictionPhase::Migrating, vec![failed.clone()]),
            "",
            false,
        );
        assert_eq!(reasons(&n), vec![("MigrationFailed", m(1))]);
        assert!(n[0].warning);
        let mut given_up = failed;
        given_up.state = VmState::NonMigratable;
        let n = news(
            "ev",
            &status(EvictionPhase::Migrating, vec![vm(VmState::Backoff, 1)]),
            &status(EvictionPhase::Migrating, vec![given_up]),
            "",
            false,
        );
        assert_eq!(reasons(&n), vec![("VmNonMigratable", About::Eviction), ("VmNonMigratable", About::Node)]);
    }

    #[test]
    fn a_new_attempt_ends_the_old_one_and_starts_its_own() {
        let mut again = vm(VmState::Migrating, 2);
        again.reason = "Nova: error".into();
        let n = news(
            "ev",
            &status(EvictionPhase::Migrating, vec![vm(VmState::Migrating, 1)]),
            &status(EvictionPhase::Migrating, vec![again]),
            "",
            false,
        );
        assert_eq!(reasons(&n), vec![("MigrationFailed", m(1)), ("MigrationStarted", m(2))]);
    }

    #[test]
    fn a_dry_run_is_told_on_itself_only() {
        let before = status(EvictionPhase::Pending, vec![]);
        for phase in [EvictionPhase::Planned, EvictionPhase::Failed, EvictionPhase::Cancelled] {
            let n =
                news("ev", &before, &status(phase, vec![]), "Target (UnknownHypervisor): no such host", true);
            assert!(!n.is_empty() && n.iter().all(|n| n.about == About::Eviction), "{phase:?}: {n:?}");
        }
    }
}
