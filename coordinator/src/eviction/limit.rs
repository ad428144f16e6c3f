//! The cluster-wide migration limit (`--cluster-max-migrations`) as one
//! object the leader owns, and beside it the evacuations' own
//! (`--cluster-max-evacuations`).
//!
//! Counting free slots from the Migration cache in each Eviction's
//! reconcile is not atomic: Evictions created together all see the same
//! free slots and start that many each. Here every grant happens under one
//! lock: an Eviction says how many migrations it has in flight and how many
//! more it would start, and gets at most what the others leave. What it was
//! granted counts as held until its next reconcile reports its real number
//! in flight (the attempts are recorded in its status before Nova is asked),
//! so the total in flight never exceeds the limit.
//!
//! A new leader seeds it from every Eviction's status before any reconcile
//! runs, so migrations started by the previous leader count from the start.

use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Debug)]
pub struct ClusterLimit {
    max: u32,
    /// Migrations each Eviction holds: in flight, plus granted and not yet
    /// seen in flight.
    held: Mutex<HashMap<String, u32>>,
}

impl ClusterLimit {
    pub fn new(max: u32) -> ClusterLimit {
        ClusterLimit { max, held: Mutex::new(HashMap::new()) }
    }

    fn with<R>(&self, f: impl FnOnce(&mut HashMap<String, u32>) -> R) -> R {
        f(&mut crate::locked::lock(&self.held))
    }

    /// What the previous leader left in flight, per Eviction.
    pub fn seed(&self, in_flight: impl IntoIterator<Item = (String, u32)>) {
        self.with(|held| {
            held.clear();
            held.extend(in_flight.into_iter().filter(|(_, n)| *n > 0));
        });
    }

    /// Eviction `name` has `in_flight` migrations and would start `want`
    /// more: how many it may start now.
    pub fn grant(&self, name: &str, in_flight: u32, want: u32) -> u32 {
        self.with(|held| {
            let others: u32 = held.iter().filter(|(n, _)| n.as_str() != name).map(|(_, c)| *c).sum();
            let free = self.max.saturating_sub(others).saturating_sub(in_flight);
            let granted = want.min(free);
            let mine = in_flight.saturating_add(granted);
            if mine == 0 {
                held.remove(name);
            } else {
                held.insert(name.to_string(), mine);
            }
            granted
        })
    }

    /// The Eviction is over (or gone): it holds nothing.
    pub fn release(&self, name: &str) {
        self.with(|held| {
            held.remove(name);
        });
    }

    /// Migrations held across the cluster (for tests and metrics).
    pub fn held(&self) -> u32 {
        self.with(|held| held.values().sum())
    }
}

/// The region's two budgets, apart: planned migrations
/// (`--cluster-max-migrations`) and evacuations of fenced hosts
/// (`--cluster-max-evacuations`), so an evacuation never waits for the
/// slots of planned evictions, however many run.
#[derive(Debug)]
pub struct Budgets {
    pub migrations: ClusterLimit,
    pub evacuations: ClusterLimit,
}

impl Budgets {
    pub fn new(migrations: u32, evacuations: u32) -> Budgets {
        Budgets { migrations: ClusterLimit::new(migrations), evacuations: ClusterLimit::new(evacuations) }
    }

    /// Eviction `name` has `in_flight` attempts and would start `want`
    /// more, from the evacuations' budget when it evacuates: how many it
    /// may start now. What it held in the other budget is given back.
    pub fn grant(&self, name: &str, evacuating: bool, in_flight: u32, want: u32) -> u32 {
        let (mine, other) = match evacuating {
            true => (&self.evacuations, &self.migrations),
            false => (&self.migrations, &self.evacuations),
        };
        other.release(name);
        mine.grant(name, in_flight, want)
    }

    /// What the previous leader left in flight: per Eviction, its attempts
    /// and whether it evacuates.
    pub fn seed(&self, in_flight: impl IntoIterator<Item = (String, u32, bool)>) {
        let (evacuating, migrating): (Vec<_>, Vec<_>) = in_flight.into_iter().partition(|(_, _, e)| *e);
        self.migrations.seed(migrating.into_iter().map(|(n, c, _)| (n, c)));
        self.evacuations.seed(evacuating.into_iter().map(|(n, c, _)| (n, c)));
    }

    /// The Eviction is over (or gone): it holds nothing in either.
    pub fn release(&self, name: &str) {
        self.migrations.release(name);
        self.evacuations.release(name);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn evictions_reconciled_together_never_start_more_than_the_limit() {
        // Five Evictions created at once, maxParallel 2 each, limit 5: the
        // old per-reconcile count let each of them start 2 (10 in flight).
        let limit = ClusterLimit::new(5);
        let grants: Vec<u32> = (0..5).map(|i| limit.grant(&format!("ev-{i}"), 0, 2)).collect();
        assert_eq!(grants.iter().sum::<u32>(), 5, "{grants:?}");
        assert_eq!(grants, [2, 2, 1, 0, 0]);
        // ev-0 finishes one; its next reconcile reports 1 in flight and
        // wants 1 more: the slot it freed is its own again.
        assert_eq!(limit.grant("ev-0", 1, 1), 1);
        assert_eq!(limit.held(), 5);
        limit.release("ev-1");
        assert_eq!(limit.grant("ev-3", 0, 2), 2);
        assert_eq!(limit.held(), 5);
    }

    #[test]
    fn a_new_leader_counts_what_the_old_one_left_in_flight() {
        let limit = ClusterLimit::new(5);
        limit.seed([("old-a".to_string(), 3), ("old-b".to_string(), 2), ("idle".to_string(), 0)]);
        assert_eq!(limit.grant("new", 0, 2), 0, "the previous leader's five are still moving");
        assert_eq!(limit.grant("old-a", 1, 0), 0);
        assert_eq!(limit.grant("new", 0, 2), 2);
    }

    #[test]
    fn concurrent_grants_hold_the_limit() {
        let limit = Arc::new(ClusterLimit::new(7));
        let start = Arc::new(std::sync::Barrier::new(16));
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let (l, start) = (limit.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    l.grant(&format!("ev-{i}"), 0, 3)
                })
            })
            .collect();
        let total: u32 = handles.into_iter().map(|h| h.join().unwrap_or(0)).sum();
        assert_eq!(total, 7, "all slots granted, none twice");
        assert_eq!(limit.held(), 7);
    }

    #[test]
    fn evacuations_have_their_own_budget_and_an_eviction_holds_in_one_only() {
        let b = Budgets::new(2, 3);
        assert_eq!(b.grant("planned-1", false, 0, 5), 2, "the migrations' budget");
        assert_eq!(b.grant("planned-2", false, 0, 5), 0, "spent");
        assert_eq!(b.grant("node-ha-1", true, 0, 5), 3, "evacuations do not wait for planned evictions");
        assert_eq!(b.grant("node-ha-2", true, 0, 5), 0, "their own budget spent");
        // An Eviction whose host gets fenced moves to the evacuations'.
        assert_eq!(b.grant("planned-1", true, 0, 1), 0);
        assert_eq!(b.grant("planned-2", false, 0, 5), 2, "what planned-1 held is given back");
        b.release("node-ha-1");
        assert_eq!(b.grant("node-ha-2", true, 0, 5), 3);
        assert_eq!((b.migrations.held(), b.evacuations.held()), (2, 3));
        b.seed([("a".to_string(), 1, false), ("b".to_string(), 2, true), ("c".to_string(), 0, true)]);
        assert_eq!((b.migrations.held(), b.evacuations.held()), (1, 2));
    }
}
