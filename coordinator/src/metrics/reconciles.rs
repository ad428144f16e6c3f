//! Reconciles in numbers: how many, how they ended, how long they took, how
//! many wait for a turn, and the errors by kind. A kind is what the error is (an HTTP status class, a
//! peer's answer), never its text, so the families stay small.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds (seconds) of the reconcile duration histogram: most take
/// milliseconds; one that waits on Nova may take tens of seconds.
const BUCKETS: [f64; 12] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    controller: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Controller {
    controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorKind {
    controller: &'static str,
    kind: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

#[derive(Clone)]
pub struct Reconciles {
    total: Family<Outcome, Counter>,
    duration: Histograms<Controller>,
    errors: Family<ErrorKind, Counter>,
    waiting: Family<Controller, Gauge>,
}

impl Reconciles {
    pub(super) fn register(registry: &mut Registry) -> Reconciles {
        let r = Reconciles {
            total: Family::default(),
            duration: Family::new_with_constructor(histogram as fn() -> Histogram),
            errors: Family::default(),
            waiting: Family::default(),
        };
        registry.register(
            "hv_reconciles",
            "Reconciles by controller and result (ok, error).",
            r.total.clone(),
        );
        registry.register(
            "hv_reconcile_duration_seconds",
            "How long a reconcile took, by controller.",
            r.duration.clone(),
        );
        registry.register(
            "hv_reconcile_errors",
            "Reconciles that failed, by controller and the kind of error.",
            r.errors.clone(),
        );
        registry.register(
            "hv_reconciles_waiting",
            "Reconciles waiting for a turn (--reconcile-concurrency), by controller.",
            r.waiting.clone(),
        );
        // Shown at zero from the start, not only once a reconcile waited.
        for controller in ["hypervisor", "eviction"] {
            r.waiting(controller);
        }
        r
    }

    /// The gauge of `controller`'s reconciles waiting for a turn.
    pub fn waiting(&self, controller: &'static str) -> Gauge {
        self.waiting.get_or_create(&Controller { controller }).clone()
    }

    /// One reconcile of `controller` ended after `took`: `Ok`, or `Err`
    /// with the error's kind.
    pub fn record(&self, controller: &'static str, took: Duration, result: Result<(), &'static str>) {
        self.duration.get_or_create(&Controller { controller }).observe(took.as_secs_f64());
        let result = match result {
            Ok(()) => "ok",
            Err(kind) => {
                self.errors.get_or_create(&ErrorKind { controller, kind }).inc();
                "error"
            }
        };
        self.total.get_or_create(&Outcome { controller, result }).inc();
    }
}
