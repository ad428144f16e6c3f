//! Reconciles take turns: at most `--reconcile-concurrency` at once per
//! controller, in the order they asked, on a fair semaphore.
//!
//! Not kube-runtime's own bound (`Config::concurrency`): it keeps the
//! waiting requests in a hash set and takes the first it can in the set's
//! order, so under load the same hosts are reconciled again and again
//! while others never are (decision record 0018).

use std::future::Future;
use std::sync::Arc;

use kube::runtime::reflector::{ObjectRef, Store};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Semaphore;

/// Runs the reconcile `make` builds once a turn is free: at most as many at
/// once as `turns` has permits (`--reconcile-concurrency`), in the order
/// they asked. The reconcile's state (about 20 KiB) is built only when its
/// turn comes, so thousands waiting cost little; `make` takes the object
/// from the cache then, not as it was when the wait began (a wait can be
/// long at scale, and a spec edited or a deletion meanwhile must be seen).
/// `waiting` counts it while it waits (`hv_reconciles_waiting`): a backlog
/// that stays is the bound too low for the fleet, or a peer too slow.
pub async fn in_turn<F: Future>(turns: &Semaphore, waiting: &Gauge, make: impl FnOnce() -> F) -> F::Output {
    let waits = Waits::new(waiting);
    // A closed semaphore (never closed here) lets the reconcile run.
    let _turn = turns.acquire().await;
    drop(waits);
    Box::pin(make()).await
}

/// One reconcile counted as waiting until dropped (its turn came, or the
/// controller dropped it while it waited).
struct Waits<'a>(&'a Gauge);

impl<'a> Waits<'a> {
    fn new(gauge: &'a Gauge) -> Self {
        gauge.inc();
        Waits(gauge)
    }
}

impl Drop for Waits<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The object as `cache` holds it now; `object` itself once it is gone from
/// the cache (its reconcile then sees what it saw last).
pub fn latest<K>(cache: &Store<K>, object: Arc<K>) -> Arc<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    cache.get(&ObjectRef::from_obj(object.as_ref())).unwrap_or(object)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let waited = Arc::new(at("1"));
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
        use std::sync::atomic::{AtomicUsize, Ordering};
        let turns = Arc::new(tokio::sync::Semaphore::new(3));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let waiting = Gauge::default();
        let mut tasks = Vec::new();
        for i in 0..40 {
            let (turns, running, most, order) = (turns.clone(), running.clone(), most.clone(), order.clone());
            let waiting = waiting.clone();
            tasks.push(tokio::spawn(async move {
                in_turn(&turns, &waiting, || async move {
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
        assert!(waiting.get() > 0, "the ones past the bound are counted as waiting");
        for t in tasks {
            t.await.unwrap_or_else(|e| panic!("{e}"));
        }
        assert_eq!(most.load(Ordering::SeqCst), 3, "never more than the bound, and the bound used");
        let order = order.lock().map(|o| o.clone()).unwrap_or_default();
        assert_eq!(order, (0..40).collect::<Vec<_>>(), "every one ran, in the order asked");
        assert_eq!(waiting.get(), 0, "none left counted as waiting");
    }

    #[tokio::test]
    async fn a_reconcile_dropped_while_it_waits_is_no_longer_counted_as_waiting() {
        let turns = Semaphore::new(0);
        let waiting = Gauge::default();
        let waited = tokio::time::timeout(
            std::time::Duration::from_millis(20),
            in_turn(&turns, &waiting, || async {}),
        )
        .await;
        assert!(waited.is_err(), "no turn to take");
        assert_eq!(waiting.get(), 0);
    }
}
