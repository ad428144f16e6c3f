//! Leader election on a `coordination.k8s.io/v1` Lease, the way client-go's
//! leaderelection does it, and the guard that keeps a replica from acting
//! once it cannot show that it leads.
//!
//! - **Taking over** is timed on the follower's own monotonic clock: it
//!   notes when it *observed* the lease record change and takes the lease
//!   only when the record has not changed for a whole lease duration since.
//!   The holder's `renewTime` is never compared with the local wall clock,
//!   so a follower whose clock runs ahead cannot steal a live lease.
//! - **Holding** needs a successful renewal within `renew_deadline`, which
//!   is shorter than the lease duration: a leader that cannot renew stops
//!   acting before any follower may start. Every renewal is bounded by a
//!   timeout, so a hung API call cannot keep a deposed leader acting.
//! - **The guard** ([`LeaseGuard`]) says until when this replica provably
//!   leads: the start of its last successful renewal plus the renew
//!   deadline. Nova calls that change something check it first
//!   (`nova::http::Cloud`); the controllers stop when it lapses.
//! - Every write carries the resourceVersion it read, so two replicas can
//!   never both win the same round.
//!
//! Hand-over: on shutdown the leader stops its controllers first, then
//! empties `holderIdentity`, so a follower takes over on its next try
//! instead of waiting out the lease. A leader that cannot renew exits, to
//! restart as a follower with a clean state.

use std::sync::Mutex;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use tokio::time::Instant;

#[derive(Clone, Debug)]
pub struct Election {
    pub lease: String,
    pub identity: String,
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long stops acting; shorter
    /// than `lease_duration` by the margin that keeps two leaders apart.
    pub renew_deadline: Duration,
    /// Pause between tries (followers) and between renewals (the leader).
    pub retry: Duration,
}

/// What the lease says about us, from a pure reading of it.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// We hold it (or may take it): write it with us as holder.
    Take { transition: bool },
    /// Someone else holds it, and it changed within its duration.
    HeldBy(String),
}

/// The lease record as this replica last saw it, and when (its own
/// monotonic clock) it last saw it change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    record: (Option<String>, Option<String>, Option<i32>),
    at: Instant,
}

fn record_of(spec: &LeaseSpec) -> (Option<String>, Option<String>, Option<i32>) {
    let renewed = spec.renew_time.as_ref().map(|t| t.0.to_string());
    (spec.holder_identity.clone(), renewed, spec.lease_transitions)
}

/// Pure: may `me` take the lease as read now? Answers the claim and what
/// to remember of this reading.
pub fn claim(spec: &LeaseSpec, me: &str, last: Option<&Observed>, now: Instant) -> (Claim, Observed) {
    let record = record_of(spec);
    let observed = match last {
        Some(o) if o.record == record => o.clone(),
        _ => Observed { record, at: now },
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == me {
        return (Claim::Take { transition: false }, observed);
    }
    if holder.is_empty() {
        return (Claim::Take { transition: true }, observed);
    }
    let secs = u64::try_from(spec.lease_duration_seconds.unwrap_or(15).max(1)).unwrap_or(15);
    if now.duration_since(observed.at) > Duration::from_secs(secs) {
        (Claim::Take { transition: true }, observed)
    } else {
        (Claim::HeldBy(holder), observed)
    }
}

/// Until when this replica provably leads. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct LeaseGuard {
    valid_until: Mutex<Option<Instant>>,
    /// Time a call needs to reach the peer: no call starts closer than
    /// this to the end of the lease.
    margin: Duration,
}

/// Why a leadership held by [`Election::hold`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Another replica holds the lease, or it lapsed unrenewed.
    Lost,
    /// A lock of this process was poisoned (`crate::locked`): it still
    /// holds the lease, and gives it up once its controllers stopped.
    Poisoned,
}

impl LeaseGuard {
    pub fn new(margin: Duration) -> LeaseGuard {
        LeaseGuard { valid_until: Mutex::new(None), margin }
    }

