//! The Kubernetes client the controllers write with: every request that
//! changes something (anything but GET, HEAD, OPTIONS) is refused before it
//! leaves unless this replica holds the leader lease with the margin to
//! spare ([`LeaseGuard`]). A reconcile still under way when the lease
//! lapses therefore writes nothing, whatever it decided; the next leader
//! reads and decides again. The leader election itself (which must write
//! its Lease to keep it) and the watches use clients of their own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Method, Request};
use tower::{BoxError, Layer, Service};

use super::leader::LeaseGuard;

/// The request was not sent: this replica cannot show it leads.
#[derive(Debug, thiserror::Error)]
#[error("not sent, not the leader: {0}")]
pub struct NotLeader(pub String);

/// Wraps a client's service so that only the leader writes.
#[derive(Clone)]
pub struct LeaderOnlyLayer(pub Arc<LeaseGuard>);

impl<S> Layer<S> for LeaderOnlyLayer {
    type Service = LeaderOnly<S>;

    fn layer(&self, inner: S) -> LeaderOnly<S> {
        LeaderOnly { inner, guard: self.0.clone() }
    }
}

#[derive(Clone)]
pub struct LeaderOnly<S> {
    inner: S,
    guard: Arc<LeaseGuard>,
}

type Answer<R> = Pin<Box<dyn Future<Output = Result<R, BoxError>> + Send>>;

impl<S, B> Service<Request<B>> for LeaderOnly<S>
where
    S: Service<Request<B>>,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Answer<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let reads = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
        if !reads && let Err(why) = self.guard.ensure() {
            let refused = NotLeader(format!("{} {}: {why}", req.method(), req.uri().path()));
            return Box::pin(std::future::ready(Err(refused.into())));
        }
        let sent = self.inner.call(req);
        Box::pin(async move { sent.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::Response;
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn writes_leave_only_while_the_lease_is_held_reads_always() {
        let guard = Arc::new(LeaseGuard::new(Duration::from_secs(1)));
        let (mock, mut handle) = tower_test::mock::pair::<Request<()>, Response<()>>();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let _ = req;
                send.send_response(Response::new(()));
            }
        });
        let mut svc = LeaderOnlyLayer(guard.clone()).layer(mock);
        let req =
            |m: Method| Request::builder().method(m).uri("/apis/x/v1/things/a").body(()).unwrap_or_default();

        let refused = svc.ready().await.unwrap_or_else(|e| panic!("{e}")).call(req(Method::PATCH)).await;
        let e = refused.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("not the leader") && e.contains("PATCH /apis/x/v1/things/a"), "{e}");
        for m in [Method::POST, Method::PUT, Method::DELETE] {
            let r = svc.ready().await.unwrap_or_else(|e| panic!("{e}")).call(req(m.clone())).await;
            assert!(r.is_err(), "{m} sent without the lease");
        }
        let read = svc.ready().await.unwrap_or_else(|e| panic!("{e}")).call(req(Method::GET)).await;
        assert!(read.is_ok(), "reads need no lease");

        guard.renewed(tokio::time::Instant::now(), Duration::from_secs(10));
        let written = svc.ready().await.unwrap_or_else(|e| panic!("{e}")).call(req(Method::PATCH)).await;
        assert!(written.is_ok(), "the leader writes");
        guard.revoke();
        let after = svc.ready().await.unwrap_or_else(|e| panic!("{e}")).call(req(Method::POST)).await;
        assert!(after.is_err(), "a deposed leader writes nothing");
    }
}
