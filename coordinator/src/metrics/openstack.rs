//! Requests to Nova, Placement and Keystone in numbers: by service,
//! operation and status, and their latency. The operation is the method and
//! the path with its identifiers left out (`POST servers/{id}/action`), so
//! a fleet of 5,000 hosts still has a few dozen series.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds (seconds) of the request latency histogram.
const BUCKETS: [f64; 12] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Path segments that name a collection: the segment after one is an
/// identifier (a UUID, a service id, a trait name), unless it is one of
/// [`WORDS`].
const COLLECTIONS: [&str; 7] = [
    "servers",
    "os-services",
    "os-aggregates",
    "os-hypervisors",
    "resource_providers",
    "traits",
    "migrations",
];

/// Fixed words that follow a collection.
const WORDS: [&str; 2] = ["detail", "action"];

/// `method path` with identifiers replaced by `{id}` and the query left out.
pub fn operation(method: &str, path: &str) -> String {
    let path = path.split('?').next().unwrap_or_default().trim_matches('/');
    let mut out = Vec::new();
    let mut previous = "";
    for segment in path.split('/') {
        let id = COLLECTIONS.contains(&previous) && !WORDS.contains(&segment);
        out.push(if id { "{id}" } else { segment });
        previous = segment;
    }
    format!("{method} {}", out.join("/"))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Request {
    service: &'static str,
    operation: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Operation {
    service: &'static str,
    operation: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

#[derive(Clone)]
pub struct OpenStackCalls {
    requests: Family<Request, Counter>,
    duration: Histograms<Operation>,
}

/// Unregistered (`default`), it counts for nobody.
impl Default for OpenStackCalls {
    fn default() -> Self {
        OpenStackCalls {
            requests: Family::default(),
            duration: Family::new_with_constructor(histogram as fn() -> Histogram),
        }
    }
}

impl OpenStackCalls {
    pub(super) fn register(registry: &mut Registry) -> OpenStackCalls {
        let c = OpenStackCalls::default();
        registry.register(
            "hv_openstack_requests",
            "Requests sent to Nova (compute), Placement and Keystone (identity), by operation and status: \
             the HTTP status, or what happened instead (unavailable: no connection; unknown: the answer was lost).",
            c.requests.clone(),
        );
        registry.register(
            "hv_openstack_request_duration_seconds",
            "How long a request to Nova, Placement or Keystone took to answer or fail, by operation.",
            c.duration.clone(),
        );
        c
    }

    /// A request to `service` for `operation` ended with `status` after `took`.
    pub fn record(&self, service: &'static str, operation: String, status: String, took: Duration) {
        self.duration
            .get_or_create(&Operation { service, operation: operation.clone() })
            .observe(took.as_secs_f64());
        self.requests.get_or_create(&Request { service, operation, status }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::operation;

    #[test]
    fn an_operation_names_the_path_without_its_identifiers() {
        let cases = [
            ("GET", "os-services", "GET os-services"),
            ("PUT", "os-services/9a1e-33", "PUT os-services/{id}"),
            ("GET", "servers/detail", "GET servers/detail"),
            ("GET", "servers/4f0c2d1e-aaaa-bbbb-cccc-123456789abc", "GET servers/{id}"),
            ("POST", "servers/4f0c/action", "POST servers/{id}/action"),
            ("DELETE", "servers/4f0c/migrations/17", "DELETE servers/{id}/migrations/{id}"),
            ("POST", "os-aggregates/3/action", "POST os-aggregates/{id}/action"),
            ("GET", "os-hypervisors/detail?limit=100", "GET os-hypervisors/detail"),
            ("GET", "resource_providers/5e7a/traits", "GET resource_providers/{id}/traits"),
            ("PUT", "traits/CUSTOM_HV_X", "PUT traits/{id}"),
            ("GET", "/traits", "GET traits"),
        ];
        for (method, path, want) in cases {
            assert_eq!(operation(method, path), want, "{method} {path}");
        }
    }
}