    /// A renewal that started at `started` succeeded.
    pub fn renewed(&self, started: Instant, renew_deadline: Duration) {
        *crate::locked::lock(&self.valid_until) = Some(started + renew_deadline);
    }

    /// Leadership is over (lost, released, or never had).
    pub fn revoke(&self) {
        *crate::locked::lock(&self.valid_until) = None;
    }

    /// Ok while this replica leads with the margin to spare.
    pub fn ensure(&self) -> Result<(), String> {
        if crate::locked::poisoned() {
            return Err("a lock of this process was poisoned by a panic: it decides nothing more".into());
        }
        let until = *crate::locked::lock(&self.valid_until);
        match until {
            Some(t) if Instant::now() + self.margin < t => Ok(()),
            Some(_) => Err("the leader lease is about to lapse unrenewed".into()),
            None => Err("this replica does not hold the leader lease".into()),
        }
    }

    pub fn holds(&self) -> bool {
        self.ensure().is_ok()
    }
}

impl Election {
    fn api(client: &kube::Client, namespace: &str) -> Api<Lease> {
        Api::namespaced(client.clone(), namespace)
    }

    /// One round: read, decide, write with the read resourceVersion.
    /// True when we hold the lease afterwards. `last` is what this replica
    /// saw in its previous round.
    pub async fn try_acquire(
        &self,
        api: &Api<Lease>,
        last: &mut Option<Observed>,
    ) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let secs = i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = api.get_opt(&self.lease).await? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.lease.clone()), ..Default::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        let (verdict, observed) = claim(&spec, &self.identity, last.as_ref(), Instant::now());
        *last = Some(observed);
        match verdict {
            Claim::HeldBy(_) => return Ok(false),
            Claim::Take { transition } => {
                if transition {
                    spec.acquire_time = Some(MicroTime(now));
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.holder_identity = Some(self.identity.clone());
                spec.lease_duration_seconds = Some(secs);
                spec.renew_time = Some(MicroTime(now));
            }
        }
        lease.spec = Some(spec);
        match api.replace(&self.lease, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// One round bounded by `limit`: a hung call counts as a failed one.
    async fn round(
        &self,
        api: &Api<Lease>,
        last: &mut Option<Observed>,
        limit: Duration,
    ) -> Result<bool, String> {
        match tokio::time::timeout(limit, self.try_acquire(api, last)).await {
            Ok(Ok(won)) => Ok(won),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {limit:?}")),
        }
    }

    /// Waits until this replica leads; the guard then says so.
    pub async fn acquire(&self, client: &kube::Client, namespace: &str, guard: &LeaseGuard) {
        let api = Self::api(client, namespace);
        let mut said = false;
        let mut last = None;
        loop {
            // A process with a poisoned lock never leads (`crate::locked`).
            if crate::locked::poisoned() {
                tokio::time::sleep(self.retry).await;
                continue;
            }
            let started = Instant::now();
            match self.round(&api, &mut last, self.renew_deadline).await {
                Ok(true) => {
                    guard.renewed(started, self.renew_deadline);
                    tracing::info!(lease = %self.lease, identity = %self.identity, "leading");
                    return;
                }
                Ok(false) if !said => {
                    tracing::info!(lease = %self.lease, identity = %self.identity, "following; waiting for the lease");
                    said = true;
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(lease = %self.lease, error = %e, "lease not readable"),
            }
            tokio::time::sleep(self.retry).await;
        }
    }

    /// Renews every `retry` until the guard lapses (no renewal within the
    /// renew deadline), someone else holds the lease, or a lock of this
    /// process is poisoned; then revokes the guard and says which. The
    /// lease is not given up here: the caller stops its controllers first.
    pub async fn hold(&self, client: &kube::Client, namespace: &str, guard: &LeaseGuard) -> Held {
        let api = Self::api(client, namespace);
        let mut last = None;
        loop {
            tokio::time::sleep(self.retry).await;
            if crate::locked::poisoned() {
                guard.revoke();
                tracing::error!(lease = %self.lease, "a lock was poisoned: this replica stops leading");
                return Held::Poisoned;
            }
            let started = Instant::now();
            // Never wait for an answer past the point where it could no
            // longer extend the lease.
            let limit = self.renew_deadline.saturating_sub(self.retry).max(Duration::from_millis(100));
            match self.round(&api, &mut last, limit).await {
                Ok(true) => guard.renewed(started, self.renew_deadline),
                Ok(false) => {
                    guard.revoke();
                    tracing::error!(lease = %self.lease, "another replica holds the lease");
                    return Held::Lost;
                }
                Err(e) => tracing::warn!(lease = %self.lease, error = %e, "lease renewal failed"),
            }
            if !guard.holds() && !crate::locked::poisoned() {
                guard.revoke();
                tracing::error!(lease = %self.lease, deadline = ?self.renew_deadline, "could not renew the lease in time");
                return Held::Lost;
            }
        }
    }

    /// Gives the lease up so a follower takes over at once (only once this
    /// replica's controllers have stopped).
    pub async fn release(&self, client: &kube::Client, namespace: &str) {
        let api = Self::api(client, namespace);
        let Ok(Some(mut lease)) = api.get_opt(&self.lease).await else {
            return;
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        lease.spec = Some(spec);
        match api.replace(&self.lease, &PostParams::default(), &lease).await {
            Ok(_) => tracing::info!(lease = %self.lease, "lease released"),
            Err(e) => tracing::warn!(lease = %self.lease, error = %e, "could not release the lease"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::from_second(1_800_000_000 + renewed).unwrap_or_default())),
            lease_transitions: Some(1),
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_taken_only_after_it_stood_still_for_its_duration_on_our_clock() {
        let t0 = Instant::now();
        let s = spec(Some("other"), 0);
        let (c, seen) = claim(&s, "me", None, t0);
        assert_eq!(c, Claim::HeldBy("other".into()), "first sight: held, whatever renewTime says");
        let (c, seen) = claim(&s, "me", Some(&seen), t0 + Duration::from_secs(15));
        assert_eq!(c, Claim::HeldBy("other".into()));
        // The holder renews: the record changed, our clock starts again.
        let (c, seen) = claim(&spec(Some("other"), 14), "me", Some(&seen), t0 + Duration::from_secs(15));
        assert_eq!(c, Claim::HeldBy("other".into()));
        let (c, _) = claim(&spec(Some("other"), 14), "me", Some(&seen), t0 + Duration::from_secs(31));
        assert_eq!(c, Claim::Take { transition: true }, "unchanged for more than 15 s");
        assert_eq!(claim(&spec(Some("me"), 0), "me", None, t0).0, Claim::Take { transition: false });
        assert_eq!(claim(&spec(None, 0), "me", None, t0).0, Claim::Take { transition: true });
        assert_eq!(claim(&spec(Some(""), 0), "me", None, t0).0, Claim::Take { transition: true });
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewtime_far_in_the_past_does_not_let_a_fast_clocked_follower_steal_a_live_lease() {
        // The holder's clock is an hour behind ours: its renewTime looks
        // ancient, yet it renews every few seconds.
        let t0 = Instant::now();
        let mut seen = None;
        for i in 0..20 {
            let s = spec(Some("other"), -3600 + i * 2);
            let (c, o) = claim(&s, "me", seen.as_ref(), t0 + Duration::from_secs(2 * i as u64));
            assert_eq!(c, Claim::HeldBy("other".into()), "round {i}");
            seen = Some(o);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_guard_holds_until_the_renew_deadline_less_the_margin() {
        let g = LeaseGuard::new(Duration::from_secs(1));
        assert!(g.ensure().is_err(), "not before the first renewal");
        g.renewed(Instant::now(), Duration::from_secs(10));
        assert!(g.holds());
        tokio::time::advance(Duration::from_millis(8_900)).await;
        assert!(g.holds());
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(g.ensure().is_err(), "within the margin of the deadline");
        g.renewed(Instant::now(), Duration::from_secs(10));
        assert!(g.holds());
        g.revoke();
        assert!(!g.holds());
    }
}
