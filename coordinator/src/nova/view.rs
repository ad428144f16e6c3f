//! The fleet view every Hypervisor reconcile shares (docs/nova.md, "The
//! fleet view"): one [`FleetSnapshot`] at a time, read again by one
//! reconcile before it is older than its bound, while the others go on
//! with the current one; they wait only when no snapshot within the bound
//! is left.
//!
//! The view only ever confirms: a reconcile whose host it may stand for
//! ([`may_share`]) and whose decision and status it leaves unchanged asks
//! Nova nothing of its own; anything else (an action, a transition, a
//! status that would change, a host the lists cannot tell) is decided on
//! the host's own fresh reads. A host read fresh is not answered from a
//! snapshot that began before that read, so the view never takes back what
//! a fresher read saw; while a read of the fleet is under way, such a host
//! waits for one begun after its own read rather than reading it again.
//!
//! A host whose Eviction runs is not settled: it reads its own host at
//! each reconcile, and an Eviction wakes it only when its phase changes
//! (`k8s::triggers`), not at each VM moved.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Nova;
use super::snapshot::FleetSnapshot;
use crate::api::Phase;
use crate::api::hypervisor::HealthState;
use crate::lifecycle::NovaObs;

/// Whether the fleet view may stand for a host in this reconcile: only in
/// the settled phases, where a reconcile is a drift check (not while an
/// Eviction of the host runs: the reconcile is then one of its steps, and
/// the first one a transition the view cannot confirm), and never where
/// the host is on its way out, fenced, or anything but Healthy with its
/// agent connected where it is judged: a lost host's verdict may turn on
/// what Nova says of its nova-compute now (Failed, and fenced, once Nova
/// sees it down too). Pure.
pub fn may_share(
    phase: Phase,
    deleting: bool,
    fenced: bool,
    health: Option<HealthState>,
    agent_connected: bool,
    evicting: bool,
) -> bool {
    let settled =
        matches!(phase, Phase::Active | Phase::Maintenance | Phase::Decommissioned | Phase::Aborted);
    settled && !evicting && steady(phase, deleting, fenced, health, agent_connected)
}

/// Neither on its way out nor fenced, and Healthy with its agent connected
/// where its health is judged.
fn steady(
    phase: Phase,
    deleting: bool,
    fenced: bool,
    health: Option<HealthState>,
    agent_connected: bool,
) -> bool {
    let judged = crate::lifecycle::expects_agent(phase);
    let well = match health {
        None => !judged,
        Some(h) => h == HealthState::Healthy && (agent_connected || !judged),
    };
    !deleting && !fenced && well
}

/// Longest pause between reads of the fleet while they keep failing.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// While reads of the fleet fail, the last snapshot still confirms hosts
/// up to this many times the bound after its read began (5 min at the
/// default 30 s). Falling back at once to every host's own reads would turn a
/// Nova too slow for the fleet's lists into one drowned by thousands of
/// small reads. The snapshot only ever confirms: anything it would change
/// is still read on the host's own. Past this age hosts read their own, and
/// a Nova that answers nothing shows in their conditions.
const STALE_FACTOR: u32 = 10;

/// A new read of the fleet begins once the snapshot's age plus this many
/// times the last read's duration reaches the bound, so that it ends before
/// the bound even if it takes twice as long as the last; and not before
/// half the bound, so at most two reads begin per bound. A read begun only
/// at the bound would hold every reconcile (all their turns) for as long
/// as it takes.
const AHEAD: u32 = 2;

/// A read slower than the bound still stands for the bound divided by
/// this after it ends. Without it, only the reconciles that waited for such
/// a read could take it: every reconcile after them found it too old and
/// waited for the next, so a fleet whose read outlasts the bound was
/// reconciled one batch of turns per read. Nothing is changed in Nova on
/// the snapshot alone, so its age delays noticing a change (a repair, or a
/// VM forced onto a held host: docs/status.md), it never causes a write.
const SLOW_READ_STANDS: u32 = 2;

