//! One HTTP/1 accept loop for the project's small HTTP endpoints (the
//! agent's `/healthz` and `/metrics`, the coordinator's, the eviction
//! webhook), so each of them gets the same care:
//!
//! - an accept error (out of file descriptors, say) is logged and followed
//!   by a pause that doubles up to a second, instead of a loop that spins a
//!   core at 100 %;
//! - at most `max_connections` connections are served at once; further
//!   ones wait in the kernel's backlog;
//! - a client gets `header_timeout` to send its request head, so a slow or
//!   silent client cannot hold a connection slot for ever.

#![forbid(unsafe_code)]

pub mod metrics;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub use bytes::Bytes;
pub use http_body_util::Full;

/// Limits of one listener.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_connections: 256, header_timeout: Duration::from_secs(10) }
    }
}

/// The pause after the `n`th accept error in a row: 10 ms doubling to 1 s.
pub fn accept_backoff(n: u32) -> Duration {
    Duration::from_millis(10u64.saturating_mul(1u64 << n.min(7))).min(Duration::from_secs(1))
}

/// Binds `addr` and serves `handler` on it in a task of its own until the
/// process ends; answers the bound address (a bind error at once).
pub async fn serve<H, F, B>(addr: SocketAddr, limits: Limits, handler: H) -> std::io::Result<SocketAddr>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(accept_loop(listener, limits, handler));
    Ok(bound)
}

/// Where connections come from: a bound [`TcpListener`] (tests put a
/// listener that fails here, to see what the loop does with errors), or
/// one that wraps each connection (a TLS handshake) in [`Accept::ready`],
/// which runs in the connection's own task so a slow client holds up no
/// other.
pub trait Accept: Send + Sync + 'static {
    type Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;
    fn next(&self) -> impl Future<Output = std::io::Result<tokio::net::TcpStream>> + Send;
    fn ready(
        &self,
        tcp: tokio::net::TcpStream,
    ) -> impl Future<Output = std::io::Result<Self::Io>> + Send + 'static;
}

impl Accept for TcpListener {
    type Io = tokio::net::TcpStream;

    async fn next(&self) -> std::io::Result<tokio::net::TcpStream> {
        self.accept().await.map(|(stream, _)| stream)
    }

    fn ready(
        &self,
        tcp: tokio::net::TcpStream,
    ) -> impl Future<Output = std::io::Result<Self::Io>> + Send + 'static {
        std::future::ready(Ok(tcp))
    }
}

/// The accept loop over an already bound listener.
pub async fn accept_loop<L, H, F, B>(listener: L, limits: Limits, handler: H)
where
    L: Accept,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut errors = 0u32;
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let stream = match listener.next().await {
            Ok(stream) => {
                errors = 0;
                stream
            }
            Err(e) => {
                let pause = accept_backoff(errors);
                errors = errors.saturating_add(1);
                tracing::warn!(error = %e, pause_ms = pause.as_millis() as u64, "accept failed");
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        let handler = handler.clone();
        let ready = listener.ready(stream);
        tokio::spawn(async move {
            let Ok(stream) = tokio::time::timeout(limits.header_timeout, ready).await.unwrap_or_else(|_| {
                Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "connection not ready in time"))
            }) else {
                return;
            };
            let svc = service_fn(move |req| {
                let h = handler.clone();
                async move { Ok::<_, Infallible>(h(req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(stream), svc)
                .await;
            drop(permit);
        });
    }
}

/// A plain-text answer.
pub fn text(status: hyper::StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.into())));
    *r.status_mut() = status;
    r
}

/// The content type of an OpenMetrics text exposition: what tells
/// Prometheus to read `# EOF` and a counter's `_total` samples as such.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A `/metrics` answer in the OpenMetrics text format.
pub fn openmetrics(body: String) -> Response<Full<Bytes>> {
    let mut r = text(hyper::StatusCode::OK, body);
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(OPENMETRICS));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_back_off_to_a_second() {
        assert_eq!(accept_backoff(0), Duration::from_millis(10));
        assert_eq!(accept_backoff(1), Duration::from_millis(20));
        assert_eq!(accept_backoff(6), Duration::from_millis(640));
        assert_eq!(accept_backoff(7), Duration::from_secs(1));
        assert_eq!(accept_backoff(u32::MAX), Duration::from_secs(1));
    }

    /// A listener out of file descriptors: every accept fails.
    struct OutOfDescriptors(Arc<std::sync::atomic::AtomicUsize>);

    impl Accept for OutOfDescriptors {
        type Io = tokio::net::TcpStream;

        fn ready(
            &self,
            tcp: tokio::net::TcpStream,
        ) -> impl Future<Output = std::io::Result<Self::Io>> + Send + 'static {
            std::future::ready(Ok(tcp))
        }

        fn next(&self) -> impl Future<Output = std::io::Result<tokio::net::TcpStream>> + Send {
            let calls = self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move {
                if calls >= 1_000 {
                    // A loop that spins has shown it; stop it from hanging the test.
                    std::future::pending::<()>().await;
                }
                tokio::task::yield_now().await;
                Err(std::io::Error::from_raw_os_error(24)) // EMFILE
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_loop_pauses_between_accept_errors_instead_of_spinning() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let listener = OutOfDescriptors(calls.clone());
        tokio::spawn(accept_loop(listener, Limits::default(), |_req| async {
            text(hyper::StatusCode::OK, "")
        }));
        tokio::time::sleep(Duration::from_secs(5)).await;
        let n = calls.load(std::sync::atomic::Ordering::Relaxed);
        // 10 ms doubling to 1 s: 8 pauses make 2.55 s, then one a second.
        assert!((9..=12).contains(&n), "{n} accepts in 5 s");
    }

    #[tokio::test]
    async fn it_serves_and_bounds_connections() -> Result<(), Box<dyn std::error::Error>> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let limits = Limits { max_connections: 1, header_timeout: Duration::from_millis(300) };
        let addr =
            serve("127.0.0.1:0".parse()?, limits, |_req| async { text(hyper::StatusCode::OK, "ok\n") })
                .await?;
        // A silent client holds the only slot until its header timeout.
        let mut silent = tokio::net::TcpStream::connect(addr).await?;
        let mut c = tokio::net::TcpStream::connect(addr).await?;
        c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await?;
        let mut out = String::new();
        let read = tokio::time::timeout(Duration::from_secs(5), c.read_to_string(&mut out)).await;
        assert!(read.is_ok(), "served once the silent client timed out");
        assert!(out.starts_with("HTTP/1.1 200") && out.ends_with("ok\n"), "{out}");
        let mut rest = Vec::new();
        let _ = silent.read_to_end(&mut rest).await;
        Ok(())
    }
}
