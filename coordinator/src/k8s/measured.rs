//! Every reconcile runs in a span that names its controller and object (so
//! the events inside it need not name the object again), and is counted in
//! the reconcile metrics with its duration and, when it fails, the kind of
//! its error. Reconciles take turns ([`in_turn`]).

use std::future::Future;
use std::time::Instant;

use tracing::Instrument;

use super::acting::NotLeader;
use crate::metrics::Reconciles;

/// Runs the reconcile `make` builds once a turn is free: at most as many at
/// once as `turns` has permits (`--reconcile-concurrency`), in the order
/// they asked. The reconcile's state (about 20 KiB) is built only when its
/// turn comes, so thousands waiting cost little; `make` takes the object
/// from the cache then, not as it was when the wait began (a wait can be
/// long at scale, and a spec edited or a deletion meanwhile must be seen). Not kube-runtime's own
/// bound: it keeps the waiting requests in a hash set and takes the first
/// it can in the set's order, and at 5,000 hosts on the ground the same 256
/// hosts were reconciled again and again while the other 4,744 never were.
pub async fn in_turn<F: Future>(turns: &tokio::sync::Semaphore, make: impl FnOnce() -> F) -> F::Output {
    // A closed semaphore (never closed here) lets the reconcile run.
    let _turn = turns.acquire().await;
    Box::pin(make()).await
}

/// The object as `cache` holds it now; `object` itself once it is gone from
/// the cache (its reconcile then sees what it saw last).
pub fn latest<K>(cache: &kube::runtime::reflector::Store<K>, object: std::sync::Arc<K>) -> std::sync::Arc<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    cache.get(&kube::runtime::reflector::ObjectRef::from_obj(object.as_ref())).unwrap_or(object)
}

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

    #[test]
    fn a_reconcile_takes_the_object_as_the_cache_holds_it_when_its_turn_comes() {
        use crate::api::{Hypervisor, HypervisorSpec};
        use kube::runtime::watcher;
        let at = |rv: &str| {
            let mut h = Hypervisor::new("node-1", HypervisorSpec::default());
            h.metadata.resource_version = Some(rv.into());
            h
        };
        let (cache, mut writer) = kube::runtime::reflector::store::<Hypervisor>();
        writer.apply_watcher_event(&watcher::Event::Apply(at("2")));
        let waited = std::sync::Arc::new(at("1"));
        let now = latest(&cache, waited.clone());
        assert_eq!(now.metadata.resource_version.as_deref(), Some("2"), "edited while it waited");
        writer.apply_watcher_event(&watcher::Event::Delete(at("2")));
        assert_eq!(
            latest(&cache, waited).metadata.resource_version.as_deref(),
            Some("1"),
            "gone: as seen last"
        );
    }

    #[tokio::test]
    async fn reconciles_take_turns_in_the_order_they_asked_and_no_more_at_once() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let turns = Arc::new(tokio::sync::Semaphore::new(3));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..40 {
            let (turns, running, most, order) = (turns.clone(), running.clone(), most.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                in_turn(&turns, || async move {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    order.lock().map(|mut o| o.push(i)).ok();
                    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                })
                .await
            }));
            // Each asks before the next does.
            tokio::task::yield_now().await;
        }
        for t in tasks {
            t.await.unwrap_or_else(|e| panic!("{e}"));
        }
        assert_eq!(most.load(Ordering::SeqCst), 3, "never more than the bound, and the bound used");
        let order = order.lock().map(|o| o.clone()).unwrap_or_default();
        assert_eq!(order, (0..40).collect::<Vec<_>>(), "every one ran, in the order asked");
    }
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
