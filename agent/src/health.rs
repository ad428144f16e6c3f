//! `/livez`, `/healthz` and `/metrics` on a small HTTP listener.
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
use std::sync::atomic::{AtomicBool, Ordering};

use hv_listen::{Bytes, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use crate::session::{SessionHandle, SessionStats};

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

    async fn metrics(&self) -> String {
        let b = |v: bool| u8::from(v);
        let mut s = String::new();
        s.push_str("# HELP hv_agent_watcher_live Whether a watcher's peer connection is up.\n# TYPE hv_agent_watcher_live gauge\n");
        for w in &self.watchers {
            s.push_str(&format!(
                "hv_agent_watcher_live{{watcher=\"{}\"}} {}\n",
                w.name,
                b(w.live.load(Ordering::Relaxed))
            ));
        }
        let st = &self.session;
        s.push_str("# TYPE hv_agent_session_connected gauge\n");
        s.push_str(&format!("hv_agent_session_connected {}\n", b(st.connected.load(Ordering::Relaxed))));
        s.push_str("# TYPE hv_agent_session_connects_total counter\n");
        s.push_str(&format!("hv_agent_session_connects_total {}\n", st.connects.load(Ordering::Relaxed)));
        s.push_str("# TYPE hv_agent_session_stream_errors_total counter\n");
        s.push_str(&format!(
            "hv_agent_session_stream_errors_total {}\n",
            st.stream_errors.load(Ordering::Relaxed)
        ));
        s.push_str("# TYPE hv_agent_unexpected_messages_total counter\n");
        s.push_str(&format!(
            "hv_agent_unexpected_messages_total {}\n",
            st.unexpected_messages.load(Ordering::Relaxed)
        ));
        s.push_str("# TYPE hv_agent_dropped_messages_total counter\n");
        s.push_str(&format!("hv_agent_dropped_messages_total {}\n", self.handle.dropped().await));
        s.push_str("# TYPE hv_agent_acked_seq gauge\n");
        s.push_str(&format!("hv_agent_acked_seq {}\n", self.handle.acked().await));
        s
    }

    async fn route(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let (code, body) = match req.uri().path() {
            "/livez" => (StatusCode::OK, "alive\n".into()),
            "/healthz" => self.healthz(),
            "/metrics" => (StatusCode::OK, self.metrics().await),
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
