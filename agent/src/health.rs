//! `/livez`, `/healthz` and `/metrics` (OpenMetrics, by `prometheus-client`)
//! on a small HTTP listener.
//!
//! `/livez` is the liveness probe's: it answers while the agent's runtime
//! does, whatever its peers do. Restarting the agent because libvirtd, OVSDB
//! or Ceph is down would not bring them back, and would drop the session
//! that reports them down.
//!
//! `/healthz` says whether every watcher (libvirt, OVSDB, Ceph) is live right
//! now: for a readiness probe, dashboards and people, never for liveness.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hv_listen::{Bytes, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

use crate::session::{SessionHandle, SessionStats};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatcherLabel {
    watcher: &'static str,
}

/// Liveness of one watcher.
#[derive(Clone)]
pub struct Watcher {
    pub name: &'static str,
    pub live: Arc<AtomicBool>,
}

#[derive(Clone)]
pub struct Health {
    pub watchers: Vec<Watcher>,
    pub session: Arc<SessionStats>,
    pub handle: SessionHandle,
}

impl Health {
    fn healthz(&self) -> (StatusCode, String) {
        let down: Vec<&str> =
            self.watchers.iter().filter(|w| !w.live.load(Ordering::Relaxed)).map(|w| w.name).collect();
        if down.is_empty() {
            (StatusCode::OK, "ok\n".into())
        } else {
            (StatusCode::SERVICE_UNAVAILABLE, format!("not live: {}\n", down.join(", ")))
        }
    }

    /// The exposition, read at scrape time into a registry of constant
    /// samples (every figure already lives in the session and watchers).
    async fn metrics(&self) -> String {
        let mut r = Registry::default();
        let watchers = Family::<WatcherLabel, Gauge>::default();
        for w in &self.watchers {
            watchers
                .get_or_create(&WatcherLabel { watcher: w.name })
                .set(i64::from(w.live.load(Ordering::Relaxed)));
        }
        r.register("hv_agent_watcher_live", "Whether a watcher's peer connection is up.", watchers);
        let st = &self.session;
        let count = |a: &AtomicU64| ConstCounter::new(a.load(Ordering::Relaxed));
        r.register(
            "hv_agent_session_connected",
            "Whether the session to the coordinator is up.",
            ConstGauge::new(i64::from(st.connected.load(Ordering::Relaxed))),
        );
        r.register("hv_agent_session_connects", "Sessions opened to the coordinator.", count(&st.connects));
        r.register("hv_agent_session_stream_errors", "Sessions that ended broken.", count(&st.stream_errors));
        r.register(
            "hv_agent_unexpected_messages",
            "Messages from the coordinator this agent did not expect.",
            count(&st.unexpected_messages),
        );
        let (dropped, acked, held) = self.handle.outbox_figures().await;
        r.register(
            "hv_agent_dropped_messages",
            "Messages the outbox dropped because it was full.",
            ConstCounter::new(dropped),
        );
        r.register(
            "hv_agent_acked_seq",
            "The last sequence the coordinator acknowledged.",
            ConstGauge::new(i64::try_from(acked).unwrap_or(i64::MAX)),
        );
        r.register(
            "hv_agent_outbox_messages",
            "Messages held in the outbox until the coordinator acknowledges them.",
            ConstGauge::new(i64::try_from(held).unwrap_or(i64::MAX)),
        );
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut s, &r);
        s
    }

    async fn route(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let (code, body) = match req.uri().path() {
            "/livez" => (StatusCode::OK, "alive\n".into()),
            "/healthz" => self.healthz(),
            "/metrics" => return hv_listen::openmetrics(self.metrics().await),
            _ => (StatusCode::NOT_FOUND, "not found\n".into()),
        };
        hv_listen::text(code, body)
    }
}

/// Serve until the process ends. Returns the bound address.
pub async fn serve(addr: SocketAddr, health: Health) -> std::io::Result<SocketAddr> {
    let health = Arc::new(health);
    hv_listen::serve(addr, hv_listen::Limits::default(), move |req| {
        let h = health.clone();
        async move { h.route(req).await }
    })
    .await
}
