//! Leader election on a `coordination.k8s.io/v1` Lease, the way
//! client-go's leaderelection does it: the holder renews the lease; another
//! replica takes it only once it has not been renewed for a whole lease
//! duration; every write carries the resourceVersion it read, so two
//! replicas can never both win the same round.
//!
//! Hand-over: on shutdown the leader stops its controllers first, then
//! empties `holderIdentity`, so a follower takes over on its next try
//! (within `retry`) instead of waiting out the lease. A leader that cannot
//! renew within the lease duration stops leading; the binary then exits so
//! that it restarts as a follower with a clean state.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

#[derive(Clone, Debug)]
pub struct Election {
    pub lease: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_every: Duration,
    pub retry: Duration,
}

/// What the lease says about us, from a pure reading of it.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// We hold it (or may take it): write it with us as holder.
    Take { transition: bool },
    /// Someone else holds it and renewed it recently.
    HeldBy(String),
}

/// Pure: may `me` take the lease as read at `now`?
pub fn claim(spec: &LeaseSpec, me: &str, now: Timestamp) -> Claim {
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == me {
        return Claim::Take { transition: false };
    }
    if holder.is_empty() {
        return Claim::Take { transition: true };
    }
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
    let renewed = spec.renew_time.as_ref().map(|t| t.0);
    match renewed {
        Some(r) if now.duration_since(r) <= duration => Claim::HeldBy(holder),
        _ => Claim::Take { transition: true },
    }
}

impl Election {
    fn api(client: &kube::Client, namespace: &str) -> Api<Lease> {
        Api::namespaced(client.clone(), namespace)
    }

    /// One round: read, decide, write with the read resourceVersion.
    /// True when we hold the lease afterwards.
    pub async fn try_acquire(&self, api: &Api<Lease>) -> Result<bool, kube::Error> {
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
        match claim(&spec, &self.identity, now) {
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

    /// Waits until this replica leads.
    pub async fn acquire(&self, client: &kube::Client, namespace: &str) {
        let api = Self::api(client, namespace);
        let mut said = false;
        loop {
            match self.try_acquire(&api).await {
                Ok(true) => {
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

    /// Renews until a renewal has failed for a whole lease duration (or
    /// someone else holds the lease); then returns.
    pub async fn hold(&self, client: &kube::Client, namespace: &str) {
        let api = Self::api(client, namespace);
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.renew_every).await;
            match self.try_acquire(&api).await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => {
                    tracing::error!(lease = %self.lease, "another replica holds the lease");
                    return;
                }
                Err(e) => tracing::warn!(lease = %self.lease, error = %e, "lease renewal failed"),
            }
            if last_ok.elapsed() >= self.lease_duration {
                tracing::error!(lease = %self.lease, "could not renew the lease in time");
                return;
            }
        }
    }

    /// Gives the lease up so a follower takes over at once.
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

    fn spec(holder: Option<&str>, renewed_secs_ago: Option<i64>, now: Timestamp) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(15),
            renew_time: renewed_secs_ago.map(|s| MicroTime(now - SignedDuration::from_secs(s))),
            ..Default::default()
        }
    }

    #[test]
    fn a_fresh_lease_of_another_is_respected_and_a_stale_one_taken() {
        let now = Timestamp::from_second(1_800_000_000).unwrap_or(Timestamp::UNIX_EPOCH);
        assert_eq!(claim(&spec(Some("me"), Some(1), now), "me", now), Claim::Take { transition: false });
        assert_eq!(claim(&spec(Some("other"), Some(5), now), "me", now), Claim::HeldBy("other".into()));
        assert_eq!(claim(&spec(Some("other"), Some(15), now), "me", now), Claim::HeldBy("other".into()));
        assert_eq!(claim(&spec(Some("other"), Some(16), now), "me", now), Claim::Take { transition: true });
        assert_eq!(claim(&spec(Some("other"), None, now), "me", now), Claim::Take { transition: true });
        assert_eq!(claim(&spec(None, Some(1), now), "me", now), Claim::Take { transition: true });
        assert_eq!(claim(&spec(Some(""), Some(1), now), "me", now), Claim::Take { transition: true });
    }
}
