//! At most so many of the controllers' writes in flight at once; the rest
//! wait their turn, first come first served. Without a bound, a burst of
//! reconciles (every Hypervisor's status after a failover in a region of
//! thousands) reaches the API server at once: its handlers time out, and
//! its priority and fairness queue everything else of ours behind them.
//! Reads (watches included) pass without waiting.
//!
//! A write takes its slot before the lease is checked ([`super::acting`]):
//! one that waited is checked when it leaves, not when it was asked for.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Request;
use kube::client::Body;
use tokio::sync::Semaphore;
use tower::buffer::Buffer;
use tower::{BoxError, Layer, Service, ServiceExt};

use super::acting::changes_state;

/// Requests the service below may have queued while their callers wait.
const QUEUE: usize = 1024;

/// Bounds the writes in flight through the service it wraps.
#[derive(Clone)]
pub struct WriteSlotsLayer {
    slots: Arc<Semaphore>,
}

impl WriteSlotsLayer {
    /// `max` writes at once; at least one.
    pub fn new(max: usize) -> Self {
        WriteSlotsLayer { slots: Arc::new(Semaphore::new(max.max(1))) }
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
    /// a write may wait for its slot without holding anyone else's turn.
    /// Needs a Tokio runtime (the buffer's worker is spawned on it).
    fn layer(&self, inner: S) -> Self::Service {
        WriteSlots { inner: Buffer::new(inner, QUEUE), slots: self.slots.clone() }
    }
}

pub struct WriteSlots<F> {
    inner: Buffer<Request<Body>, F>,
    slots: Arc<Semaphore>,
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
            let _slot = match slots {
                Some(slots) => Some(slots.acquire_owned().await?),
                None => None,
            };
            below.oneshot(req).await
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::{Method, Response};

    use super::*;

    fn req(m: Method) -> Request<Body> {
        Request::builder().method(m).uri("/apis/x/v1/things/a").body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn writes_past_the_bound_wait_for_a_slot_reads_never_do() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<()>>();
        let mut svc = WriteSlotsLayer::new(2).layer(mock);
        let mut writes: Vec<_> = [Method::PATCH, Method::POST, Method::DELETE]
            .into_iter()
            .map(|m| tokio::spawn(svc.call(req(m))))
            .collect();

        let mut held = Vec::new();
        for _ in 0..2 {
            let next = tokio::time::timeout(Duration::from_secs(5), handle.next_request()).await;
            held.push(next.expect("the first two writes leave").expect("a request"));
        }
        let third = tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await;
        assert!(third.is_err(), "a third write left while two were in flight");

        let read = tokio::spawn(svc.call(req(Method::GET)));
        let (seen, answer) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("a read leaves while the writes' slots are taken")
            .expect("a request");
        assert_eq!(seen.method(), Method::GET);
        answer.send_response(Response::new(()));
        assert!(read.await.expect("joined").is_ok());

        let (_, first) = held.remove(0);
        first.send_response(Response::new(()));
        let (seen, answer) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("the third write leaves once a slot is free")
            .expect("a request");
        assert_eq!(seen.method(), Method::DELETE, "first come, first served");
        answer.send_response(Response::new(()));
        for (_, answer) in held {
            answer.send_response(Response::new(()));
        }
        for w in writes.drain(..) {
            assert!(w.await.expect("joined").is_ok(), "every write answered");
        }
    }
}
