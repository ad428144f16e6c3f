//! The agents' certificates in numbers: those signed (by port), those
//! refused (by reason), and the end of the oldest one a connected agent
//! holds: one series for the fleet, not one per node.

use std::time::SystemTime;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Via {
    via: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: &'static str,
}

/// Cheap to clone; unregistered (`default`), it counts for nobody.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Kind {
    kind: &'static str,
}

#[derive(Clone, Default)]
pub struct AgentCertificates {
    issued: Family<Via, Counter>,
    refused: Family<Reason, Counter>,
    errors: Family<Kind, Counter>,
}

impl AgentCertificates {
    pub fn register(registry: &mut Registry) -> AgentCertificates {
        let c = AgentCertificates::default();
        registry.register(
            "hv_coordinator_agent_certificates_issued",
            "Agent certificates signed, by port: bootstrap (on a token) or renewal (on a token and the certificate \
             it replaces).",
            c.issued.clone(),
        );
        registry.register(
            "hv_coordinator_agent_certificate_refusals",
            "Agent certificates refused, by reason (docs/metrics.md).",
            c.refused.clone(),
        );
        registry.register(
            "hv_coordinator_agent_certificate_errors",
            "Agent certificates not signed for want of this side, by kind: busy (too many at once), signer (the \
             signing CA unreadable or ended), not_leader, or the Kubernetes API's error kind.",
            c.errors.clone(),
        );
        for via in ["bootstrap", "renewal"] {
            let _ = c.issued.get_or_create(&Via { via });
        }
        for reason in crate::identity::Refusal::REASONS {
            let _ = c.refused.get_or_create(&Reason { reason });
        }
        c
    }

    pub fn issued(&self, renewal: bool) {
        self.issued.get_or_create(&Via { via: if renewal { "renewal" } else { "bootstrap" } }).inc();
    }

    pub fn error(&self, kind: &'static str) {
        self.errors.get_or_create(&Kind { kind }).inc();
    }

    pub fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&Reason { reason }).inc();
    }
}

/// `hv_coordinator_agent_certificate_expiry_min_seconds`: when the first of the
/// connected agents' certificates ends (seconds since the Unix epoch);
/// no sample with no agent connected.
pub(super) fn oldest(end: Option<SystemTime>) -> Registry {
    let mut registry = Registry::default();
    let gauge = Gauge::<i64>::default();
    if let Some(end) = end {
        let secs = end.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        gauge.set(i64::try_from(secs).unwrap_or(i64::MAX));
        registry.register(
            "hv_coordinator_agent_certificate_expiry_min_seconds",
            "When the first of the connected agents' session certificates ends (its notAfter, seconds since the \
             Unix epoch): the fleet's oldest.",
            gauge,
        );
    }
    registry
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn text(r: &Registry) -> String {
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode_registry(&mut s, r);
        s
    }

    #[test]
    fn every_reason_starts_at_zero_and_counts_what_it_is_told() {
        let mut r = Registry::default();
        let c = AgentCertificates::register(&mut r);
        c.refused("replayed");
        c.issued(true);
        let s = text(&r);
        assert!(s.contains("hv_coordinator_agent_certificate_refusals_total{reason=\"replayed\"} 1"), "{s}");
        assert!(
            s.contains("hv_coordinator_agent_certificate_refusals_total{reason=\"wrong_node\"} 0"),
            "{s}"
        );
        assert!(s.contains("hv_coordinator_agent_certificates_issued_total{via=\"renewal\"} 1"), "{s}");
        assert!(s.contains("hv_coordinator_agent_certificates_issued_total{via=\"bootstrap\"} 0"), "{s}");
    }

    #[test]
    fn the_oldest_end_is_one_series_and_none_without_agents() {
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000);
        let s = text(&oldest(Some(end)));
        assert!(
            s.lines().any(|l| l == "hv_coordinator_agent_certificate_expiry_min_seconds 2000000000"),
            "{s}"
        );
        assert!(!text(&oldest(None)).contains("hv_coordinator_agent_certificate_expiry_min_seconds "));
    }
}