/// The shared view (see the module doc).
pub struct FleetView {
    /// Zero: the view is off, every reconcile reads its own host.
    max_age: Duration,
    /// After a failed read, how long reconciles go to their own reads
    /// before the fleet is read again; doubled after each failure in a row.
    retry: Duration,
    /// Held while the fleet is read: one read at a time.
    reading: tokio::sync::Mutex<()>,
    state: Mutex<State>,
}

/// The view in numbers ([`FleetView::figures`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ViewFigures {
    pub bound: Duration,
    /// None before the first good read.
    pub age: Option<Duration>,
    pub last_read: Option<Duration>,
    pub failures: u32,
}

#[derive(Default)]
struct State {
    snapshot: Option<Arc<FleetSnapshot>>,
    /// When the current snapshot's read finished, and how long it took.
    done: Option<Instant>,
    took: Duration,
    /// Failed reads in a row, and when the last one failed.
    failures: u32,
    failed: Option<Instant>,
    /// When each host's own reads last began.
    fresh: HashMap<String, Instant>,
    /// When a reconcile last asked for the view.
    asked: Option<Instant>,
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
    /// the host (the view off, no snapshot, the host read fresh since, or
    /// the lists cannot tell). `fleet_traits` names every custom trait of
    /// the fleet, asked only when the fleet is read.
    pub async fn host(
        &self,
        nova: &dyn Nova,
        host: &str,
        wanted_aggregates: &[String],
        traits: &BTreeSet<String>,
        fleet_traits: impl Fn() -> BTreeSet<String>,
    ) -> Option<NovaObs> {
        let snapshot = self.snapshot(nova, &fleet_traits).await?;
        let own = self.lock().fresh.get(host).copied();
        let snapshot = match own {
            Some(own) if own >= snapshot.started => self.begun_after(own, nova, &fleet_traits).await?,
            _ => snapshot,
        };
        snapshot.host(host, wanted_aggregates, traits)
    }

    /// A snapshot whose read began after `own` (when the host's own read
    /// began), while a read of the fleet is under way: that read once it
    /// ends if it began after, else the next, read now if due as any
    /// reconcile does; None when no read is under way or none begun after
    /// answers. Without the wait, a host read on its own (its first
    /// moments, a change) was read on its own again at each look for as
    /// long as reads of the fleet run back to back, as they do when one
    /// takes half the bound or more: each began before the host's last own
    /// read. A host waits here for at most two reads of the fleet.
    async fn begun_after(
        &self,
        own: Instant,
        nova: &dyn Nova,
        fleet_traits: impl Fn() -> BTreeSet<String>,
    ) -> Option<Arc<FleetSnapshot>> {
        let after = |s: Arc<FleetSnapshot>| Some(s).filter(|s| s.started > own);
        if self.reading.try_lock().is_ok() {
            return None;
        }
        drop(self.reading.lock().await);
        if let Some(s) = self.current(None).and_then(after) {
            return Some(s);
        }
        self.snapshot(nova, fleet_traits).await.and_then(after)
    }

    /// What an SRE watches of the view (`/metrics`): its bound, its
    /// snapshot's age (from its read's start; only while reconciles ask for
    /// the view, since it is read only then), how long the last good read
    /// took, and the failed reads in a row. None while the view is off.
    pub fn figures(&self) -> Option<ViewFigures> {
        if self.max_age.is_zero() {
            return None;
        }
        let state = self.lock();
        Some(ViewFigures {
            bound: self.max_age,
            age: state
                .snapshot
                .as_ref()
                .filter(|_| state.asked.is_some_and(|a| a.elapsed() < self.max_age))
                .map(|s| s.started.elapsed()),
            last_read: state.done.map(|_| state.took),
            failures: state.failures,
        })
    }

    /// How many hosts' own reads are remembered (the shell's tests).
    #[cfg(test)]
    pub fn hosts_read_on_their_own(&self) -> usize {
        self.lock().fresh.len()
    }

