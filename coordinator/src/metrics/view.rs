//! The fleet view of Nova in numbers (docs/nova.md, "The fleet view"): a
//! read of a large fleet is slow, and a view older than its bound sends
//! every settled host back to its own reads, so an SRE watches its age and
//! read time. Read from the view at each scrape, by the leader only (a
//! follower reads nothing).

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::nova::view::ViewFigures;

/// The view's gauges, set from `f`. The age is left out before the first
/// good read: there is no snapshot to be old.
pub(super) fn registry(f: &ViewFigures) -> Registry {
    let mut registry = Registry::default();
    let seconds = |d: std::time::Duration| {
        let g = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        g.set(d.as_secs_f64());
        g
    };
    registry.register(
        "hv_coordinator_nova_view_bound_seconds",
        "The fleet view's bound: a snapshot older than this no longer confirms a host.",
        seconds(f.bound),
    );
    if let Some(age) = f.age {
        registry.register(
            "hv_coordinator_nova_view_age_seconds",
            "Age of the fleet view's snapshot, from the start of its read.",
            seconds(age),
        );
    }
    if let Some(took) = f.last_read {
        registry.register(
            "hv_coordinator_nova_view_read_seconds",
            "How long the last good read of the fleet took (every page of every list).",
            seconds(took),
        );
    }
    let failures = Gauge::<i64>::default();
    failures.set(i64::from(f.failures));
    registry.register(
        "hv_coordinator_nova_view_failures_in_a_row",
        "Reads of the fleet that failed since the last good one.",
        failures,
    );
    registry
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn text(f: &ViewFigures) -> String {
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode_registry(&mut s, &registry(f));
        s
    }

    #[test]
    fn the_views_age_and_read_time_show_once_it_was_read() {
        let read = ViewFigures {
            bound: Duration::from_secs(30),
            age: Some(Duration::from_millis(12_500)),
            last_read: Some(Duration::from_millis(1_250)),
            failures: 2,
        };
        let s = text(&read);
        assert!(s.contains("hv_coordinator_nova_view_bound_seconds 30.0"), "{s}");
        assert!(s.contains("hv_coordinator_nova_view_age_seconds 12.5"), "{s}");
        assert!(s.contains("hv_coordinator_nova_view_read_seconds 1.25"), "{s}");
        assert!(s.contains("hv_coordinator_nova_view_failures_in_a_row 2"), "{s}");
        let never = ViewFigures { age: None, last_read: None, failures: 1, ..read };
        let s = text(&never);
        assert!(!s.contains("age_seconds"), "no snapshot, no age: {s}");
        assert!(!s.contains("read_seconds"), "{s}");
        assert!(s.contains("hv_coordinator_nova_view_failures_in_a_row 1"), "{s}");
    }
}
