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
//!
//! `/metrics` shows the session, the watchers and the outbox, the build and
//! the process (`hv_listen::metrics`), and when the client certificate ends.

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
    /// Where the session's client certificate comes from (None: plain text).
    pub certificate: Option<crate::session::SessionTls>,
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
        hv_listen::metrics::build_info(&mut r, "hv-agent", env!("CARGO_PKG_VERSION"));
        if let Some(end) = self.certificate_end() {
            r.register(
                "hv_agent_certificate_expiry_seconds",
                "When the client certificate the next connection presents ends (its notAfter, seconds since the \
                 Unix epoch).",
                ConstGauge::new(end),
            );
        }
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode_registry(&mut s, &r);
        let _ = prometheus_client::encoding::text::encode_registry(&mut s, &hv_listen::metrics::process());
        let _ = prometheus_client::encoding::text::encode_eof(&mut s);
        s
    }

    /// The end of the certificate in its file now, in seconds since the Unix
    /// epoch: the one the session's next connection reads (a session open
    /// since before a rotation keeps the earlier one until it ends). None
    /// without TLS, or when the file does not read.
    fn certificate_end(&self) -> Option<i64> {
        let end = self.certificate.as_ref()?.certificate_end()?;
        let secs = end.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Some(i64::try_from(secs).unwrap_or(i64::MAX))
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::backoff::Backoff;
    use crate::session::{Session, SessionConfig};

    fn health(certificate: Option<crate::session::SessionTls>) -> Health {
        let session = Session::new(SessionConfig {
            coordinator: "http://127.0.0.1:1".into(),
            node: "n1".into(),
            agent_version: "test".into(),
            boot_id: "b".into(),
            heartbeat: Duration::from_secs(3600),
            buffer: 10,
            backoff: Backoff::default(),
            tls: None,
        });
        Health {
            watchers: vec![Watcher { name: "libvirt", live: Arc::new(AtomicBool::new(true)) }],
            session: session.stats.clone(),
            handle: session.handle(),
            certificate,
        }
    }

    fn has(text: &str, line: &str) {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }

    /// The build, the process under Prometheus' standard names, and the
    /// end of the certificate in its file, read at each scrape: a rotated
    /// file shows at the next.
    #[tokio::test]
    async fn the_build_the_process_and_the_certificates_end_are_shown() {
        let s = health(None).metrics().await;
        has(
            &s,
            &format!(
                "hv_build_info{{binary=\"hv-agent\",version=\"{}\",arch=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION"),
                std::env::consts::ARCH
            ),
        );
        for family in ["process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"] {
            assert!(s.lines().any(|l| l.starts_with(&format!("{family} "))), "missing {family} in\n{s}");
        }
        assert!(!s.contains("hv_agent_certificate_expiry_seconds"), "no certificate without TLS: {s}");
        assert_eq!(s.lines().last(), Some("# EOF"));

        let dir = std::env::temp_dir().join(format!("hv-agent-health-{}", std::process::id()));
        let pki = hv_tests::pki::Pki::new(&dir, "ca");
        let files = pki.node_until("n1", UNIX_EPOCH + Duration::from_secs(2_208_988_800));
        let h = health(Some(crate::session::SessionTls::Files(files.clone())));
        has(&h.metrics().await, "hv_agent_certificate_expiry_seconds 2208988800");
        pki.node_until("n1", UNIX_EPOCH + Duration::from_secs(2_253_657_600));
        has(&h.metrics().await, "hv_agent_certificate_expiry_seconds 2253657600");
        std::fs::write(&files.cert, "not a certificate").unwrap_or_default();
        assert!(!h.metrics().await.contains("hv_agent_certificate_expiry_seconds"), "a broken file: none");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Every `hv_agent_` name the chart's alerts and dashboard query is one
    /// the agent exposes (the coordinator's test checks the others).
    #[tokio::test]
    async fn every_agent_metric_the_chart_queries_is_exposed() {
        let dir = std::env::temp_dir().join(format!("hv-agent-queried-{}", std::process::id()));
        let files = hv_tests::pki::Pki::new(&dir, "ca").node("n1");
        let text = health(Some(crate::session::SessionTls::Files(files))).metrics().await;
        let _ = std::fs::remove_dir_all(&dir);
        let exposed: std::collections::BTreeSet<&str> =
            text.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split(['{', ' ']).next()).collect();
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/hv");
        let mut queried = std::collections::BTreeSet::new();
        for file in ["templates/monitoring.yaml", "dashboards/hv-fleet.json"] {
            let body = std::fs::read_to_string(root.join(file)).unwrap_or_default();
            assert!(!body.is_empty(), "{file} read");
            for (at, _) in body.match_indices("hv_agent_") {
                let name: String =
                    body[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                queried.insert(name);
            }
        }
        assert!(queried.len() >= 4, "the dashboard queries the agents: {queried:?}");
        let missing: Vec<_> = queried.iter().filter(|q| !exposed.contains(q.as_str())).collect();
        assert!(missing.is_empty(), "queried but not exposed: {missing:?}\nexposed: {exposed:?}");
    }
}
