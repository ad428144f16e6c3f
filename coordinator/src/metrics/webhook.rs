//! The eviction webhook in numbers (`k8s::webhook`): the API server's
//! requests by what they came to, and how long each took to answer.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds (seconds) of the answer time: the API server waits for the
/// webhook's answer a few seconds at most (its `timeoutSeconds`).
const BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

/// What a request to the webhook came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted: not ours to judge, or judged and let through.
    Allowed,
    /// Refused: a protected pod of a host that is not empty (a 429).
    Refused,
    /// Not judged: a request that is no AdmissionReview, a pod that could
    /// not be read, an answer that could not be written. The API server's
    /// failurePolicy and the disruption budgets decide.
    Error,
}

impl Outcome {
    pub const ALL: [Outcome; 3] = [Outcome::Allowed, Outcome::Refused, Outcome::Error];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Refused => "refused",
            Outcome::Error => "error",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// Cheap to clone: the webhook holds one. Unregistered (`default`), it
/// counts for nobody.
#[derive(Clone)]
pub struct WebhookCalls {
    requests: Family<OutcomeLabel, Counter>,
    duration: Family<OutcomeLabel, Histogram, fn() -> Histogram>,
}

impl Default for WebhookCalls {
    fn default() -> Self {
        WebhookCalls {
            requests: Family::default(),
            duration: Family::new_with_constructor(histogram as fn() -> Histogram),
        }
    }
}

impl WebhookCalls {
    pub(super) fn register(registry: &mut Registry) -> WebhookCalls {
        let w = WebhookCalls::default();
        registry.register(
            "hv_webhook_requests",
            "Requests of the API server to the eviction webhook, by outcome: allowed, refused, error (not \
             judged: the failurePolicy and the disruption budgets decide).",
            w.requests.clone(),
        );
        registry.register(
            "hv_webhook_request_duration_seconds",
            "How long the eviction webhook took to answer, from the request's head to the answer, by outcome.",
            w.duration.clone(),
        );
        for o in Outcome::ALL {
            let _ = w.requests.get_or_create(&OutcomeLabel { outcome: o.as_str() });
        }
        w
    }

    /// A request came to `outcome` after `took`.
    pub fn record(&self, outcome: Outcome, took: Duration) {
        let label = OutcomeLabel { outcome: outcome.as_str() };
        self.requests.get_or_create(&label).inc();
        self.duration.get_or_create(&label).observe(took.as_secs_f64());
    }
}
