//! The Kubernetes client the controllers write with: every request that
//! changes something (anything but GET, HEAD, OPTIONS) is refused before it
//! leaves unless this replica holds the leader lease with the margin to
//! spare ([`LeaseGuard`]). A reconcile still under way when the lease
//! lapses therefore writes nothing, whatever it decided; the next leader
//! reads and decides again. The leader election itself (which must write
//! its Lease to keep it) and the watches use clients of their own. An
//! install in observe mode writes only its own custom resources and Events
//! ([`observer_may_write`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Method, Request};
use tower::layer::util::Stack;
use tower::{BoxError, Layer, Service};

use super::leader::LeaseGuard;
use super::write_slots::WriteSlotsLayer;
use crate::lifecycle::hands::observer_may_write;

/// The request was not sent: this replica cannot show it leads.
#[derive(Debug, thiserror::Error)]
#[error("not sent, not the leader: {0}")]
pub struct NotLeader(pub String);

/// The request was not sent: this install observes only, and it is not
/// one of our own resources.
#[derive(Debug, thiserror::Error)]
#[error("not sent, this install observes only (--mode observe): {0}")]
pub struct Withheld(pub String);

/// Wraps a client's service so that only the leader writes, and an
/// observing install only its own resources.
#[derive(Clone)]
pub struct LeaderOnlyLayer {
    guard: Arc<LeaseGuard>,
    observing: bool,
}

impl LeaderOnlyLayer {
    pub fn new(guard: Arc<LeaseGuard>, observing: bool) -> LeaderOnlyLayer {
        LeaderOnlyLayer { guard, observing }
    }
}

impl<S> Layer<S> for LeaderOnlyLayer {
    type Service = LeaderOnly<S>;

    fn layer(&self, inner: S) -> LeaderOnly<S> {
        LeaderOnly { inner, guard: self.guard.clone(), observing: self.observing }
    }
}

#[derive(Clone)]
pub struct LeaderOnly<S> {
    inner: S,
    guard: Arc<LeaseGuard>,
    observing: bool,
}

type Answer<R> = Pin<Box<dyn Future<Output = Result<R, BoxError>> + Send>>;

/// Anything but GET, HEAD and OPTIONS.
pub(super) fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

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
        if self.observing && changes_state(req.method()) && !observer_may_write(req.uri().path()) {
            let withheld = Withheld(format!("{} {}", req.method(), req.uri().path()));
            return Box::pin(std::future::ready(Err(withheld.into())));
        }
        if changes_state(req.method())
            && let Err(why) = self.guard.ensure()
        {
            let refused = NotLeader(format!("{} {}: {why}", req.method(), req.uri().path()));
            return Box::pin(std::future::ready(Err(refused.into())));
        }
        let sent = self.inner.call(req);
        Box::pin(async move { sent.await.map_err(Into::into) })
    }
}

/// The client the controllers write with: only the leader's writes leave,
/// and nothing is sent again by the client itself. kube's default retry of
/// a 429, 503 or 504 (up to 15 times, with pauses growing to minutes) sits
/// below this layer: a write checked against the lease once would be sent
/// again later, perhaps by a replica that no longer leads, and a POST
/// answered 504 may have been done. A reconcile that fails is looked at
/// again by its controller, which reads first.
///
/// Writes take their turn in `slots` ([`WriteSlotsLayer`]) before the
/// lease check, so one that waited meets the check when it leaves.
pub fn client(
    mut config: kube::Config,
    guard: LeaderOnlyLayer,
    slots: WriteSlotsLayer,
) -> Result<kube::Client, kube::Error> {
    config.default_retry = false;
    Ok(kube::client::ClientBuilder::try_from(config)?.with_layer(&layers(guard, slots)).build())
}

