//! Every reconcile runs in a span that names its controller and object (so
//! the events inside it need not name the object again), and is counted in
//! the reconcile metrics with its duration and, when it fails, the kind of
//! its error.

use std::future::Future;
use std::time::Instant;

use tracing::Instrument;

use super::acting::{NotLeader, Withheld};
use crate::metrics::Reconciles;

/// What an error is, in one word: for the metrics, never from its text.
pub trait ErrorKind {
    fn kind(&self) -> &'static str;
}

/// A Kubernetes API error by its status, or by what kept it from being
/// answered.
pub fn kube_error_kind(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(s) => match s.code {
            409 => "kubernetes_conflict",
            404 => "kubernetes_not_found",
            401 | 403 => "kubernetes_forbidden",
            422 | 400 => "kubernetes_invalid",
            429 => "kubernetes_throttled",
            500..=599 => "kubernetes_unavailable",
            _ => "kubernetes_rejected",
        },
        kube::Error::Service(inner) if inner.downcast_ref::<NotLeader>().is_some() => "not_leader",
        kube::Error::Service(inner) if inner.downcast_ref::<Withheld>().is_some() => "withheld",
        kube::Error::SerdeError(_) => "kubernetes_invalid_answer",
        _ => "kubernetes_unreachable",
    }
}

/// Runs `reconcile` in `span`, counted as one of `controller`'s.
pub async fn measured<T, E: ErrorKind>(
    controller: &'static str,
    metrics: &Reconciles,
    span: tracing::Span,
    reconcile: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let started = Instant::now();
    let result = reconcile.instrument(span).await;
    metrics.record(controller, started.elapsed(), result.as_ref().map(|_| ()).map_err(ErrorKind::kind));
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status { code, ..Default::default() }))
    }

    #[test]
    fn a_kubernetes_error_is_named_by_its_status_or_its_cause() {
        assert_eq!(kube_error_kind(&api(409)), "kubernetes_conflict");
        assert_eq!(kube_error_kind(&api(404)), "kubernetes_not_found");
        assert_eq!(kube_error_kind(&api(503)), "kubernetes_unavailable");
        assert_eq!(kube_error_kind(&api(429)), "kubernetes_throttled");
        assert_eq!(kube_error_kind(&api(418)), "kubernetes_rejected");
        let refused = kube::Error::Service(Box::new(NotLeader("PATCH /x: lease lost".into())));
        assert_eq!(kube_error_kind(&refused), "not_leader");
        let other = kube::Error::Service("connection refused".into());
        assert_eq!(kube_error_kind(&other), "kubernetes_unreachable");
    }
}
