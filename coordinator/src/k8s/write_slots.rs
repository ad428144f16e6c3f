//! At most so many of the controllers' writes in flight at once; the rest
//! wait their turn, first come first served. Without a bound, a burst of
//! reconciles (every Hypervisor's status after a failover in a region of
//! thousands) reaches the API server at once: its handlers time out, and
//! its priority and fairness queue everything else of ours behind them.
//! Reads (watches included) pass without waiting.
//!
//! A write takes its slot before the lease is checked ([`super::acting`]):
//! one that waited is checked when it leaves, not when it was asked for. A
//! write that finds no slot within its wait is not sent ([`NoWriteSlot`]);
//! its reconcile fails and is looked at again, so nothing waits unbounded.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Request;
use kube::client::Body;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::buffer::Buffer;
use tower::{BoxError, Layer, Service, ServiceExt};

use super::acting::changes_state;
use crate::metrics::KubeWrites;

/// Requests the service below may have queued while their callers wait.
const QUEUE: usize = 1024;

/// The write was not sent: every slot stayed taken for as long as it may wait.
#[derive(Debug, thiserror::Error)]
#[error("not sent: no turn among the Kubernetes writes in flight within {0:?}")]
pub struct NoWriteSlot(pub Duration);

struct Slots {
    free: Arc<Semaphore>,
    wait: Duration,
    counts: KubeWrites,
}

/// A write's turn: held until its answer (or failure) arrives.
struct Turn {
    _permit: OwnedSemaphorePermit,
    counts: KubeWrites,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.counts.in_flight.dec();
    }
}

/// Counts a write as waiting for as long as it does, even if its caller
/// gives up on it.
struct Waiting(KubeWrites);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.dec();
    }
}

impl Slots {
    async fn take(self: Arc<Self>) -> Result<Turn, BoxError> {
        self.counts.waiting.inc();
        let waiting = Waiting(self.counts.clone());
        let permit = tokio::time::timeout(self.wait, self.free.clone().acquire_owned()).await;
        drop(waiting);
        match permit {
            Ok(permit) => {
                let permit = permit?;
                self.counts.in_flight.inc();
                Ok(Turn { _permit: permit, counts: self.counts.clone() })
            }
            Err(_) => {
                self.counts.without_slot.inc();
                Err(NoWriteSlot(self.wait).into())
            }
        }
    }
}

/// Bounds the writes in flight through the service it wraps.
#[derive(Clone)]
pub struct WriteSlotsLayer {
    slots: Arc<Slots>,
}

impl WriteSlotsLayer {
    /// `max` writes at once (at least one); a write waits at most `wait`
    /// for its turn.
    pub fn new(max: usize, wait: Duration, counts: KubeWrites) -> Self {
        WriteSlotsLayer {
            slots: Arc::new(Slots { free: Arc::new(Semaphore::new(max.max(1))), wait, counts }),
        }
    }
}

impl<S> Layer<S> for WriteSlotsLayer
where
    S: Service<Request<Body>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError> + Send + Sync,
{
    type Service = WriteSlots<S::Future>;

    /// The service below is shared by the callers through a buffer, so that
    /// a write may wait for its turn without holding up anyone else's. The
    /// buffer's worker is spawned on the Tokio runtime. A service below
    /// whose readiness failed would fail every later request; kube's stack
    /// below (the lease check, hyper's pool) is always ready.
    fn layer(&self, inner: S) -> Self::Service {
        WriteSlots { inner: Buffer::new(inner, QUEUE), slots: self.slots.clone() }
    }
}

pub struct WriteSlots<F> {
    inner: Buffer<Request<Body>, F>,
    slots: Arc<Slots>,
}

type Answer<R> = Pin<Box<dyn Future<Output = Result<R, BoxError>> + Send>>;

impl<R, F, E> Service<Request<Body>> for WriteSlots<F>
where
    F: Future<Output = Result<R, E>> + Send + 'static,
    E: Into<BoxError> + Send + Sync,
    R: Send + 'static,
{
    type Response = R;
    type Error = BoxError;
    type Future = Answer<R>;

    /// Always ready: each call waits for the service below on its own.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let below = self.inner.clone();
        let slots = changes_state(req.method()).then(|| self.slots.clone());
        Box::pin(async move {
            let _turn = match slots {
                Some(slots) => Some(slots.take().await?),
                None => None,
            };
            below.oneshot(req).await
        })
    }
}