/// The lease check, inside the writes' turns.
fn layers(guard: LeaderOnlyLayer, slots: WriteSlotsLayer) -> Stack<LeaderOnlyLayer, WriteSlotsLayer> {
    Stack::new(guard, slots)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::Response;
    use tower::ServiceExt;

    use super::*;

    fn slots(max: usize) -> WriteSlotsLayer {
        WriteSlotsLayer::new(max, Duration::from_secs(30), crate::metrics::KubeWrites::default())
    }

    /// A write that waited for its turn while the lease lapsed is refused
    /// when its turn comes: the check is made as it leaves.
    #[tokio::test]
    async fn a_write_that_waited_meets_the_lease_check_when_it_leaves() {
        use kube::client::Body;
        let guard = Arc::new(LeaseGuard::new(Duration::from_secs(1)));
        guard.renewed(tokio::time::Instant::now(), Duration::from_secs(60));
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<()>>();
        let mut svc = layers(LeaderOnlyLayer::new(guard.clone(), false), slots(1)).layer(mock);
        let req =
            |m: Method| Request::builder().method(m).uri("/api/v1/nodes/a").body(Body::empty()).unwrap();
        let first = tokio::spawn(svc.call(req(Method::PATCH)));
        let second = tokio::spawn(svc.call(req(Method::PATCH)));
        let next = tokio::time::timeout(Duration::from_secs(5), handle.next_request()).await;
        let (_, answer) = next.expect("the first write leaves").expect("a request");
        let early = tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await;
        assert!(early.is_err(), "the second write left without a turn");

        guard.revoke();
        answer.send_response(Response::new(()));
        assert!(first.await.expect("joined").is_ok());
        let second =
            tokio::time::timeout(Duration::from_secs(5), second).await.expect("the second write ended");
        let refused = second.expect("joined").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("not the leader"), "{refused}");
        let late = tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await;
        assert!(late.is_err(), "a write left after the lease lapsed");
    }

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
        let mut svc = LeaderOnlyLayer::new(guard.clone(), false).layer(mock);
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

    /// An observing install writes its own resources and Events, and
    /// nothing else: a Node's or a pod's patch is refused before it leaves.
    #[tokio::test]
    async fn an_observer_writes_only_its_own_resources() {
        let guard = Arc::new(LeaseGuard::new(Duration::from_secs(1)));
        guard.renewed(tokio::time::Instant::now(), Duration::from_secs(60));
        let (mock, mut handle) = tower_test::mock::pair::<Request<()>, Response<()>>();
        let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = sent.clone();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                seen.lock().unwrap().push(format!("{} {}", req.method(), req.uri().path()));
                send.send_response(Response::new(()));
            }
        });
        let mut svc = LeaderOnlyLayer::new(guard, true).layer(mock);
        let req = |m: Method, path: &str| Request::builder().method(m).uri(path).body(()).unwrap_or_default();
        let mut call = async |m: Method, path: &str| {
            svc.ready()
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .call(req(m, path))
                .await
                .map_err(|e| e.to_string())
        };
        let node = call(Method::PATCH, "/api/v1/nodes/a").await.unwrap_err();
        assert!(node.contains("observes only") && node.contains("PATCH /api/v1/nodes/a"), "{node}");
        assert!(call(Method::PATCH, "/api/v1/namespaces/o/pods/p").await.is_err());
        assert!(call(Method::GET, "/api/v1/nodes/a").await.is_ok(), "reads pass");
        assert!(call(Method::PATCH, "/apis/hypervisor.cloud.sap/v1/hypervisors/a/status").await.is_ok());
        assert!(call(Method::POST, "/apis/events.k8s.io/v1/namespaces/d/events").await.is_ok());
        let sent = sent.lock().unwrap().clone();
        assert_eq!(
            sent,
            [
                "GET /api/v1/nodes/a",
                "PATCH /apis/hypervisor.cloud.sap/v1/hypervisors/a/status",
                "POST /apis/events.k8s.io/v1/namespaces/d/events"
            ]
        );
    }

    /// A write the API server answers 429 (its priority and fairness) is
    /// sent once: the controller decides again, the client does not send it
    /// again on its own.
    #[tokio::test]
    async fn a_refused_write_is_sent_once() {
        use std::sync::atomic::{AtomicU32, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(AtomicU32::new(0));
        let counted = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let counted = counted.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 65536];
                    while let Ok(n) = conn.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        counted.fetch_add(1, Ordering::SeqCst);
                        let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"TooManyRequests","code":429,"message":"slow down"}"#;
                        let answer = format!(
                            "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if conn.write_all(answer.as_bytes()).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        let guard = Arc::new(LeaseGuard::new(Duration::from_secs(1)));
        guard.renewed(tokio::time::Instant::now(), Duration::from_secs(60));
        let config = kube::Config::new(url.parse().unwrap());
        let api: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(client(config, LeaderOnlyLayer::new(guard, false), slots(4)).unwrap());
        let patch = serde_json::json!({"metadata": {"labels": {"a": "b"}}});
        let (params, merge) = (kube::api::PatchParams::default(), kube::api::Patch::Merge(&patch));
        let sent = api.patch("n", &params, &merge);
        let answer = tokio::time::timeout(Duration::from_secs(5), sent).await.expect("answered, not retried");
        assert!(matches!(answer, Err(kube::Error::Api(ref e)) if e.code == 429), "{answer:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(seen.load(Ordering::SeqCst), 1, "sent once");
    }
}