    /// The host's own fresh read, remembered (when it began) so that no
    /// older snapshot answers for it afterwards.
    pub async fn fresh(&self, nova: &dyn Nova, host: &str, wanted_aggregates: &[String]) -> NovaObs {
        self.lock().fresh.insert(host.to_string(), Instant::now());
        nova.observe(host, wanted_aggregates).await
    }

    /// The current snapshot (one reconcile reading the next ahead of the
    /// bound, [`AHEAD`]), or a new one when it is too old; while Nova
    /// cannot be read, the last one if young enough (`last_resort`), else
    /// None (the reconciles then read their hosts). A
    /// reconcile that waited for another's read takes that read, however
    /// long it took: a read slower than the bound must not make every
    /// waiter read the fleet again in turn.
    async fn snapshot(
        &self,
        nova: &dyn Nova,
        fleet_traits: impl FnOnce() -> BTreeSet<String>,
    ) -> Option<Arc<FleetSnapshot>> {
        if self.max_age.is_zero() {
            return None;
        }
        self.lock().asked = Some(Instant::now());
        if let Some(s) = self.current(None) {
            // Due for a new read: the first to see it reads; the others
            // (and this one, should the read fail) take the current one.
            if self.due(&s)
                && let Ok(_reading) = self.reading.try_lock()
            {
                // Another's read may have ended between the two looks.
                match self.current(None) {
                    Some(now) if self.due(&now) => return self.read(nova, fleet_traits).await.or(Some(now)),
                    Some(now) => return Some(now),
                    None => return self.read(nova, fleet_traits).await,
                }
            }
            return Some(s);
        }
        let asked = Instant::now();
        let _reading = self.reading.lock().await;
        if let Some(s) = self.current(Some(asked)) {
            return Some(s);
        }
        self.read(nova, fleet_traits).await
    }

    /// Whether `snapshot`, within the bound, is due to be read again
    /// ([`AHEAD`]).
    fn due(&self, snapshot: &FleetSnapshot) -> bool {
        let took = self.lock().took;
        let age = snapshot.started.elapsed();
        age >= self.max_age / 2 && age + took.saturating_mul(AHEAD) >= self.max_age
    }

    /// Reads the fleet (the caller holds `reading`), unless a failed read
    /// asks for a pause: the new snapshot, or while reads fail the last
    /// one if young enough (`last_resort`).
    async fn read(
        &self,
        nova: &dyn Nova,
        fleet_traits: impl FnOnce() -> BTreeSet<String>,
    ) -> Option<Arc<FleetSnapshot>> {
        {
            let state = self.lock();
            let pause = backoff(self.retry, state.failures);
            if state.failed.is_some_and(|f| f.elapsed() < pause) {
                return self.last_resort(&state);
            }
        }
        let began = Instant::now();
        match nova.fleet(&fleet_traits()).await {
            Ok(s) => {
                let took = began.elapsed();
                tracing::debug!(hosts = s.hosts(), requests = s.requests, ?took, "fleet read");
                // A snapshot is `took` old when its read ends: at half the
                // bound or more, the next read is due at once.
                if took.saturating_mul(2) >= self.max_age {
                    tracing::warn!(?took, bound = ?self.max_age,
                        "reading the fleet takes half the view's bound or more: it is read again \
                         as soon as a read ends, and a read longer than the bound stands for half \
                         the bound after it ends; a longer --nova-view-max-age spares Nova");
                }
                let s = Arc::new(s);
                let mut state = self.lock();
                (state.snapshot, state.done, state.took) = (Some(s.clone()), Some(Instant::now()), took);
                (state.failures, state.failed) = (0, None);
                // A host's own read older than this snapshot no longer keeps
                // the view from it, and a deleted host's is never asked again.
                let started = s.started;
                state.fresh.retain(|_, f| *f >= started);
                Some(s)
            }
            Err(e) => {
                let mut state = self.lock();
                state.failures = state.failures.saturating_add(1);
                state.failed = Some(Instant::now());
                let pause = backoff(self.retry, state.failures);
                let last = self.last_resort(&state);
                tracing::warn!(error = %e, failures = state.failures, next_in = ?pause,
                    last_read_age = ?state.snapshot.as_ref().map(|s| s.started.elapsed()),
                    confirming = last.is_some(),
                    "reading the fleet from Nova and Placement failed; the last read confirms hosts meanwhile \
                     while it is young enough, else hosts are read one by one");
                last
            }
        }
    }

