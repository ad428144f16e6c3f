//! When the certificates this replica presents end: the gRPC listener's
//! and the eviction webhook's, each shown while its listener serves TLS.
//! Read at each scrape from the certificate the next handshake would
//! present (`hv_tls::server::Presented`: re-read when its files changed), so
//! a rotation shows at the next scrape.

use std::time::SystemTime;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Where a certificate is used (`grpc`, `webhook`) and when it ends.
pub(super) type Source = (&'static str, Box<dyn Fn() -> Option<SystemTime> + Send + Sync>);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UseLabel {
    r#use: &'static str,
}

/// `hv_coordinator_certificate_expiry_seconds{use}`: each certificate's
/// notAfter in seconds since the Unix epoch, read now; one that cannot be
/// read shows no sample.
pub(super) fn registry(sources: &[Source]) -> Registry {
    let mut registry = Registry::default();
    let ends = Family::<UseLabel, Gauge>::default();
    for (used, not_after) in sources {
        let Some(end) = not_after() else { continue };
        let secs = match end.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            Err(before) => -i64::try_from(before.duration().as_secs()).unwrap_or(i64::MAX),
        };
        ends.get_or_create(&UseLabel { r#use: used }).set(secs);
    }
    registry.register(
        "hv_coordinator_certificate_expiry_seconds",
        "When the certificate this replica presents ends (its notAfter, seconds since the Unix epoch), by use: \
         grpc, webhook, agent-signer (the CA of the agents' certificates).",
        ends,
    );
    registry
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn text(sources: &[Source]) -> String {
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode_registry(&mut s, &registry(sources));
        s
    }

    #[test]
    fn each_certificate_shows_its_end_and_one_not_read_none() {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(2_208_988_800);
        let sources: Vec<Source> =
            vec![("grpc", Box::new(move || Some(end))), ("webhook", Box::new(|| None))];
        let s = text(&sources);
        assert!(
            s.lines().any(|l| l == "hv_coordinator_certificate_expiry_seconds{use=\"grpc\"} 2208988800"),
            "{s}"
        );
        assert!(!s.contains("webhook\""), "a certificate not read shows nothing: {s}");
    }
}
