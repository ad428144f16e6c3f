//! The kubelet's heartbeat: its Lease in `kube-node-lease`, which it renews
//! every quarter of the Lease's duration (docs/health.md, "Alive is a
//! veto"). Read only while a host's agent is gone, one GET each look, so a
//! fleet of hosts whose agents talk costs nothing; a Lease that cannot be
//! read leaves the Node's `Ready` condition to speak for the kubelet, which
//! keeps the veto.

use jiff::SignedDuration;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use crate::api::keys::NODE_LEASE_NAMESPACE;
use crate::health::Heartbeat;

/// A Lease's duration when it names none: the kubelet's default.
const DEFAULT_DURATION: SignedDuration = SignedDuration::from_secs(40);

/// The kubelet's last renewal of the Node `name`'s Lease (None: no Lease, or
/// not readable; the failure is logged).
pub async fn heartbeat(client: &kube::Client, name: &str) -> Option<Heartbeat> {
    let api: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    match api.get_opt(name).await {
        Ok(lease) => lease.as_ref().and_then(of),
        Err(e) => {
            tracing::warn!(error = %e, "could not read the kubelet's Lease; the Node's Ready condition stands for it");
            None
        }
    }
}

/// The heartbeat a Lease records (None before its first renewal).
pub fn of(lease: &Lease) -> Option<Heartbeat> {
    let spec = lease.spec.as_ref()?;
    let renewed = spec.renew_time.as_ref()?.0;
    let duration = spec
        .lease_duration_seconds
        .filter(|s| *s > 0)
        .map_or(DEFAULT_DURATION, |s| SignedDuration::from_secs(i64::from(s)));
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
    }
}