#[cfg(test)]
mod tests {
    use http::{Method, Response};

    use super::*;

    fn req(m: Method) -> Request<Body> {
        Request::builder().method(m).uri("/apis/x/v1/things/a").body(Body::empty()).unwrap()
    }

    type Handle = tower_test::mock::Handle<Request<Body>, Response<()>>;
    type Answering = tower_test::mock::SendResponse<Response<()>>;

    async fn next(handle: &mut Handle, what: &str) -> (Method, Answering) {
        let (req, answer) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .unwrap_or_else(|_| panic!("{what}: nothing left"))
            .expect("a request");
        (req.method().clone(), answer)
    }

    async fn nothing_leaves(handle: &mut Handle, what: &str) {
        let left = tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await;
        assert!(left.is_err(), "{what}");
    }

    #[tokio::test]
    async fn writes_past_the_bound_wait_for_a_slot_reads_never_do() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<()>>();
        let counts = KubeWrites::default();
        let mut svc = WriteSlotsLayer::new(2, Duration::from_secs(30), counts.clone()).layer(mock);
        let writes: Vec<_> = [Method::PATCH, Method::POST, Method::DELETE]
            .into_iter()
            .map(|m| tokio::spawn(svc.call(req(m))))
            .collect();
        let first = next(&mut handle, "the first write leaves").await;
        let second = next(&mut handle, "the second write leaves").await;
        nothing_leaves(&mut handle, "a third write left while two were in flight").await;
        assert_eq!((counts.in_flight.get(), counts.waiting.get()), (2, 1));

        let read = tokio::spawn(svc.call(req(Method::GET)));
        let (m, answer) = next(&mut handle, "a read leaves while the writes' slots are taken").await;
        assert_eq!(m, Method::GET);
        answer.send_response(Response::new(()));
        assert!(read.await.expect("joined").is_ok());

        first.1.send_response(Response::new(()));
        let third = next(&mut handle, "the third write leaves once a slot is free").await;
        for (_, answer) in [second, third] {
            answer.send_response(Response::new(()));
        }
        for w in writes {
            assert!(w.await.expect("joined").is_ok(), "every write answered");
        }
        assert_eq!((counts.in_flight.get(), counts.waiting.get()), (0, 0));
    }

    #[tokio::test]
    async fn writes_leave_in_the_order_they_came() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<()>>();
        let mut svc = WriteSlotsLayer::new(1, Duration::from_secs(30), KubeWrites::default()).layer(mock);
        let held = tokio::spawn(svc.call(req(Method::PATCH)));
        let (_, answer) = next(&mut handle, "the first write leaves").await;
        let mut waiting = Vec::new();
        for m in [Method::POST, Method::PUT, Method::DELETE] {
            waiting.push(tokio::spawn(svc.call(req(m))));
            tokio::task::yield_now().await;
        }
        answer.send_response(Response::new(()));
        for m in [Method::POST, Method::PUT, Method::DELETE] {
            let (left, answer) = next(&mut handle, "a waiting write leaves").await;
            assert_eq!(left, m, "first come, first served");
            answer.send_response(Response::new(()));
        }
        assert!(held.await.expect("joined").is_ok());
        for w in waiting {
            assert!(w.await.expect("joined").is_ok());
        }
    }

    #[tokio::test]
    async fn a_write_without_a_turn_in_time_is_not_sent() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<()>>();
        let counts = KubeWrites::default();
        let mut svc = WriteSlotsLayer::new(1, Duration::from_millis(100), counts.clone()).layer(mock);
        let held = tokio::spawn(svc.call(req(Method::PATCH)));
        let (_, answer) = next(&mut handle, "the first write leaves").await;
        let e = svc.call(req(Method::POST)).await.expect_err("no turn within the wait");
        assert!(e.is::<NoWriteSlot>(), "{e}");
        assert_eq!((counts.without_slot.get(), counts.waiting.get(), counts.in_flight.get()), (1, 0, 1));
        answer.send_response(Response::new(()));
        assert!(held.await.expect("joined").is_ok());
        nothing_leaves(&mut handle, "the write without a turn was sent after all").await;
    }
}
