//! The kubelet's heartbeat: its Lease in `kube-node-lease`, which it renews
//! every quarter of the Lease's duration (docs/health.md, "Alive is a
//! veto"). Read only while a host's agent is gone, one GET each look, so a
//! fleet of hosts whose agents talk costs nothing; a Lease that cannot be
//! read leaves the Node's `Ready` condition to speak for the kubelet, which
//! keeps the veto.
//!
//! A renewal counts from when this leader saw it, by its own clock, as the
//! Node lifecycle controller does: a kubelet whose clock runs ahead (a
//! renewal "in the future") or behind moves no verdict.

use std::collections::HashMap;
use std::sync::Mutex;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use crate::api::keys::NODE_LEASE_NAMESPACE;
use crate::health::Heartbeat;

/// A Lease's duration when it names none: the kubelet's default.
const DEFAULT_DURATION: SignedDuration = SignedDuration::from_secs(40);
/// The longest a Lease's duration counts for: a Lease written to hold an
/// hour would otherwise keep a dead host alive for half of it.
pub const MAX_DURATION: SignedDuration = SignedDuration::from_secs(60);

/// Per node, the renewal time last read and when this leader first saw it
/// (one set per leadership).
#[derive(Default)]
pub struct Renewals(Mutex<HashMap<String, (Timestamp, Timestamp)>>);

impl Renewals {
    /// The kubelet's last renewal of the Node `name`'s Lease, as seen by
    /// this leader at `now` (None: no Lease, or not readable; the failure
    /// is logged).
    pub async fn heartbeat(&self, client: &kube::Client, name: &str, now: Timestamp) -> Option<Heartbeat> {
        let written = written(client, name).await?;
        let mut seen = crate::locked::lock(&self.0);
        let at = seen_at(seen.get(name).copied(), written, now);
        seen.insert(name.to_string(), (written.renewed, at));
        Some(Heartbeat { renewed: at, duration: written.duration })
    }
}

/// The kubelet's last renewal of the Node `name`'s Lease as it wrote it,
/// by its own clock (None: no Lease, or not readable; the failure is
/// logged, and the Node's Ready condition stands for it). A fenced host's
/// signs of life compare it only with their earlier reads.
pub async fn written(client: &kube::Client, name: &str) -> Option<Heartbeat> {
    let api: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    match api.get_opt(name).await {
        Ok(lease) => of(lease.as_ref()?),
        Err(e) => {
            tracing::warn!(error = %e, "could not read the kubelet's Lease");
            None
        }
    }
}

/// When a renewal written at `written.renewed` counts as made, by this
/// leader's clock: a renewal unchanged since the last read counts from
/// when it was first seen; a changed one from `now` (it came since); the
/// first one seen from its own time, but never ahead of `now` nor further
/// back than half a duration: a first read alone finds the kubelet neither
/// alive nor its channel lost (that takes later looks, a grace on).
pub fn seen_at(last: Option<(Timestamp, Timestamp)>, written: Heartbeat, now: Timestamp) -> Timestamp {
    match last {
        Some((renewed, at)) if renewed == written.renewed => at,
        Some(_) => now,
        None => written.renewed.min(now).max(now - written.duration / 2),
    }
}

/// The heartbeat a Lease records (None before its first renewal), its
/// duration at most [`MAX_DURATION`].
pub fn of(lease: &Lease) -> Option<Heartbeat> {
    let spec = lease.spec.as_ref()?;
    let renewed = spec.renew_time.as_ref()?.0;
    let duration = spec
        .lease_duration_seconds
        .filter(|s| *s > 0)
        .map_or(DEFAULT_DURATION, |s| SignedDuration::from_secs(i64::from(s)))
        .min(MAX_DURATION);
    Some(Heartbeat { renewed, duration })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(renewed: Option<i64>, seconds: Option<i32>) -> Lease {
        let renew_time = renewed.map(|s| MicroTime(jiff::Timestamp::from_second(s).unwrap_or_default()));
        Lease {
            spec: Some(LeaseSpec { renew_time, lease_duration_seconds: seconds, ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_says_when_it_was_renewed_and_for_how_long() {
        let at = jiff::Timestamp::from_second(1_800_000_000).unwrap_or_default();
        let h = of(&lease(Some(1_800_000_000), Some(8)));
        assert_eq!(h, Some(Heartbeat { renewed: at, duration: SignedDuration::from_secs(8) }));
        let default = of(&lease(Some(1_800_000_000), None)).map(|h| h.duration);
        assert_eq!(default, Some(DEFAULT_DURATION));
        assert_eq!(of(&lease(Some(1_800_000_000), Some(0))).map(|h| h.duration), Some(DEFAULT_DURATION));
        assert_eq!(of(&lease(None, Some(40))), None, "never renewed: no heartbeat");
        assert_eq!(of(&Lease::default()), None);
        let hour = of(&lease(Some(1_800_000_000), Some(3600))).map(|h| h.duration);
        assert_eq!(hour, Some(MAX_DURATION), "a Lease of an hour counts for a minute");
    }

    #[test]
    fn a_renewal_counts_from_when_this_leader_saw_it_by_its_own_clock() {
        let t = |s: i64| jiff::Timestamp::from_second(1_800_000_000 + s).unwrap_or_default();
        let beat = |renewed| Heartbeat { renewed, duration: SignedDuration::from_secs(40) };
        let now = t(100);
        // First seen: its own time, if behind ours by less than a duration.
        assert_eq!(seen_at(None, beat(t(90)), now), t(90));
        // Ahead of our clock (the kubelet's runs fast): now, not the future.
        assert_eq!(seen_at(None, beat(t(3700)), now), now);
        // Far behind (the kubelet's clock runs slow, or it is long dead):
        // half a duration back at most, so not lost on a first read.
        assert_eq!(seen_at(None, beat(t(-500)), now), t(80));
        // Unchanged since the last read: from when it was first seen, so a
        // dead kubelet's renewal ages by our clock whatever it says.
        assert_eq!(seen_at(Some((t(3700), t(100))), beat(t(3700)), t(200)), t(100));
        // Changed since: renewed meanwhile, now.
        assert_eq!(seen_at(Some((t(-500), t(80))), beat(t(-490)), t(110)), t(110));
    }
}
