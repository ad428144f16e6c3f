//! The fleet view every Hypervisor reconcile shares (docs/nova.md, "The
//! fleet view"): one [`FleetSnapshot`] at a time, read again once it is
//! older than its bound, by one reconcile while the others wait for it.
//!
//! The view only ever confirms: a reconcile whose host it may stand for
//! ([`may_share`]) and whose decision and status it leaves unchanged asks
//! Nova nothing of its own; anything else (an action, a transition, a
//! status that would change, a host the lists cannot tell) is decided on
//! the host's own fresh reads. A host read fresh is not answered from a
//! snapshot that began before that read, so the view never takes back what
//! a fresher read saw.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Nova;
use super::fleet::FleetSnapshot;
use crate::api::Phase;
use crate::api::hypervisor::HealthState;
use crate::lifecycle::NovaObs;

/// Whether the fleet view may stand for a host in this reconcile: only in
/// the settled phases, where a reconcile is a drift check, and never where
/// the host is on its way out or being fenced, which act on what Nova says
/// at once. Pure.
pub fn may_share(phase: Phase, deleting: bool, fenced: bool, health: Option<HealthState>) -> bool {
    let settled =
        matches!(phase, Phase::Active | Phase::Maintenance | Phase::Decommissioned | Phase::Aborted);
    settled && !deleting && !fenced && health != Some(HealthState::Failed)
}

/// The shared view (see the module doc).
pub struct FleetView {
    max_age: Duration,
    /// After a failed read, how long reconciles go to their own reads
    /// before the fleet is read again.
    retry: Duration,
    /// Held while the fleet is read: one read at a time.
    reading: tokio::sync::Mutex<()>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    snapshot: Option<Arc<FleetSnapshot>>,
    failed: Option<Instant>,
    /// When each host's own reads last began.
    fresh: HashMap<String, Instant>,
}

impl FleetView {
    pub fn new(max_age: Duration, retry: Duration) -> FleetView {
        FleetView {
            max_age,
            retry,
            reading: tokio::sync::Mutex::new(()),
            state: Mutex::new(State::default()),
        }
    }

    /// The host as the fleet view shows it, reading the fleet again when the
    /// snapshot is older than the bound; None when the view cannot stand for
    /// the host (no snapshot, the host read fresh since, or the lists cannot
    /// tell). `fleet_traits` names every custom trait of the fleet, asked
    /// only when the fleet is read.
    pub async fn host(
        &self,
        nova: &dyn Nova,
        host: &str,
        wanted_aggregates: &[String],
        traits: &BTreeSet<String>,
        fleet_traits: impl FnOnce() -> BTreeSet<String>,
    ) -> Option<NovaObs> {
        let snapshot = self.snapshot(nova, fleet_traits).await?;
        let fresh = self.lock().fresh.get(host).copied();
        if fresh.is_some_and(|f| f >= snapshot.started) {
            return None;
        }
        snapshot.host(host, wanted_aggregates, traits)
    }

    /// The host's own fresh reads, remembered so that no older snapshot
    /// answers for it afterwards.
    pub async fn fresh(&self, nova: &dyn Nova, host: &str, wanted_aggregates: &[String]) -> NovaObs {
        self.lock().fresh.insert(host.to_string(), Instant::now());
        nova.observe(host, wanted_aggregates).await
    }

    /// The current snapshot, or a new one when it is too old; None while
    /// Nova cannot be read (the reconciles then read their hosts).
    async fn snapshot(
        &self,
        nova: &dyn Nova,
        fleet_traits: impl FnOnce() -> BTreeSet<String>,
    ) -> Option<Arc<FleetSnapshot>> {
        if let Some(s) = self.current() {
            return Some(s);
        }
        let _reading = self.reading.lock().await;
        // Another reconcile may have read it while this one waited.
        if let Some(s) = self.current() {
            return Some(s);
        }
        if self.lock().failed.is_some_and(|f| f.elapsed() < self.retry) {
            return None;
        }
        match nova.fleet(&fleet_traits()).await {
            Ok(s) => {
                tracing::debug!(hosts = s.hosts(), requests = s.requests, took = ?s.started.elapsed(), "fleet read");
                let s = Arc::new(s);
                let mut state = self.lock();
                state.snapshot = Some(s.clone());
                state.failed = None;
                Some(s)
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the fleet from Nova and Placement failed; hosts are read one by one");
                self.lock().failed = Some(Instant::now());
                None
            }
        }
    }

    fn current(&self) -> Option<Arc<FleetSnapshot>> {
        self.lock().snapshot.clone().filter(|s| s.started.elapsed() < self.max_age)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_stands_only_for_settled_hosts_not_on_their_way_out() {
        use HealthState::*;
        use Phase::*;
        // (phase, deleting, fenced, health) -> may share
        let rows = [
            ((Active, false, false, Some(Healthy)), true),
            ((Active, false, false, Some(Degraded)), true),
            ((Active, false, false, Some(Unreachable)), true),
            ((Active, false, false, Some(Failed)), false),
            ((Active, true, false, Some(Healthy)), false),
            ((Active, false, true, Some(Healthy)), false),
            ((Maintenance, false, false, None), true),
            ((Maintenance, false, true, None), false),
            ((Decommissioned, false, false, None), true),
            ((Decommissioned, true, false, None), false),
            ((Aborted, false, false, None), true),
            ((Initial, false, false, None), false),
            ((Onboarding, false, false, None), false),
            ((Testing, false, false, Some(Healthy)), false),
            ((Ready, false, false, Some(Healthy)), false),
            ((Evicting, false, false, Some(Healthy)), false),
        ];
        for ((phase, deleting, fenced, health), expect) in rows {
            assert_eq!(
                may_share(phase, deleting, fenced, health),
                expect,
                "{phase:?} deleting={deleting} fenced={fenced} {health:?}"
            );
        }
    }
}
