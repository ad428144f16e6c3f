//! The controllers' writes to the Kubernetes API and their turns
//! (`k8s::write_slots`): a queue that stays long means the bound is too low
//! for the fleet, or the API server answers slowly.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Unregistered (`default`), it counts for nobody.
#[derive(Clone, Default)]
pub struct KubeWrites {
    pub in_flight: Gauge,
    pub waiting: Gauge,
    pub without_slot: Counter,
}

impl KubeWrites {
    pub(super) fn register(registry: &mut Registry) -> KubeWrites {
        let w = KubeWrites::default();
        registry.register(
            "hv_kube_writes_in_flight",
            "Writes to the Kubernetes API sent and not yet answered (at most --kube-max-in-flight-writes).",
            w.in_flight.clone(),
        );
        registry.register(
            "hv_kube_writes_waiting",
            "Writes to the Kubernetes API waiting for a turn.",
            w.waiting.clone(),
        );
        registry.register(
            "hv_kube_writes_without_slot",
            "Writes not sent: no turn came within --kube-timeout (their reconciles try again).",
            w.without_slot.clone(),
        );
        w
    }
}