    /// The snapshot if it is within the bound, or ended within half the
    /// bound ([`SLOW_READ_STANDS`]), or (`waited_since`) if its read
    /// finished after the caller began to wait for one.
    fn current(&self, waited_since: Option<Instant>) -> Option<Arc<FleetSnapshot>> {
        let state = self.lock();
        let young = state.snapshot.as_ref().is_some_and(|s| s.started.elapsed() < self.max_age)
            || state.done.is_some_and(|d| d.elapsed() < self.max_age / SLOW_READ_STANDS);
        let waited = waited_since.is_some_and(|w| state.done.is_some_and(|d| d >= w));
        state.snapshot.clone().filter(|_| young || waited)
    }

    /// The last snapshot while reads of the fleet fail, if it is younger
    /// than [`STALE_FACTOR`] times the bound.
    fn last_resort(&self, state: &State) -> Option<Arc<FleetSnapshot>> {
        let limit = self.max_age.saturating_mul(STALE_FACTOR);
        state.snapshot.clone().filter(|s| s.started.elapsed() < limit)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::locked::lock(&self.state)
    }
}

/// The pause after `failures` failed reads in a row: `retry`, doubled
/// after each, at most [`MAX_BACKOFF`].
fn backoff(retry: Duration, failures: u32) -> Duration {
    let doubled = retry.saturating_mul(1u32 << failures.saturating_sub(1).min(16));
    doubled.min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_reads_back_off_doubling_to_five_minutes() {
        let r = Duration::from_secs(10);
        let pauses: Vec<u64> = (1..=7).map(|f| backoff(r, f).as_secs()).collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(backoff(r, 1000), MAX_BACKOFF);
    }

    #[test]
    fn the_view_stands_only_for_settled_hosts_not_on_their_way_out() {
        use HealthState::*;
        use Phase::*;
        // (phase, deleting, fenced, health, agent, evicting) -> may share
        let rows = [
            ((Active, false, false, Some(Healthy), true, false), true),
            ((Active, false, false, Some(Healthy), false, false), false),
            ((Active, false, false, None, true, false), false),
            ((Active, false, false, Some(Degraded), true, false), false),
            ((Active, false, false, Some(Unreachable), true, false), false),
            ((Active, false, false, Some(Failed), true, false), false),
            ((Active, true, false, Some(Healthy), true, false), false),
            ((Active, false, true, Some(Healthy), true, false), false),
            ((Maintenance, false, false, None, false, false), true),
            ((Maintenance, false, true, None, false, false), false),
            ((Maintenance, false, false, Some(Failed), false, false), false),
            ((Decommissioned, false, false, None, false, false), true),
            ((Decommissioned, true, false, None, false, false), false),
            ((Aborted, false, false, None, false, false), true),
            ((Initial, false, false, None, false, false), false),
            ((Onboarding, false, false, None, true, false), false),
            ((Testing, false, false, Some(Healthy), true, false), false),
            ((Ready, false, false, Some(Healthy), true, false), false),
            ((Evicting, false, false, Some(Healthy), true, false), false),
            ((Active, false, false, Some(Healthy), true, true), false),
            ((Maintenance, false, false, None, false, true), false),
        ];
        for ((phase, deleting, fenced, health, agent, evicting), expect) in rows {
            assert_eq!(
                may_share(phase, deleting, fenced, health, agent, evicting),
                expect,
                "{phase:?} deleting={deleting} fenced={fenced} {health:?} agent={agent} evicting={evicting}"
            );
        }
    }
}
